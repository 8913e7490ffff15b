"""Which columns of a table feed a network: [`Columns`][torchspark.data.Columns], one value instead of the
``features_col, label_col, feature_shape`` keywords passed along every call.

Example::

    Columns()                                              # "features" -> the input, "label" -> the target
    Columns(features="img", label="digit", feature_shape=(1, 28, 28))
    Columns(features=["img", "meta"], label=["cls", "reg"], feature_shape=[(1, 28, 28), None])
    Columns(features={"input_ids": "ids", "attention_mask": "mask"}, feature_shape={"input_ids": (32,)})

The readers (`feature_names`, `keywords`, `label_names`, `shapes`, `several`) are what the library reads, never the
fields themselves. A mapping of keyword inputs to columns (``{"input_ids": "ids", ...}``, a Hugging Face style model
called as ``module(input_ids=..., attention_mask=...)``) makes batches whose features carry those names, each column
with its own shape and its own dtype (integer columns stay int64 token ids).
"""

from __future__ import annotations

import keyword as _keyword
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError

__all__ = ["Columns", "DEFAULT_COLUMNS", "FEATURES", "LABEL", "FeaturesCol"]

#: the default features and label column names
FEATURES = "features"
LABEL = "label"

Shape = tuple[int, ...]

#: what ``features_col=`` takes: a column, a list of columns (positional inputs) or a mapping of keyword inputs to
#: columns
FeaturesCol = str | Sequence[str] | Mapping[str, str]


@dataclass(frozen=True)
class Columns:
    """The columns of a DataFrame that feed a network, checked when made.

    Attributes:
        features: the features column, or a list of them for a network with several inputs (one input each, in
            order), or a mapping of keyword inputs to columns (``{"input_ids": "ids", "attention_mask": "mask"}``:
            the module is called as ``module(input_ids=..., attention_mask=...)``). Array, ML ``Vector`` or numeric
            columns. Keyword features keep their column's dtype (an ``array<bigint>`` column gives int64 tensors,
            an ``array<float>`` one float32); positional ones are read as floats. A mapping is stored as a tuple
            of ``(keyword, column)`` pairs.
        label: the label column, a list of them for a network with several outputs (one output each), or None
            for inference without labels.
        feature_shape: reshapes each row's features, e.g. ``(1, 28, 28)`` for a CNN; with several features
            columns, a list with one shape (or None) per column; with keyword features, a mapping from keyword to
            shape (keywords left out stay flat) or a list in the mapping's order. None (or ``()``) keeps each row
            flat: its shape is the array's length.

    Lists are stored as tuples (the value is hashable and compares by content).

    Raises:
        ConfigError: an empty or non-string column name, an empty list of columns, a keyword that is not a Python
            identifier, a shape with a dimension that is not an integer >= 1, or a ``feature_shape`` whose entries
            do not match the features columns (or name a keyword the mapping does not have).
    """

    features: str | tuple[str, ...] | tuple[tuple[str, str], ...] = FEATURES
    label: str | tuple[str, ...] | None = LABEL
    feature_shape: Shape | tuple[Shape | None, ...] | None = None

    def __post_init__(self) -> None:
        pairs = _pairs(self.features)
        if pairs is not None:
            object.__setattr__(self, "features", pairs)
            shape: Any = self.feature_shape
            if isinstance(shape, Mapping):
                shape = _shape_map(shape, [k for k, _ in pairs])
        else:
            object.__setattr__(self, "features", _names("features", self.features))
            shape = self.feature_shape
            if isinstance(shape, Mapping):
                raise ConfigError(
                    f"Columns: feature_shape={dict(shape)!r} is a mapping but features={self.features!r} names no "
                    "keyword inputs; pass features as a mapping {keyword: column}, or feature_shape as a shape"
                )
        if self.label is not None:
            object.__setattr__(self, "label", _names("label", self.label))
        object.__setattr__(self, "feature_shape", _shape(shape, len(self.feature_names)))

    @property
    def feature_names(self) -> list[str]:
        """The features columns, one per network input, in order."""
        if isinstance(self.features, str):
            return [self.features]
        return [item[1] if isinstance(item, tuple) else item for item in self.features]

    @property
    def keywords(self) -> tuple[str, ...] | None:
        """The keyword input of each features column (``module(**dict(zip(keywords, tensors)))``), or None for
        positional inputs."""
        if isinstance(self.features, str) or not isinstance(self.features[0], tuple):
            return None
        return tuple(item[0] for item in self.features)  # pairs (checked when made)

    @property
    def label_names(self) -> list[str]:
        """The label columns, one per network output (empty without labels)."""
        if self.label is None:
            return []
        return [self.label] if isinstance(self.label, str) else list(self.label)

    @property
    def names(self) -> list[str]:
        """Every column read, features first, each once (a column feeding two keywords is read once)."""
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
        """Whether the rows make MultiDataSets (a list or mapping of features, or a list of label columns), not
        DataSets."""
        return not isinstance(self.features, str) or isinstance(self.label, tuple)

    def without_label(self) -> Columns:
        """The same features, no label (what inference reads)."""
        return Columns(self.features, None, self.feature_shape)

    @classmethod
    def of(
        cls,
        columns: Columns | None = None,
        features_col: FeaturesCol = FEATURES,
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


def _pairs(value: Any) -> tuple[tuple[str, str], ...] | None:
    """A mapping of keyword inputs to columns (or the pairs it is stored as) as ``(keyword, column)`` pairs; None
    for a column or a list of columns."""
    if isinstance(value, Mapping):
        items = list(value.items())
        if not items:
            raise ConfigError("Columns: features must map keyword inputs to columns, got an empty mapping")
    elif isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        items = list(value)
    else:
        return None
    for item in items:
        if len(item) != 2 or not all(isinstance(s, str) and s for s in item):
            raise ConfigError(
                f"Columns: features must map keyword names to column names (both non-empty strings), got {item!r} "
                f"in {value!r}"
            )
        if not item[0].isidentifier() or _keyword.iskeyword(item[0]):
            raise ConfigError(
                f"Columns: features keyword {item[0]!r} is not a Python identifier, so the module cannot take it as "
                "a keyword argument; use the name of the forward() parameter, e.g. 'input_ids'"
            )
    return tuple((k, c) for k, c in items)


def _shape_map(value: Mapping[Any, Any], keywords: list[str]) -> list[Any]:
    """A ``{keyword: shape}`` mapping as a list in the keywords' order (left-out keywords stay flat)."""
    unknown = [k for k in value if k not in keywords]
    if unknown:
        raise ConfigError(
            f"Columns: feature_shape names {unknown} but the features mapping has the keywords {keywords}; key "
            "feature_shape by those keywords"
        )
    return [value.get(k) for k in keywords]


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
