"""In-memory training data: [`DataSet`][torchspark.DataSet] (one input, one output) and [`MultiDataSet`][torchspark.MultiDataSet] (several of each).

Both hold torch tensors whose first dimension indexes examples, validated once at construction. They are
treated as immutable: every method returns a new object (often sharing memory with the old one through views),
so never modify their tensors in place.

Labels are either class indices (any integer dtype, stored as int64, shape ``(N,)`` or ``(N, T)`` for
per-timestep classes) or dense float targets shaped ``(N, k, ...)`` (one-hot, multi-label or regression).
Masks (``(N, T)`` usually) mark which timesteps of variable-length sequences are real.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from torchspark.errors import DataError

__all__ = ["DataSet", "MultiDataSet"]

_E = TypeVar("_E", bound="_Examples")


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    """Convert ``value`` (tensor, numpy array, nested list) to a tensor with at least one dimension."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind in ("U", "S", "O"):  # numpy strings or Python objects: torch's own message lists every dtype it knows
        raise DataError(
            f"{name} is a numpy array of dtype {value.dtype} ({'objects' if kind == 'O' else 'strings'}); "
            "convert it to numbers first (class names to indices: np.unique(values, "
            "return_inverse=True)[1]; numeric text: values.astype('float32'))"
        )
    try:
        tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataError(
            f"{name} must be a torch tensor or numpy array, got {type(value).__name__} ({exc}); "
            f"convert it with numpy.asarray first"
        ) from exc
    if tensor.dim() == 0:
        raise DataError(
            f"{name} is a scalar (0 dimensions); the first dimension must index examples, "
            f"e.g. reshape to (1, ...) or pass a batch"
        )
    return tensor


