"""``Network``: a PyTorch module bundled with its loss, its updater and flat views for distributed training.

DL4J's MultiLayerNetwork and ComputationGraph kept all parameters in one flat array; so does this class: every
parameter is a view into one contiguous float buffer, so ``params()``, ``set_params()`` and the all-reduces of
the training masters touch a single tensor instead of one per layer.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable, Sequence, Union

import torch

from torchspark.data import DataSet, MultiDataSet, iterate_minibatches
from torchspark.errors import ConfigError, DataError, TrainingError
from torchspark.nn.divergence import diverged_message
from torchspark.nn.losses import Loss, LossLike, resolve_loss
from torchspark.optim import SGD, UpdaterLike, UpdaterSpec, resolve_updater

__all__ = ["Network", "Batch"]

log = logging.getLogger(__name__)

Batch = Union[DataSet, MultiDataSet]
ModuleLike = Union[torch.nn.Module, Callable[[], torch.nn.Module]]
Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


#: parameter layouts a Network can keep; see the ``memory_format`` argument of :class:`Network`
MEMORY_FORMATS = ("contiguous", "channels_last")


#: fragments of PyTorch's messages when a module gets inputs of the wrong shape, count, type or index range
_INPUT_MISMATCH = ("shape", "size", "dimension", "channels", "mat1", "expected", "must match", "argument", "index",
                   "dtype", "scalar type")


def _looks_like_input_mismatch(message: str) -> bool:
    lower = message.lower()
    return "out of memory" not in lower and any(h in lower for h in _INPUT_MISMATCH)


def _scatter(tensors: list[torch.Tensor], flat: Any, what: str) -> None:
    """Copy consecutive slices of the 1-D ``flat`` into ``tensors`` (in their logical layout and dtypes)."""
    size = sum(t.numel() for t in tensors)
    flat = torch.as_tensor(flat)
    if flat.dim() != 1 or flat.numel() != size:
        raise DataError(f"{what} needs a 1-D tensor of {size} values, got shape {tuple(flat.shape)}")
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def _check_label_shape(k: int, out: torch.Tensor, lab: torch.Tensor, loss: Loss) -> None:
    """Labels whose shape the built-in loss cannot take: a DataError naming the loss, both shapes and the fix
    (instead of torch's "0D or 1D target tensor expected" or "shape ... is invalid")."""
    got = f"labels of shape {tuple(lab.shape)} ({str(lab.dtype).replace('torch.', '')})"
    if loss.name == "cross_entropy" and out.dim() == 2:
        indices = lab.dim() == 1 and not lab.is_floating_point()
        dense = lab.dim() == 2 and lab.is_floating_point() and lab.shape[1] == out.shape[1]
        if not (indices or dense) and lab.dim() == 2 and lab.shape[1] == 1:
            raise DataError(f"loss 'cross_entropy' (output {k}, {out.shape[1]} classes) takes class indices of shape "
                            f"(N,) as integers or one-hot targets (N, {out.shape[1]}), got {got}; flatten the labels "
                            "to integer class indices (labels.reshape(-1).astype('int64'))")
        if not (indices or dense) and lab.dim() == 2:
            raise DataError(f"loss 'cross_entropy' (output {k}) needs one-hot targets of shape (N, {out.shape[1]}) "
                            f"or class indices (N,), got {got}; match the number of classes or rebuild the model")
    elif loss.name in ("mse", "bce_with_logits") and lab.numel() != out.numel():
        fix = (f"one-hot encode class indices (torch.nn.functional.one_hot(labels, {out.shape[1]})) or use "
               "loss='cross_entropy'") if not lab.is_floating_point() and lab.dim() == 1 and out.dim() == 2 \
            else "give labels of the outputs' shape"
        raise DataError(f"loss {loss.name!r} (output {k}) needs labels shaped like the outputs {tuple(out.shape)}, "
                        f"got {got}; {fix}")


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class Network:
    """A trainable network: module + loss + updater, with flat parameter and updater-state views.

    Args:
        module: a ``torch.nn.Module`` or a zero-argument factory returning one. Modules return logits.
            Zoo models (:mod:`torchspark.models`) and :func:`torchspark.nn.from_factory` modules save as JSON.
        loss: ``"cross_entropy"`` (class-index or one-hot labels, softmax outputs), ``"mse"``,
            ``"bce_with_logits"`` (multi-label, sigmoid outputs), a callable ``(outputs, labels) -> loss``, an import
            path ``"pkg.mod:fn"``, or for several outputs a list of those (summed).
        updater: a :mod:`torchspark.optim` spec (``SGD(lr=0.01)`` by default), a name such as ``"adam"``, or a
            callable ``params -> torch.optim.Optimizer``.
        seed: seeds weight initialisation. With a factory, the factory runs under this seed; with a module
            instance, its layers are re-initialised (``reset_parameters``) under this seed. ``None`` keeps the
            weights as they are.
        weight_decay: L2 penalty handed to the optimizer (decoupled for AdamW). 0 disables; 1e-4 is a common start.
        l1: L1 penalty ``l1 * sum(|w|)``: ``l1 * sign(w)`` is added to every gradient before the updater runs
            (after ``gradient_clip``, as DL4J does), which drives small weights to exactly 0 with SGD. 0 disables;
            1e-5..1e-4 is a common start. Reported losses do not include the penalty.
        gradient_clip: clip the global gradient norm to this value before the updater runs (None = off). Try 1-5
            for recurrent or unstable networks.
        device: where the network lives (``"cpu"``, ``"cuda:0"``); default CPU.
        memory_format: layout of 4-D (convolution) weights. ``"channels_last"`` (NHWC) makes PyTorch's CPU
            convolutions and pooling take their faster channels-last kernels: about 1.3-1.5x faster training for
            small CNNs such as LeNet on CPU (see BENCHMARKS.md), and the layout tensor cores want on GPU. Results
            equal ``"contiguous"`` up to float rounding. The module's ``forward`` must not ``.view()`` a
            convolution output (use ``flatten``/``reshape``). Each 4-D weight then sits in :meth:`params` in its
            memory order (N, H, W, C); every replica of the network uses the same layout, and saved weights are
            stored in the logical layout either way.
    """

    def __init__(
        self,
        module: ModuleLike,
        loss: LossLike | Sequence[LossLike] = "cross_entropy",
        updater: UpdaterLike | None = None,
        seed: int | None = None,
        weight_decay: float = 0.0,
        gradient_clip: float | None = None,
        device: str | torch.device | None = None,
        memory_format: str = "contiguous",
        l1: float = 0.0,
    ) -> None:
        if memory_format not in MEMORY_FORMATS:
            raise ConfigError(f"memory_format must be one of {list(MEMORY_FORMATS)}, got {memory_format!r}")
        if not isinstance(weight_decay, (int, float)) or not math.isfinite(weight_decay) or weight_decay < 0:
            raise ConfigError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
        if isinstance(l1, bool) or not isinstance(l1, (int, float)) or not math.isfinite(l1) or l1 < 0:
            raise ConfigError(f"l1 must be a finite number >= 0, got {l1!r}; 1e-5..1e-4 is a common start")
        if gradient_clip is not None and (
            not isinstance(gradient_clip, (int, float)) or not math.isfinite(gradient_clip) or gradient_clip <= 0
        ):
            raise ConfigError(f"gradient_clip must be None or a number > 0, got {gradient_clip!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer or None, got {seed!r}")
        self.seed = seed
        self.weight_decay = float(weight_decay)
        self.l1 = float(l1)
        self.gradient_clip = None if gradient_clip is None else float(gradient_clip)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.memory_format = memory_format
        self.module = self._build_module(module, seed).to(self.device)
        if memory_format == "channels_last":
            self.module = self.module.to(memory_format=torch.channels_last)
        self.losses: list[Loss] = [resolve_loss(lo) for lo in _as_list(loss)]
        self.updater = resolve_updater(updater if updater is not None else SGD(lr=0.01))
        self._params: list[torch.nn.Parameter] = list(self.module.parameters())
        if not self._params:
            raise ConfigError(f"module {type(self.module).__name__} has no parameters to train")
        self._flat = self._flatten_parameters()
        self.optimizer = self._make_optimizer(self._params)
        self._materialize_updater_state()
        self.iteration = 0
        self.epoch = 0
        self.last_score = float("nan")
        #: Tensors that training masters attach to the model (gradient-sharing residuals, threshold state);
        #: saved with the model and restored by :meth:`load`.
        self.extra_state: dict[str, torch.Tensor] = {}
        #: JSON-serialisable companions of :attr:`extra_state`.
        self.extra_config: dict[str, Any] = {}

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _build_module(module: ModuleLike, seed: int | None) -> torch.nn.Module:
        if isinstance(module, torch.nn.Module):
            if seed is not None:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    for sub in module.modules():
                        reset = getattr(sub, "reset_parameters", None)
                        if callable(reset):
                            reset()
            return module
        if callable(module):
            with torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                built = module()
            if not isinstance(built, torch.nn.Module):
                raise ConfigError(f"module factory returned {type(built).__name__}, expected a torch.nn.Module")
            return built
        raise ConfigError(f"module must be a torch.nn.Module or a zero-argument factory, got {module!r}")

    def _flatten_parameters(self) -> torch.Tensor:
        dtypes = {p.dtype for p in self._params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise ConfigError(f"all parameters must share one floating dtype, got {sorted(map(str, dtypes))}")
        last = self.memory_format == "channels_last"
        # each tensor enters the flat buffer in its memory order: (N, H, W, C) for channels_last 4-D weights
        flat = torch.cat([(p.detach().permute(0, 2, 3, 1) if last and p.dim() == 4 else p.detach()).reshape(-1)
                          for p in self._params])
        offset = 0
        for p in self._params:
            n = p.numel()
            part = flat[offset : offset + n]
            if last and p.dim() == 4:
                size = p.shape
                p.data = part.view(size[0], size[2], size[3], size[1]).permute(0, 3, 1, 2)
            else:
                p.data = part.view_as(p)
            offset += n
        return flat

    def _make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if isinstance(self.updater, UpdaterSpec):
            return self.updater.build(params, weight_decay=self.weight_decay)
        opt = self.updater(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigError(f"updater callable returned {type(opt).__name__}, expected a torch.optim.Optimizer")
        return opt

    def _materialize_updater_state(self) -> None:
        """Create every optimizer state tensor now (zeros), so the flat updater view has a fixed layout.

        The layout is discovered by stepping a throw-away optimizer once with zero gradients on zero-filled
        clones; zero state is exactly "before the first step" for SGD momentum, Adam(W), RMSprop and AdaGrad.
        """
        missing = [i for i, p in enumerate(self._params) if not self.optimizer.state.get(p)]
        if not missing:
            return
        clones = [torch.zeros_like(p, requires_grad=True) for p in self._params]
        for c in clones:
            c.grad = torch.zeros_like(c)
        probe = self._make_optimizer(clones)
        probe.step()
        for i in missing:
            state = probe.state.get(clones[i], {})
            self.optimizer.state[self._params[i]] = {
                k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)
            }

    # ------------------------------------------------------------------ flat views
    def num_params(self) -> int:
        """Number of trainable scalars (the length of :meth:`params`)."""
        return self._flat.numel()

    def params(self) -> torch.Tensor:
        """A 1-D copy of all parameters, in ``module.parameters()`` order."""
        return self._flat.detach().clone()

    def params_view(self) -> torch.Tensor:
        """The live flat parameter buffer (no copy). Writes change the network; use with care."""
        return self._flat

    def set_params(self, flat: torch.Tensor) -> None:
        """Overwrite all parameters from a 1-D tensor of length :meth:`num_params`."""
        flat = torch.as_tensor(flat)
        if flat.dim() != 1 or flat.numel() != self._flat.numel():
            raise DataError(
                f"set_params needs a 1-D tensor of {self._flat.numel()} values, got shape {tuple(flat.shape)}"
            )
        with torch.no_grad():
            self._flat.copy_(flat)

    def updater_state_tensors(self) -> list[torch.Tensor]:
        """The live optimizer state tensors, in :meth:`updater_state` order (no copy; writes change the updater)."""
        return self._state_tensors()

    def _state_tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for p in self._params:
            state = self.optimizer.state.get(p, {})
            out.extend(v for _, v in sorted(state.items()) if isinstance(v, torch.Tensor))
        return out

    def updater_state_size(self) -> int:
        """Length of :meth:`updater_state` (0 for plain SGD)."""
        return sum(t.numel() for t in self._state_tensors())

    def updater_state(self) -> torch.Tensor:
        """All optimizer state as one float32 1-D tensor, in a stable order (zeros before the first step)."""
        return self._gather(self._state_tensors())

    def set_updater_state(self, flat: torch.Tensor) -> None:
        """Overwrite all optimizer state from :meth:`updater_state` output."""
        _scatter(self._state_tensors(), flat, "set_updater_state")

    def _gather(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if not tensors:
            return torch.zeros(0, dtype=torch.float32, device=self.device)
        return torch.cat([t.detach().reshape(-1).to(torch.float32, copy=True) for t in tensors])

    def reset_updater_state(self) -> None:
        """Zero the optimizer state (as before the first step)."""
        with torch.no_grad():
            for t in self._state_tensors():
                t.zero_()

    # ------------------------------------------------------------------ buffers
    def buffer_tensors(self) -> list[torch.Tensor]:
        """The live floating-point buffers (BatchNorm running mean/var), in ``module.buffers()`` order.

        Training masters average these with the parameters (DL4J kept them in its parameter vector). Integer
        buffers such as ``num_batches_tracked`` are not in this list: they count steps, which all workers take in
        lockstep, and the driver takes worker 0's (see :meth:`buffer_state`)."""
        return [b for b in self.module.buffers() if b.is_floating_point()]

    def buffer_size(self) -> int:
        """Length of :meth:`buffers` (0 for modules without floating-point buffers)."""
        return sum(b.numel() for b in self.buffer_tensors())

    def buffers(self) -> torch.Tensor:
        """All floating-point buffers as one float32 1-D copy (empty when the module has none)."""
        return self._gather(self.buffer_tensors())

    def set_buffers(self, flat: torch.Tensor) -> None:
        """Overwrite the floating-point buffers from :meth:`buffers` output."""
        _scatter(self.buffer_tensors(), flat, "set_buffers")

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Every buffer by name, integer ones included, as CPU copies (what a worker hands back to the driver)."""
        return {name: b.detach().cpu().clone() for name, b in self.module.named_buffers()}

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy :meth:`buffer_state` output into this network's buffers (names it does not have are ignored)."""
        with torch.no_grad():
            for name, b in self.module.named_buffers():
                if name in state:
                    b.copy_(torch.as_tensor(state[name]).to(b.device, b.dtype))

    # ------------------------------------------------------------------ forward / loss
    def _unpack(self, batch: Batch) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, Any, Any]:
        if isinstance(batch, DataSet):
            feats = [batch.features]
            labels = None if batch.labels is None else [batch.labels]
            fmask = batch.features_mask
            lmasks = None if batch.labels_mask is None else [batch.labels_mask]
        elif isinstance(batch, MultiDataSet):
            feats = list(batch.features)
            labels = None if batch.labels is None else list(batch.labels)
            fmask = batch.features_masks
            lmasks = batch.labels_masks
        else:
            raise DataError(f"expected a DataSet or MultiDataSet, got {type(batch).__name__}")
        dev = self.device
        # floating features take the parameters' dtype (numpy's float64 default meets a float32 network); integer
        # features (token ids) stay as they are
        dtype = self._flat.dtype
        feats = [f.to(dev, dtype=dtype if f.is_floating_point() else f.dtype, non_blocking=True) for f in feats]
        if labels is not None:
            labels = [lab.to(dev, non_blocking=True) for lab in labels]
        return feats, labels, fmask, lmasks

    def _forward(self, feats: list[torch.Tensor], fmask: Any = None) -> list[torch.Tensor]:
        kwargs: dict[str, Any] = {}
        if fmask is not None:
            kwargs["features_mask"] = fmask.to(self.device) if isinstance(fmask, torch.Tensor) else fmask
        try:
            out = self.module(*feats, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            text = str(e)
            if "view size is not compatible" in text:
                raise ConfigError(
                    f"{type(self.module).__name__}.forward calls .view() on a tensor whose layout does not allow it "
                    f"({text.splitlines()[0]}); use .reshape() or .flatten() there"
                    + (", or memory_format='contiguous'" if self.memory_format != "contiguous" else "")
                ) from e
            if not _looks_like_input_mismatch(text):
                raise  # e.g. out of memory, or a bug in the module: not the data's fault
            shapes = ", ".join(str(tuple(f.shape)) for f in feats)
            if "dtype" in text.lower() or "expected scalar type" in text.lower():
                dtypes = ", ".join(str(f.dtype).replace("torch.", "") for f in feats)
                raise DataError(
                    f"the network ({type(self.module).__name__}) cannot take features of dtype {dtypes} (shape "
                    f"{shapes}); its parameters are {str(self._flat.dtype).replace('torch.', '')}: {text.splitlines()[0]}. "
                    "Cast the features (e.g. features.astype('float32')) or embed integer inputs in the model"
                ) from e
            raise DataError(
                f"the network ({type(self.module).__name__}) cannot take features of shape {shapes}: {e}. "
                "Check the feature shape (reshape the data or build the model for this input size)."
            ) from e
        return _as_list(out)

    def _losses_for(self, n_outputs: int) -> list[Loss]:
        if len(self.losses) == n_outputs:
            return self.losses
        if len(self.losses) == 1:
            return self.losses * n_outputs
        raise ConfigError(f"the network has {n_outputs} outputs but {len(self.losses)} losses were given")

    def _check_labels(self, outputs: list[torch.Tensor], labels: list[torch.Tensor]) -> None:
        if len(labels) != len(outputs):
            raise DataError(f"the data has {len(labels)} label arrays but the network has {len(outputs)} outputs")
        for k, (out, lab, loss) in enumerate(zip(outputs, labels, self._losses_for(len(outputs)))):
            _check_label_shape(k, out, lab, loss)
            if loss.classification and not lab.is_floating_point() and out.dim() >= 2 and lab.numel():
                lo, hi = int(lab.min()), int(lab.max())
                if lo < 0 or hi >= out.shape[1]:
                    bad = hi if hi >= out.shape[1] else lo
                    raise DataError(
                        f"label index {bad} is out of range for output {k} with {out.shape[1]} classes; "
                        f"labels must be in [0, {out.shape[1] - 1}] (or build the model with more outputs)"
                    )

    def _per_example_losses(
        self, outputs: list[torch.Tensor], labels: list[torch.Tensor], lmasks: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed per-example loss over outputs ``(N,)`` and per-example weights ``(N,)`` (from label masks)."""
        total: torch.Tensor | None = None
        weight = torch.ones(outputs[0].shape[0], device=self.device)
        for k, (out, lab, loss) in enumerate(zip(outputs, labels, self._losses_for(len(outputs)))):
            per = loss.per_example(out, lab)
            if lmasks is not None and lmasks[k] is not None:
                m = lmasks[k].to(self.device, dtype=per.dtype)
                m = m.reshape(m.shape[0], -1).amax(dim=1) if m.dim() > 1 else m
                per = per * m
                weight = torch.minimum(weight, m) if k else m
            total = per if total is None else total + per
        assert total is not None
        return total, weight

    def _batch_loss(self, batch: Batch, validate: bool) -> tuple[torch.Tensor, int]:
        feats, labels, fmask, lmasks = self._unpack(batch)
        if labels is None:
            raise DataError("training and scoring need labels, but the batch has labels=None; pass "
                            "DataSet(features, labels) (predict with net.output(features) needs none)")
        if validate:
            batch.check_finite("training features")
        outputs = self._forward(feats, fmask)
        self._check_labels(outputs, labels)
        per, weight = self._per_example_losses(outputs, labels, lmasks)
        loss = per.sum() / weight.sum().clamp(min=1.0)
        return loss, outputs[0].shape[0]

    # ------------------------------------------------------------------ training
    def train_step(self, batch: Batch, validate: bool = False) -> float:
        """One minibatch: forward, backward, optional clipping, one updater step. Returns the loss."""
        self.module.train()
        loss, _ = self._batch_loss(batch, validate)
        value = float(loss.detach())
        if not math.isfinite(value):
            try:
                batch.check_finite("training features")
            except DataError as e:
                raise TrainingError(f"loss is {value} at iteration {self.iteration}: {e}") from e
            raise TrainingError(diverged_message(f"loss turned {value}", self.iteration, self.updater))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.gradient_clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params, self.gradient_clip)
        if self.l1:
            self._add_l1_gradient()
        self._apply_lr_schedule()
        self.optimizer.step()
        self.iteration += 1
        self.last_score = value
        return value

    def _add_l1_gradient(self) -> None:
        """grad += l1 * sign(w): the gradient of ``l1 * sum(|w|)`` (0 at w = 0, as autograd's abs)."""
        with torch.no_grad():
            for p in self._params:
                if p.grad is not None:
                    p.grad.add_(torch.sign(p), alpha=self.l1)

    def _apply_lr_schedule(self) -> None:
        """Set the optimizer's learning rate from the updater's schedule for this step (no-op for a fixed rate)."""
        schedule = self.updater.lr_schedule if isinstance(self.updater, UpdaterSpec) else None
        if schedule is not None:
            lr = schedule.value(self.iteration, self.epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    def current_lr(self) -> float:
        """The learning rate the next step will use (the schedule's value at the current counters)."""
        schedule = self.updater.lr_schedule if isinstance(self.updater, UpdaterSpec) else None
        if schedule is not None:
            return schedule.value(self.iteration, self.epoch)
        return float(self.optimizer.param_groups[0]["lr"])

    def compute_update(self, batch: Batch, validate: bool = False) -> torch.Tensor:
        """The step the updater would take on ``batch`` (``params_before - params_after``), without taking it.

        The updater's own state (momentum, Adam moments) does advance, as it would on a real step. This is what
        gradient sharing encodes; :meth:`apply_update` applies such a step.
        """
        before = self._flat.detach().clone()
        self.train_step(batch, validate)
        with torch.no_grad():
            update = before - self._flat
            self._flat.copy_(before)
        return update

    def apply_update(self, update: torch.Tensor) -> None:
        """``params -= update`` (a flat tensor of length :meth:`num_params`)."""
        if update.dim() != 1 or update.numel() != self._flat.numel():
            raise DataError(
                f"apply_update needs a 1-D tensor of {self._flat.numel()} values, got shape {tuple(update.shape)}"
            )
        with torch.no_grad():
            self._flat.sub_(update.to(self._flat.device, self._flat.dtype))

    def apply_update_at(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """``params[indices] -= values``: :meth:`apply_update` of an update that is zero except at ``indices``
        (unique int64 indices). Bit-identical to it (``x - 0`` is ``x``), but touches only those elements."""
        if indices.dim() != 1 or indices.shape != values.shape:
            raise DataError(f"apply_update_at needs 1-D indices and values of one length, got shapes "
                            f"{tuple(indices.shape)} and {tuple(values.shape)}")
        with torch.no_grad():
            values = values.to(self._flat.device, self._flat.dtype)
            if self._flat.device.type == "cpu":  # numpy fancy indexing: ~5x less overhead than torch's for few entries
                flat, idx = self._flat.detach().numpy(), indices.numpy()
                flat[idx] = flat[idx] - values.numpy()
            else:
                idx = indices.to(self._flat.device)
                self._flat[idx] = self._flat[idx] - values

    def fit(self, data: Batch | Iterable[Batch], epochs: int = 1, batch_size: int = 32) -> "Network":
        """Train on one process.

        Args:
            data: a DataSet/MultiDataSet (split into minibatches of ``batch_size``, in order) or an iterable of
                them (used as they come; must be re-iterable, such as a list, when ``epochs > 1``). Floating-point
                features are cast to the parameters' dtype (numpy's float64 default trains a float32 network);
                integer features are passed as they are (token ids for an embedding).
            epochs: passes over the data.
            batch_size: minibatch size when ``data`` is a single DataSet/MultiDataSet.
        Returns:
            self, trained.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
        if epochs > 1 and not isinstance(data, (DataSet, MultiDataSet)) and iter(data) is data:  # type: ignore[arg-type]
            raise ConfigError("data is a one-shot iterator but epochs > 1; pass a list or a DataSet instead")
        for _ in range(epochs):
            seen = 0
            for batch in iterate_minibatches(data, batch_size):
                self.train_step(batch, validate=(seen == 0))
                seen += 1
            if seen == 0:
                raise DataError("fit got no data: the DataSet or iterable is empty (0 examples); pass data with at "
                                "least one example")
            self.epoch += 1
        return self

    # ------------------------------------------------------------------ inference and scoring
    def output(self, features: Tensors | Any, train: bool = False, batch_size: int | None = None) -> Any:
        """Network outputs with the loss's output activation (softmax / sigmoid / identity).

        Args:
            features: a tensor (or numpy array) of examples, or a list of them for several inputs.
            train: run in training mode (dropout active, batch-norm batch statistics) when True.
            batch_size: evaluate in chunks of this many examples to bound memory (None: all at once).
        Returns:
            a tensor on the CPU, or a tuple of tensors for several outputs.
        """
        feats = [torch.as_tensor(f) for f in _as_list(features)]
        n = feats[0].shape[0]
        step = n if not batch_size else batch_size
        if step <= 0:
            raise DataError(f"batch_size must be >= 1, got {batch_size!r}")
        self.module.train(train)
        chunks: list[list[torch.Tensor]] = []
        with torch.set_grad_enabled(train):
            for start in range(0, max(n, 1), max(step, 1)):
                part = [f[start : start + step].to(self.device, dtype=self._flat.dtype if f.is_floating_point()
                                                     else f.dtype) for f in feats]
                outs = self._forward(part)
                acts = [lo.activation(o) for lo, o in zip(self._losses_for(len(outs)), outs)]
                chunks.append([a.detach().cpu() for a in acts])
        merged = [torch.cat([c[k] for c in chunks]) for k in range(len(chunks[0]))]
        return merged[0] if len(merged) == 1 else tuple(merged)

    def batch_losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(per_example_loss, weight)`` of one batch in the current mode, without gradients being required:
        the loss summed over outputs per example, and each example's weight (0 where every label is masked)."""
        feats, labels, fmask, lmasks = self._unpack(batch)
        if labels is None:
            raise DataError("scoring needs labels, but the batch has labels=None")
        outputs = self._forward(feats, fmask)
        self._check_labels(outputs, labels)
        return self._per_example_losses(outputs, labels, lmasks)

    def score_examples(self, data: Batch | Iterable[Batch], batch_size: int = 256) -> torch.Tensor:
        """Per-example loss (summed over outputs), in data order, as a 1-D CPU tensor."""
        self.module.eval()
        parts: list[torch.Tensor] = []
        with torch.no_grad():
            for batch in iterate_minibatches(data, batch_size):
                parts.append(self.batch_losses(batch)[0].cpu())
        if not parts:
            raise DataError("score got no data: the DataSet or iterable is empty")
        return torch.cat(parts)

    def score(self, data: Batch | Iterable[Batch], batch_size: int = 256) -> float:
        """Mean loss over all examples (label-masked examples excluded)."""
        total, count = 0.0, 0.0
        self.module.eval()
        with torch.no_grad():
            for batch in iterate_minibatches(data, batch_size):
                per, weight = self.batch_losses(batch)
                total += float(per.sum())
                count += float(weight.sum())
        if count == 0:
            raise DataError("score got no data: the DataSet or iterable is empty")
        return total / count

    def default_evaluation(self, output_index: int = 0) -> Any:
        """The evaluation that fits the loss of output ``output_index``: classification, binary or regression."""
        from torchspark.evaluation import Evaluation, EvaluationBinary, RegressionEvaluation

        losses = self.losses
        name = losses[output_index if output_index < len(losses) else 0].name
        if name == "cross_entropy":
            return Evaluation()
        if name == "bce_with_logits":
            return EvaluationBinary()
        return RegressionEvaluation()

    def evaluate(self, data: Batch | Iterable[Batch], *evaluations: Any, batch_size: int = 256,
                 output_index: int | None = None) -> Any:
        """Fill evaluations with this network's outputs on ``data``.

        Args:
            evaluations: evaluation objects, all filled from output ``output_index`` (output 0 when None).
                None given: the evaluation that fits the loss; a network with one loss per output and
                ``output_index=None`` gets one per output, returned as a list (``evals[k]`` for output ``k``).
            output_index: which output (and label array) of a several-output network to evaluate.
        Returns:
            the evaluation, a tuple when several are given, or the per-output list described above.
        Raises:
            ConfigError: an output index the network does not have. DataError: no data or no labels.
        """
        from torchspark.nn.outputs import default_targets, fill_evaluations

        evs, targets = default_targets(self, evaluations, output_index)
        if fill_evaluations(self, iterate_minibatches(data, batch_size), evs, targets) == 0:
            raise DataError("evaluate got no data: the DataSet or iterable is empty")
        if not evaluations and len(set(targets)) > 1:
            return evs
        return evs[0] if len(evs) == 1 else tuple(evs)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str, save_updater: bool = True, allow_pickle: bool = False) -> str:
        """Save to a directory (any fsspec URL): ``config.json``, ``weights.safetensors``, ``updater.safetensors``.

        Zoo models, ``from_factory`` modules, named losses and updater specs are written as JSON. A module
        instance without a spec, a custom callable loss or updater can only be stored with
        ``allow_pickle=True`` (and then loaded only with ``allow_pickle=True``).
        """
        from torchspark.nn.serialization import save_network

        return save_network(self, path, save_updater=save_updater, allow_pickle=allow_pickle)

    @classmethod
    def load(cls, path: str, allow_pickle: bool = False, factories: Any = None,
             trust_code: bool = False) -> "Network":
        """Load a network written by :meth:`save`.

        No code runs because a file names it: ``config.json`` may name torchspark's zoo models and built-in
        losses; a module factory or loss function of yours must be passed (``factories=[build]``), or the file
        trusted as code (``trust_code=True``). See :func:`torchspark.nn.load_network`.
        """
        from torchspark.nn.serialization import load_network

        return load_network(path, allow_pickle=allow_pickle, factories=factories, trust_code=trust_code)

    def copy(self) -> "Network":
        """A deep copy with the same weights, updater state and counters (through the in-memory blueprint)."""
        from torchspark.nn.serialization import NetworkBlueprint

        return NetworkBlueprint.of(self).build()

    def __deepcopy__(self, memo: dict[int, Any]) -> "Network":
        """``copy.deepcopy(net)`` is :meth:`copy`: a field-by-field deep copy would give the module parameters their
        own storage, detached from the flat buffer the network trains through (``compute_update`` would then return
        zeros)."""
        twin = self.copy()
        memo[id(self)] = twin
        return twin

    def __repr__(self) -> str:
        return (
            f"Network({type(self.module).__name__}, params={self.num_params()}, "
            f"loss={[lo.name for lo in self.losses]}, updater={self.updater!r}, iteration={self.iteration})"
        )
