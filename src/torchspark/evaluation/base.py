"""The contract every torchspark evaluation follows (DL4J's ``IEvaluation``).

An evaluation is a small accumulator of counts or sufficient statistics:

1. ``eval(labels, predictions, mask=None)`` adds one minibatch (call it once per batch);
2. ``merge(other)`` adds another evaluation of the same type, so per-partition evaluations computed on Spark
   executors combine on the driver into exactly what one pass over all the data gives;
3. ``to_json()`` / ``from_json()`` ship it between processes without pickle;
4. the metric methods and ``stats()`` read the result; ``reset()`` starts again.

State lives in float64/int64 numpy arrays and ints, so merging counts is exact and merging float sums differs from
a single pass only by rounding.
"""

from __future__ import annotations

import abc
import json
from typing import Any, ClassVar, TypeVar

from torchspark._bounded import load_json
from torchspark.errors import ConfigError, DataError, SerializationError

__all__ = ["BaseEvaluation", "parse_evaluation_json"]

FORMAT_VERSION = 1

_E = TypeVar("_E", bound="BaseEvaluation")


class BaseEvaluation(abc.ABC):
    """Base class of all evaluations: ``eval``, ``merge``, ``reset``, ``stats``, ``to_json``, ``from_json``.

    Subclasses set ``type_name`` (the ``"type"`` field of their JSON) and implement the ``_``-prefixed hooks.
    """

    type_name: ClassVar[str] = "BaseEvaluation"

    @abc.abstractmethod
    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one minibatch.

        Args:
            labels: torch tensor or numpy array; shape depends on the class (class indices (N,) or one-hot /
                dense (N, C) for multi-class evaluations, 0/1 (N, C) for per-output ones, targets for regression).
            predictions: probabilities or logits, (N, C) or (N,) for a single column; see
                [`torchspark.evaluation`][torchspark.evaluation] for how logits are told from probabilities.
            mask: optional (N,) or (N, C) array; 0 excludes the example (or the single output).

        Raises:
            DataError: wrong shapes, NaN/Inf, labels out of range or not 0/1.
        """

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every example seen, keeping the constructor settings."""

    @abc.abstractmethod
    def stats(self) -> str:
        """A human-readable multi-line report of the metrics."""

    @abc.abstractmethod
    def _merge(self, other: Any) -> None:
        """Add ``other``'s state (same type guaranteed) into ``self``."""

    @abc.abstractmethod
    def _config(self) -> dict[str, Any]:
        """Constructor keyword arguments (JSON-compatible) that rebuild an empty evaluation like this one."""

    @abc.abstractmethod
    def _state(self) -> dict[str, Any]:
        """The accumulated state as JSON-compatible values."""

    @abc.abstractmethod
    def _load_state(self, state: dict[str, Any]) -> None:
        """Restore what `_state` produced."""

    def merge(self: _E, other: _E) -> _E:
        """Add another evaluation's examples into this one (in place) and return ``self``.

        Raises:
            DataError: ``other`` is of a different type (the message names both).
            ConfigError: settings that change the meaning of the counts differ (e.g. ``top_n``, ``num_bins``).
        """
        if type(other) is not type(self):
            raise DataError(
                f"cannot merge a {type(other).__name__} into a {type(self).__name__}; merge evaluations of the "
                f"same type only"
            )
        self._merge(other)
        return self

    def to_json(self) -> str:
        """Serialise settings and accumulated state to a JSON string (``{"type", "format_version", ...}``)."""
        payload = {
            "type": self.type_name,
            "format_version": FORMAT_VERSION,
            "config": self._config(),
            "state": self._state(),
        }
        return json.dumps(payload)

    @classmethod
    def from_json(cls: type[_E], text: str) -> _E:
        """Rebuild an evaluation written by [`to_json`][torchspark.evaluation.BaseEvaluation.to_json].

        Raises:
            SerializationError: not valid JSON, or written by a different evaluation type.
        """
        payload = parse_evaluation_json(text)
        if payload["type"] != cls.type_name:
            raise SerializationError(
                f"JSON holds a {payload['type']} but {cls.__name__}.from_json was called; use "
                f"{payload['type']}.from_json or evaluation_from_json"
            )
        try:
            evaluation = cls(**payload["config"])
            evaluation._load_state(payload["state"])
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise SerializationError(f"malformed {cls.__name__} JSON: {exc}") from exc
        return evaluation

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in self._config().items())
        return f"{type(self).__name__}({settings})"


def parse_evaluation_json(text: str) -> dict[str, Any]:
    """Decode and sanity-check the envelope written by [`BaseEvaluation.to_json`][torchspark.evaluation.BaseEvaluation.to_json]."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise SerializationError(
            f"evaluation JSON must be a string, got {type(text).__name__}; pass the string to_json() wrote"
        )
    try:
        payload = load_json(text, "the text", SerializationError)
    except SerializationError as exc:
        raise SerializationError(
            f"evaluation JSON could not be decoded: {exc}; pass the string to_json() wrote"
        ) from exc.__cause__
    if not isinstance(payload, dict) or not {"type", "config", "state"} <= payload.keys():
        raise SerializationError("evaluation JSON must be an object with 'type', 'config' and 'state' fields")
    version = payload.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"evaluation JSON format_version {version} is not supported (expected {FORMAT_VERSION}); "
            f"read it with the torchspark version that wrote it"
        )
    return payload