def _as_labels(value: Any, name: str) -> torch.Tensor:
    """Labels: integer class indices become int64; bool becomes float32; 1-D floats are refused."""
    tensor = _as_tensor(value, name)
    if tensor.dtype == torch.bool:
        return tensor.to(torch.float32)
    if not tensor.dtype.is_floating_point and not tensor.dtype.is_complex:
        return tensor.to(torch.int64)
    if tensor.dim() == 1:
        raise DataError(
            f"{name} is 1-D with float dtype {tensor.dtype} (shape {tuple(tensor.shape)}); pass class indices "
            f"as an integer array of shape (N,) for loss='cross_entropy' (labels.astype('int64')), or dense "
            f"targets shaped (N, k) for 'mse'/'bce_with_logits' (labels.reshape(-1, 1))"
        )
    return tensor


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when it owns exactly its bytes, else a compact copy.

    A view (a slice from ``split``, a row selection) pickles the whole storage it views: one 17 KB minibatch of a
    60000-example dataset would travel as the full dataset. Copying only what the view shows keeps shipping
    proportional to the examples shipped.
    """
    if tensor.layout != torch.strided:
        return tensor
    own = tensor.numel() * tensor.element_size()
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == own:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _rebuild(kind: str, named: dict[str, torch.Tensor]) -> DataSet | MultiDataSet:
    """Unpickle a DataSet/MultiDataSet (see ``_Examples.__reduce__``)."""
    cls = DataSet if kind == "DataSet" else MultiDataSet
    return cls._from_named(named)


def _describe(tensor: torch.Tensor | None) -> str:
    if tensor is None:
        return "None"
    return f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


class _Examples:
    """Behaviour shared by DataSet and MultiDataSet, written over a flat ``{name: tensor}`` view of the data.

    Subclasses provide ``_named()`` (canonical names, also used as keys in batch files) and ``_from_named()``.
    """

    __slots__ = ("_n",)

    def _named(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @classmethod
    def _from_named(cls: type[_E], named: Mapping[str, torch.Tensor]) -> _E:
        raise NotImplementedError

    def _check_lengths(self) -> None:
        named = self._named()
        first_name = next(iter(named))
        n = named[first_name].shape[0]
        for name, tensor in named.items():
            if tensor.shape[0] != n:
                raise DataError(
                    f"{name} has {tensor.shape[0]} examples but {first_name} has {n}; every array's first "
                    f"dimension must be the number of examples"
                )
        self._n = int(n)

    def _map(self: _E, fn: Callable[[torch.Tensor], torch.Tensor]) -> _E:
        return type(self)._from_named({name: fn(t) for name, t in self._named().items()})

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle only this object's own examples, never the larger storage a view shares (Spark's
        ``parallelize(data.split(64))`` ships each part at its own size)."""
        return _rebuild, (type(self).__name__, {name: _compact(t) for name, t in self._named().items()})

    def num_examples(self) -> int:
        """Number of examples (the shared first dimension)."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def slice(self: _E, start: int, stop: int) -> _E:
        """Examples ``start`` (inclusive) to ``stop`` (exclusive), as views of this data (no copy).

        Raises:
            DataError: unless ``0 <= start <= stop <= num_examples()``.
        """
        for arg_name, value in (("start", start), ("stop", stop)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise DataError(f"slice {arg_name} must be an int, got {value!r}")
        if not 0 <= start <= stop <= self._n:
            raise DataError(
                f"slice({start}, {stop}) is out of range for {self._n} examples; use 0 <= start <= stop <= {self._n}"
            )
        return self._map(lambda t: t[start:stop])

    def split(self: _E, batch_size: int) -> list[_E]:
        """Cut into consecutive minibatches of ``batch_size`` examples; the last one may be smaller.

        Args:
            batch_size: examples per minibatch (>= 1). Larger batches use the hardware better but give fewer
                updates per epoch; 32-128 is a sane start for the small networks torchspark targets.

        Returns:
            ``ceil(N / batch_size)`` views of this data (an empty list for empty data).

        Raises:
            DataError: ``batch_size`` is not a positive int.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise DataError(f"batch_size must be an int >= 1, got {batch_size!r}")
        return [self.slice(i, min(i + batch_size, self._n)) for i in range(0, self._n, batch_size)]

    def shuffle(self: _E, seed: int) -> _E:
        """A copy with examples in a random order that depends only on ``seed`` (same seed, same order)."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise DataError(f"shuffle seed must be an int, got {seed!r}")
        generator = torch.Generator().manual_seed(seed)
        perm = torch.randperm(self._n, generator=generator)
        return self._map(lambda t: t.index_select(0, perm.to(t.device)))

    def to(self: _E, device: torch.device | str) -> _E:
        """The same data with every tensor moved to ``device`` (e.g. ``"cuda:0"``)."""
        return self._map(lambda t: t.to(device))

    def pin_memory(self: _E) -> _E:
        """A copy with every tensor in pinned (page-locked) host memory, so that ``.to("cuda", non_blocking=True)``
        copies asynchronously (as ``DataLoader(pin_memory=True)``). Needs CUDA; the workers call it on their
        loading thread when they train on a GPU (the masters' ``pin_memory`` option)."""
        return self._map(lambda t: t.pin_memory())

    def check_finite(self, name: str = "data") -> None:
        """Raise if any floating-point tensor holds NaN or Inf.

        Args:
            name: what to call this data in the message, e.g. ``"training data"`` or a batch file path.

        Raises:
            DataError: naming the tensor, the first bad example index and how many examples are bad.
        """
        for tensor_name, tensor in self._named().items():
            if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex) or tensor.numel() == 0:
                continue
            bad_rows = ~torch.isfinite(tensor).reshape(tensor.shape[0], -1).all(dim=1)  # (N,)
            if bool(bad_rows.any()):
                bad = torch.nonzero(bad_rows).flatten()
                first = int(bad[0])
                kind = "NaN" if bool(torch.isnan(tensor[first]).any()) else "Inf"
                raise DataError(
                    f"{name}: {tensor_name} contains {kind} at example {first} (first bad example; "
                    f"{bad.numel()} of {self._n} examples have NaN/Inf); drop or repair those examples"
                )

    @classmethod
    def merge(cls: type[_E], items: Sequence[_E]) -> _E:
        """Concatenate several DataSets (or MultiDataSets) along the example dimension, in order.

        Raises:
            DataError: the list is empty, an item is of another type, has different labels/masks present,
                or a tensor's trailing shape or dtype differs from item 0's; the message names the index.
        """
        items = list(items)
        if not items:
            raise DataError(f"{cls.__name__}.merge needs at least one item, got an empty list")
        for i, item in enumerate(items):
            if not isinstance(item, cls):
                raise DataError(f"{cls.__name__}.merge: item {i} is a {type(item).__name__}, expected {cls.__name__}")
        if len(items) == 1:
            return items[0]
        first = items[0]._named()
        tensors: dict[str, list[torch.Tensor]] = {name: [] for name in first}
        for i, item in enumerate(items):
            named = item._named()
            if named.keys() != first.keys():
                raise DataError(
                    f"{cls.__name__}.merge: item {i} has arrays {sorted(named)} but item 0 has {sorted(first)}; "
                    f"all items must agree on having labels and masks"
                )
            for name, tensor in named.items():
                ref = first[name]
                if tensor.shape[1:] != ref.shape[1:] or tensor.dtype != ref.dtype:
                    raise DataError(
                        f"{cls.__name__}.merge: item {i} {name} is {_describe(tensor)} per batch but item 0 has "
                        f"{_describe(ref)}; trailing dimensions and dtypes must match (pad sequences first)"
                    )
                tensors[name].append(tensor)
        return cls._from_named({name: torch.cat(parts, dim=0) for name, parts in tensors.items()})


