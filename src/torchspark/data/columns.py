"""Which columns of a table feed a network: [`Columns`][torchspark.data.Columns], one value instead of the
``features_col, label_col, feature_shape`` keywords passed along every call.

Example::

    Columns()                                              # "features" -> the input, "label" -> the target
    Columns(features="img", label="digit", feature_shape=(1, 28, 28))
    Columns(features=["img", "meta"], label=["cls", "reg"], feature_shape=[(1, 28, 28), None])

The readers (`feature_names`, `label_names`, `shapes`, `several`) are what the library reads, never the fields
themselves, so a later kind of ``features`` (a mapping of keyword inputs to columns, each with its own shape and
dtype) changes this module only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError

__all__ = ["Columns", "DEFAULT_COLUMNS", "FEATURES", "LABEL"]

#: the default features and label column names
FEATURES = "features"
LABEL = "label"

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Columns:
    """The columns of a DataFrame that feed a network, checked when made.

    Attributes:
        features: the features column, or a list of them for a network with several inputs (one input each, in
            order). Array, ML ``Vector`` or numeric columns.
        label: the label column, a list of them for a network with several outputs (one output each), or None
            for inference without labels.
        feature_shape: reshapes each row's features, e.g. ``(1, 28, 28)`` for a CNN; with several features
            columns, a list with one shape (or None) per column. None (or ``()``) keeps each row flat.

    Lists are stored as tuples (the value is hashable and compares by content).

    Raises:
        ConfigError: an empty or non-string column name, an empty list of columns, a shape with a dimension that
            is not an integer >= 1, or a ``feature_shape`` whose entries do not match the features columns.
    """

    features: str | tuple[str, ...] = FEATURES
    label: str | tuple[str, ...] | None = LABEL
    feature_shape: Shape | tuple[Shape | None, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _names("features", self.features))
        if self.label is not None:
            object.__setattr__(self, "label", _names("label", self.label))
        object.__setattr__(self, "feature_shape", _shape(self.feature_shape, len(self.feature_names)))

    @property
    def feature_names(self) -> list[str]:
        """The features columns, one per network input, in order."""
        return [self.features] if isinstance(self.features, str) else list(self.features)

    @property
    def label_names(self) -> list[str]:
        """The label columns, one per network output (empty without labels)."""
        if self.label is None:
            return []
        return [self.label] if isinstance(self.label, str) else list(self.label)

    @property
    def names(self) -> list[str]:
        """Every column read, features first, each once."""
        return list(dict.fromkeys(self.feature_names + self.label_names))

    @property
    def shapes(self) -> list[Shape | None]:
        """One shape (or None: flat) per features column."""
        shape = self.feature_shape
        if shape is None:
            return [None] * len(self.feature_names)
        if all(isinstance(d, int) for d in shape):
            return [shape]  # type: ignore[list-item]  # one shape, one column (checked when made)
        return list(shape)  # type: ignore[arg-type]

    @property
    def several(self) -> bool:
        """Whether the rows make MultiDataSets (a list of features or of label columns), not DataSets."""
        return not isinstance(self.features, str) or isinstance(self.label, tuple)

    def without_label(self) -> Columns:
        """The same features, no label (what inference reads)."""
        return Columns(self.features, None, self.feature_shape)

    @classmethod
    def of(
        cls,
        columns: Columns | None = None,
        features_col: str | Sequence[str] = FEATURES,
        label_col: str | Sequence[str] | None = LABEL,
        feature_shape: Any = None,
        *,
        owner: str = "",
    ) -> Columns:
        """``columns``, or a `Columns` made of the flat keywords users write (``features_col=``, ``label_col=``,
        ``feature_shape=``).

        Raises:
            ConfigError: ``columns`` together with a flat keyword other than its default (say the columns once),
                or a ``columns`` that is not a `Columns`; the checks of `Columns` for the flat keywords.
        """
        if columns is None:
            return cls(features_col, label_col, feature_shape)  # type: ignore[arg-type]  # lists become tuples
        subject = f"{owner}: " if owner else ""
        if not isinstance(columns, Columns):
            raise ConfigError(
                f"{subject}columns must be a torchspark.data.Columns, got {type(columns).__name__}; e.g. "
                "columns=Columns(features='x', label='y')"
            )
        given = [
            f"{name}={value!r}"
            for name, value, default in (
                ("features_col", features_col, FEATURES),
                ("label_col", label_col, LABEL),
                ("feature_shape", feature_shape, None),
            )
            if value != default
        ]
        if given:
            raise ConfigError(
                f"{subject}columns={columns!r} and {', '.join(given)} both name the columns; pass one: "
                "either columns=Columns(...) or the features_col=/label_col=/feature_shape= keywords"
            )
        return columns


def _names(what: str, value: Any) -> str | tuple[str, ...]:
    if isinstance(value, str):
        if not value:
            raise ConfigError(f"Columns: {what} must be a column name, got an empty string")
        return value
    items = tuple(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(c, str) and c for c in items):
        raise ConfigError(f"Columns: {what} must be a column name or a non-empty list of column names, got {value!r}")
    return items


def _dims(value: Any) -> Shape | None:
    """A shape as a tuple of integers >= 1, or None when ``value`` is not one."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
        return None
    return tuple(value)


def _shape(value: Any, count: int) -> Shape | tuple[Shape | None, ...] | None:
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None  # () keeps the rows flat, as None does
    one = _dims(value)
    if one is not None:
        if count != 1:
            raise ConfigError(
                f"Columns: feature_shape={one} is one shape but there are {count} features columns; pass a list "
                "with one shape (or None) per column"
            )
        return one
    items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not items or any(isinstance(d, int) for d in items):
        raise ConfigError(
            f"Columns: feature_shape must be a shape of integers >= 1 such as (1, 28, 28), or a list with one "
            f"shape (or None) per features column, got {value!r}"
        )
    if len(items) != count:
        raise ConfigError(
            f"Columns: feature_shape has {len(items)} entries but there are {count} features columns; give one "
            "shape (or None) per column"
        )
    shapes = []
    for item in items:
        dims = None if item is None else _dims(item)
        if item is not None and dims is None:
            raise ConfigError(
                f"Columns: every entry of feature_shape must be a shape of integers >= 1 or None, got {item!r} "
                f"in {value!r}"
            )
        shapes.append(dims)
    return tuple(shapes)


#: ``Columns()``: "features" -> the input, "label" -> the target, rows kept flat
DEFAULT_COLUMNS = Columns()