class DataSet(_Examples):
    """Features and (optionally) labels and masks for a network with one input and one output.

    Args:
        features: ``(N, ...)`` tensor or numpy array; N is the number of examples.
        labels: ``(N,)`` integer class indices (stored as int64) or ``(N, k, ...)`` float targets; None for
            unlabelled data (inference, unsupervised pretraining).
        features_mask: ``(N, ...)`` mask for the features (1 = real timestep), or None.
        labels_mask: ``(N, ...)`` mask for the labels, or None.

    Raises:
        DataError: an array has 0 dimensions, cannot be converted, or its first dimension differs from N.
    """

    __slots__ = ("features", "labels", "features_mask", "labels_mask")

    def __init__(
        self,
        features: Any,
        labels: Any = None,
        features_mask: Any = None,
        labels_mask: Any = None,
    ) -> None:
        self.features: torch.Tensor = _as_tensor(features, "features")
        self.labels: torch.Tensor | None = None if labels is None else _as_labels(labels, "labels")
        self.features_mask: torch.Tensor | None = (
            None if features_mask is None else _as_tensor(features_mask, "features_mask")
        )
        self.labels_mask: torch.Tensor | None = None if labels_mask is None else _as_tensor(labels_mask, "labels_mask")
        if self.labels_mask is not None and self.labels is None:
            raise DataError("labels_mask was given without labels; pass labels too or drop the mask")
        self._check_lengths()

    def _named(self) -> dict[str, torch.Tensor]:
        named = {"features": self.features}
        for name in ("labels", "features_mask", "labels_mask"):
            tensor = getattr(self, name)
            if tensor is not None:
                named[name] = tensor
        return named

    @classmethod
    def _from_named(cls, named: Mapping[str, torch.Tensor]) -> DataSet:
        unknown = set(named) - {"features", "labels", "features_mask", "labels_mask"}
        if "features" not in named or unknown:
            raise DataError(f"a DataSet needs 'features' and only known arrays, got {sorted(named)}")
        return cls(named["features"], named.get("labels"), named.get("features_mask"), named.get("labels_mask"))

    def to_multi(self) -> MultiDataSet:
        """This data as a [`MultiDataSet`][torchspark.MultiDataSet] with one input and one output (or none, if unlabelled)."""
        return MultiDataSet(
            [self.features],
            None if self.labels is None else [self.labels],
            None if self.features_mask is None else [self.features_mask],
            None if self.labels_mask is None else [self.labels_mask],
        )

    def __repr__(self) -> str:
        return (
            f"DataSet(n={self._n}, features={_describe(self.features)}, labels={_describe(self.labels)}, "
            f"features_mask={_describe(self.features_mask)}, labels_mask={_describe(self.labels_mask)})"
        )


def _tensor_list(values: Any, name: str, convert: Callable[[Any, str], torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(values, torch.Tensor) or not isinstance(values, (list, tuple)):
        raise DataError(f"{name} must be a list of arrays, got {type(values).__name__}; wrap a single array as [x]")
    return [convert(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _mask_list(values: Any, name: str, expected: int, of: str) -> list[torch.Tensor | None] | None:
    if values is None:
        return None
    if not isinstance(values, (list, tuple)):
        raise DataError(f"{name} must be a list (one mask or None per array), got {type(values).__name__}")
    if len(values) != expected:
        raise DataError(f"{name} has {len(values)} entries but there are {expected} {of} arrays; give one per array")
    masks = [None if v is None else _as_tensor(v, f"{name}[{i}]") for i, v in enumerate(values)]
    return None if all(m is None for m in masks) else masks


def _feature_names(features: Any) -> tuple[list[Any], tuple[str, ...] | None]:
    """``features`` as a list, and the keyword names when it is a mapping (``{"input_ids": ids, ...}``)."""
    if not isinstance(features, Mapping):
        return features, None
    names = tuple(features)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise DataError(
                f"features key {name!r} is not a Python identifier; keyword features are passed to the module as "
                "module(**features), so name them like arguments (e.g. 'input_ids')"
            )
    return [features[name] for name in names], names


class MultiDataSet(_Examples):
    """Data for a network with several inputs and/or outputs; every array shares the first dimension N.

    Args:
        features: non-empty list of ``(N, ...)`` arrays, one per network input (the module is called as
            ``module(*features)``); or a dict of named arrays, keyword features (called as
            ``module(**features)``, e.g. ``{"input_ids": ids, "attention_mask": mask}``; integer token ids stay
            integers). Their names are in ``feature_names`` (None for positional features).
        labels: list of label arrays (same rules as [`DataSet`][torchspark.DataSet] labels), one per output; None or ``[]``
            for unlabelled data.
        features_masks: None, or a list with one mask or None per features array (all None becomes None).
        labels_masks: None, or a list with one mask or None per labels array.

    Raises:
        DataError: an empty features list, mask lists of the wrong length, or mismatched first dimensions.
    """

    __slots__ = ("features", "labels", "features_masks", "labels_masks", "feature_names")

    def __init__(
        self,
        features: Sequence[Any] | Mapping[str, Any],
        labels: Sequence[Any] | None = None,
        features_masks: Sequence[Any] | None = None,
        labels_masks: Sequence[Any] | None = None,
    ) -> None:
        values, names = _feature_names(features)
        #: the keyword name of each features array (``module(**dict(zip(feature_names, features)))``), or None
        self.feature_names: tuple[str, ...] | None = names
        self.features: list[torch.Tensor] = (
            _tensor_list(values, "features", _as_tensor)
            if names is None
            else [_as_tensor(v, f"features[{name!r}]") for name, v in zip(names, values)]
        )
        if not self.features:
            raise DataError("MultiDataSet features is an empty list; give at least one features array")
        label_list = None if labels is None else _tensor_list(labels, "labels", _as_labels)
        self.labels: list[torch.Tensor] | None = label_list or None
        self.features_masks: list[torch.Tensor | None] | None = _mask_list(
            features_masks, "features_masks", len(self.features), "features"
        )
        if labels_masks is not None and self.labels is None:
            raise DataError("labels_masks was given without labels; pass labels too or drop the masks")
        n_labels = 0 if self.labels is None else len(self.labels)
        self.labels_masks: list[torch.Tensor | None] | None = _mask_list(
            labels_masks, "labels_masks", n_labels, "labels"
        )
        self._check_lengths()

    def _named(self) -> dict[str, torch.Tensor]:
        named: dict[str, torch.Tensor] = {}
        groups = (
            ("features", self.features),
            ("labels", self.labels),
            ("features_mask", self.features_masks),
            ("labels_mask", self.labels_masks),
        )
        for prefix, tensors in groups:
            for i, tensor in enumerate(tensors or []):
                if tensor is not None:
                    # keyword features as features.<i>.<name>: the name and the order (batch files sort keys)
                    name = "" if prefix != "features" or self.feature_names is None else f".{self.feature_names[i]}"
                    named[f"{prefix}.{i}{name}"] = tensor
        return named

    @classmethod
    def _from_named(cls, named: Mapping[str, torch.Tensor]) -> MultiDataSet:
        def group(prefix: str, count: int | None) -> list[torch.Tensor | None]:
            if count is None:
                count = 0
                while f"{prefix}.{count}" in named:
                    count += 1
            return [named.get(f"{prefix}.{i}") for i in range(count)]

        keyed = sorted((int(p[1]), p[2], k) for k in named if len(p := k.split(".", 2)) == 3 and p[1].isdigit())
        keywords = [(name, k) for _, name, k in keyed if k.startswith("features.")]
        features: Any = {name: named[k] for name, k in keywords} if keywords else group("features", None)
        labels = group("labels", None)
        used = {k for _, k in keywords} | {
            f"{p}.{i}"
            for p, c in (
                ("features", len(features)),
                ("labels", len(labels)),
                ("features_mask", len(features)),
                ("labels_mask", len(labels)),
            )
            for i in range(c)
        }
        if set(named) - used:
            raise DataError(
                f"unexpected MultiDataSet arrays {sorted(set(named) - used)}; "
                f"expected features.i, labels.i, features_mask.i, labels_mask.i"
            )
        return cls(
            features,
            labels or None,
            group("features_mask", len(features)),
            group("labels_mask", len(labels)) if labels else None,
        )

    def __repr__(self) -> str:
        def many(tensors: Sequence[torch.Tensor | None] | None) -> str:
            return "None" if tensors is None else "[" + ", ".join(_describe(t) for t in tensors) + "]"

        feats = (
            many(self.features)
            if self.feature_names is None
            else "{" + ", ".join(f"{k}: {_describe(t)}" for k, t in zip(self.feature_names, self.features)) + "}"
        )
        return (
            f"MultiDataSet(n={self._n}, features={feats}, labels={many(self.labels)}, "
            f"features_masks={many(self.features_masks)}, labels_masks={many(self.labels_masks)})"
        )
