"""``Network``: a PyTorch module bundled with its loss, its updater and flat views for distributed training.

The pieces live beside it: building the module and the optimizer (`torchspark.nn.construction`), the flat
parameter and updater state (`torchspark.nn.flat`), the forward pass and its label checks
(`torchspark.nn.forward`), saving, loading and copying (`torchspark.nn.portable`) and the evaluation of
several outputs (`torchspark.nn.outputs`) and mixed precision (`torchspark.nn.precision`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any, Union

import torch

from torchspark.data import DataSet, MultiDataSet, as_group, group_batches, iterate_minibatches
from torchspark.data.torchdata import TORCH_DATA
from torchspark.errors import ConfigError, DataError, TrainingError
from torchspark.nn import inference
from torchspark.nn.compiled import check_compile, forward_module
from torchspark.nn.construction import ModuleLike, build_module, build_optimizer
from torchspark.nn.divergence import check_gradient, diverged_message
from torchspark.nn.flat import FlatState
from torchspark.nn.forward import Batch, as_list, batch_loss
from torchspark.nn.losses import Loss, LossLike, resolve_losses
from torchspark.nn.lr_scheduler import LrSchedulerLike, make_lr_scheduling
from torchspark.nn.outputs import default_evaluation, evaluate
from torchspark.nn.portable import Blueprint, read_network, save_network
from torchspark.nn.precision import Precision
from torchspark.optim import SGD, UpdaterLike, resolve_updater
from torchspark.validation import check_choice, check_float, check_int

__all__ = ["Network", "Batch", "MEMORY_FORMATS"]

log = logging.getLogger(__name__)

Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


#: parameter layouts a Network can keep; see the ``memory_format`` argument of [`Network`][torchspark.Network]
MEMORY_FORMATS = ("contiguous", "channels_last")


class Network:
    """A trainable network: module + loss + updater, with flat parameter and updater-state views.

    Args:
        module: a ``torch.nn.Module`` or a zero-argument factory returning one. Modules return logits (forms:
            `torchspark.nn.forward.read_outputs`); dict batches are passed as keywords (``module(**features)``).
            Zoo models ([`torchspark.models`][torchspark.models]) and [`torchspark.nn.from_factory`][torchspark.from_factory] modules save as JSON.
        loss: ``"cross_entropy"`` (class-index or one-hot labels, softmax outputs), ``"mse"``,
            ``"bce_with_logits"`` (multi-label, sigmoid outputs), a callable ``(outputs, labels) -> loss``, an import
            path ``"pkg.mod:fn"``, or for several outputs a list of those (summed). ``None``: the model's own
            loss, Hugging Face style (labels passed as ``labels=``, its ``loss`` read back).
        updater: a [`torchspark.optim`][torchspark.optim] spec (``SGD(lr=0.01)`` by default), a name such as ``"adam"``, or a
            callable ``params -> torch.optim.Optimizer``: any but ``LBFGS``, with its own weight decay
            (``functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01)``; ``weight_decay`` stays 0).
        lr_scheduler: a [`torchspark.schedules`][torchspark.schedules] schedule or a factory ``optimizer ->
            torch.optim.lr_scheduler`` scheduler, positioned by ``iteration`` (or ``epoch``) on every worker and
            through save/load and resume (`torchspark.nn.lr_scheduler`); ``lr_scheduler_interval``: ``"step"``
            (default) or ``"epoch"``, for a factory.
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
            convolutions and pooling take their faster channels-last kernels: faster training for
            small CNNs such as LeNet on CPU (see BENCHMARKS.md), and the layout tensor cores want on GPU. Results
            equal ``"contiguous"`` up to float rounding. The module's ``forward`` must not ``.view()`` a
            convolution output (use ``flatten``/``reshape``). Each 4-D weight then sits in [`params`][torchspark.Network.params] in its
            memory order (N, H, W, C); every replica of the network uses the same layout, and saved weights are
            stored in the logical layout either way.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: the forward pass runs under ``torch.autocast``
            at that dtype, outputs come back float32; weights, gradients and updater stay float32. ``"bf16"``
            (float32's range, no loss scaling) on CPUs (emulated on older ones: it saves memory more than time)
            and Ampere+ GPUs; ``"fp16"`` on GPUs without bf16 (V100, T4): a gradient scaler skips (never fails) a
            step whose gradients overflow, ``iteration`` still counts it, and its state is saved with the updater
            and in checkpoints (`torchspark.nn.precision`). Both masters and ``ParallelWrapper`` train at it.
            Example: ``Network(models.lenet(), precision="bf16")``.
        compile: ``torch.compile`` the forward pass: False (default), True (the default backend), a mode
            (``"max-autotune"``, ...) or a backend (``"aot_eager"``, ...). Helps on GPU and for larger models; each
            worker replica's first step pays the compilation. See `torchspark.nn.compiled`.
    Raises:
        ConfigError: a knob out of range (the message names it and the fix), a module without parameters.

    Example: ``Network(models.mlp(64, 32, 10), updater=optim.Adam(lr=1e-3), seed=0).fit(DataSet(x, y), epochs=2)``.
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
        precision: str = "fp32",
        compile: bool | str = False,
        lr_scheduler: LrSchedulerLike | None = None,
        lr_scheduler_interval: str | None = None,
    ) -> None:
        check_choice("memory_format", memory_format, MEMORY_FORMATS)
        check_float("weight_decay", weight_decay, minimum=0, finite=True)
        check_float("l1", l1, minimum=0, finite=True, fix="1e-5..1e-4 is a common start")
        check_float("gradient_clip", gradient_clip, above=0, finite=True, allow_none=True)
        check_int("seed", seed, allow_none=True)
        self.compile = check_compile(compile)
        self.seed = seed
        self.weight_decay = float(weight_decay)
        self.l1 = float(l1)
        self.gradient_clip = None if gradient_clip is None else float(gradient_clip)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.memory_format = memory_format
        self.precision = precision
        #: the autocast dtype and (fp16) the gradient scaler of ``precision`` (validates it)
        self.amp = Precision(precision, self.device)
        self.module = build_module(module, seed).to(self.device)
        if memory_format == "channels_last":
            # the stubs lack Module.to(memory_format=...), which torch documents and implements
            self.module = self.module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        #: what the forward pass calls: the module, or its compiled form (which uses the module's own parameters)
        self.forward_module = forward_module(self.module, self.compile)
        self.losses: list[Loss] = resolve_losses(as_list(loss))
        self.updater = resolve_updater(updater if updater is not None else SGD(lr=0.01))
        self._state = FlatState(self.module, memory_format == "channels_last", self._make_optimizer)
        #: the parameters (each one's data a view into the flat buffer) and that buffer, as the step reads them
        self._params: list[torch.nn.Parameter] = self._state.parameters
        self._flat = self._state.flat
        self.optimizer = self._state.optimizer
        self.lr_scheduler, self.lr_scheduler_interval = lr_scheduler, lr_scheduler_interval
        #: the schedule brought to the counters before each step (`torchspark.nn.lr_scheduler`; None: a fixed rate)
        self.lr_scheduling = make_lr_scheduling(lr_scheduler, lr_scheduler_interval, self.optimizer, self.updater)
        self.iteration = 0
        self.epoch = 0
        self.last_score = float("nan")
        #: Tensors that training masters attach to the model (gradient-sharing residuals, threshold state);
        #: saved with the model and restored by [`load`][torchspark.Network.load].
        self.extra_state: dict[str, torch.Tensor] = {}
        #: JSON-serialisable companions of [`extra_state`][torchspark.Network.extra_state].
        self.extra_config: dict[str, Any] = {}

    # ------------------------------------------------------------------ construction (see torchspark.nn.construction)
    def _make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return build_optimizer(self.updater, params, self.weight_decay)

    # ------------------------------------------------------------------ flat views (see FlatState)
    def num_params(self) -> int:
        """Number of trainable scalars (the length of [`params`][torchspark.Network.params])."""
        return self._state.num_params()

    def params(self) -> torch.Tensor:
        """A 1-D copy of all parameters, in ``module.parameters()`` order."""
        return self._state.params()

    def params_view(self) -> torch.Tensor:
        """The live flat parameter buffer (no copy). Writes change the network; use with care."""
        return self._flat

    def set_params(self, flat: torch.Tensor) -> None:
        """Overwrite all parameters from a 1-D tensor of length [`num_params`][torchspark.Network.num_params]."""
        self._state.set_params(flat)

    def updater_state_tensors(self) -> list[torch.Tensor]:
        """The live optimizer state tensors, in [`updater_state`][torchspark.Network.updater_state] order (no copy; writes change the updater)."""
        return self._state.updater_state_tensors()

    def updater_state_size(self) -> int:
        """Length of [`updater_state`][torchspark.Network.updater_state] (0 for plain SGD)."""
        return self._state.updater_state_size()

    def updater_state(self) -> torch.Tensor:
        """All optimizer state as one float32 1-D tensor, in a stable order (zeros before the first step)."""
        return self._state.updater_state()

    def set_updater_state(self, flat: torch.Tensor) -> None:
        """Overwrite all optimizer state from [`updater_state`][torchspark.Network.updater_state] output."""
        self._state.set_updater_state(flat)

    def reset_updater_state(self) -> None:
        """Put the optimizer state back as before the first step (zeros, or where an optimizer starts elsewhere)."""
        self._state.reset_updater_state()

    def buffer_tensors(self) -> list[torch.Tensor]:
        """The live floating-point buffers (BatchNorm running mean/var), which training masters average with the
        parameters; integer ones are not among them (see `buffer_tensors`)."""
        return self._state.buffer_tensors()

    def buffer_size(self) -> int:
        """Length of [`buffers`][torchspark.Network.buffers] (0 for modules without floating-point buffers)."""
        return self._state.buffer_size()

    def buffers(self) -> torch.Tensor:
        """All floating-point buffers as one float32 1-D copy (empty when the module has none)."""
        return self._state.buffers()

    def set_buffers(self, flat: torch.Tensor) -> None:
        """Overwrite the floating-point buffers from [`buffers`][torchspark.Network.buffers] output."""
        self._state.set_buffers(flat)

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Every buffer by name, integer ones included, as CPU copies (what a worker hands back to the driver)."""
        return self._state.buffer_state()

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy [`buffer_state`][torchspark.Network.buffer_state] output into this network's buffers (names it does not have are ignored)."""
        self._state.load_buffer_state(state)

    # ------------------------------------------------------------------ forward / loss (see torchspark.nn.forward)
    def _batch_loss(self, batch: Batch, validate: bool) -> tuple[torch.Tensor, int]:
        """``(mean loss, examples)`` of one labelled batch, with its autograd graph (what [`train_step`][torchspark.Network.train_step]
        differentiates)."""
        return batch_loss(self, batch, validate)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: Batch, validate: bool = False) -> float:
        """One minibatch: forward (under ``precision``'s autocast), backward, optional clipping, one updater step
        (fp16: unless its scaler skips it). Returns the loss."""
        self._state.clear_grads()
        value, _ = self._forward_backward(batch, validate)
        self._optimizer_step(value, (batch,))
        self.iteration += 1
        self.last_score = value
        return value

    def train_group(self, batches: Sequence[Batch], validate: bool = False) -> float:
        """One updater step over several micro-batches (gradient accumulation): the step one batch of all their
        examples would take (the gradient of their example-weighted mean loss; equal to it up to float rounding
        with SGD and no BatchNorm, which sees each micro-batch's statistics), holding one micro-batch's activations
        at a time. Use it when the batch you want does not fit in memory (``accumulate_steps`` of [`fit`][torchspark.Network.fit] and the
        masters). Label masks weigh a micro-batch by its examples. ``validate`` checks the first one's features.
        Returns the example-weighted mean loss; the iteration counter advances by one.
        """
        if len(batches) == 1:
            return self.train_step(batches[0], validate)
        total = sum(len(b) for b in batches)
        if total == 0:
            raise DataError("train_group needs at least one micro-batch with examples, got none")
        self._state.clear_grads()
        loss_sum = 0.0
        for i, batch in enumerate(batches):
            value, n = self._forward_backward(batch, validate and i == 0, loss_scale=len(batch) / total)
            loss_sum += value * n
        value = loss_sum / total
        self._optimizer_step(value, batches)
        self.iteration += 1
        self.last_score = value
        return value

    def _forward_backward(self, batch: Batch, validate: bool, loss_scale: float = 1.0) -> tuple[float, int]:
        """Forward and backward of one minibatch, its gradients (of ``loss * loss_scale``; fp16: also times the
        scaler's scale) added to ``.grad``; returns ``(loss, examples)``.

        Raises:
            TrainingError: the loss is not finite (bad features, or the updater diverged).
        """
        self.module.train()
        loss, examples = self._batch_loss(batch, validate)
        value = float(loss.detach())
        if not math.isfinite(value):
            try:
                batch.check_finite("training features")
            except DataError as e:
                raise TrainingError(f"loss is {value} at iteration {self.iteration}: {e}") from e
            hint = " under precision='fp16' (activations over 65504 overflow; try 'bf16')" if self.amp.scaler else ""
            raise TrainingError(diverged_message(f"loss turned {value}{hint}", self.iteration, self.updater))
        self.amp.backward(loss if loss_scale == 1.0 else loss * loss_scale)
        return value, examples

    def _optimizer_step(self, loss: float, batches: Sequence[Batch]) -> bool:
        """Unscale (fp16), check the gradient, clip, l1, the learning rate of this step, the updater's step, zero
        the gradients. Returns whether the step was taken (False: fp16's scaler skipped it for inf/NaN gradients).

        Raises:
            NonFiniteGradient: a gradient entry is NaN or inf (not under fp16, whose scaler skips those steps);
                the gradients are cleared and the updater and its state are left as they were.
        """
        self.amp.unscale(self.optimizer)
        if self.amp.scaler is None:
            check_gradient(self._params, loss, self.iteration, batches, self._state.clear_grads)
        if self.gradient_clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params, self.gradient_clip)
        if self.l1:
            self._add_l1_gradient()
        self._apply_lr_schedule()
        taken = self.amp.step(self.optimizer)
        self._state.clear_grads()
        return taken

    def _add_l1_gradient(self) -> None:
        """grad += l1 * sign(w): the gradient of ``l1 * sum(|w|)`` (0 at w = 0, as autograd's abs)."""
        with torch.no_grad():
            for p in self._params:
                if p.grad is not None:
                    p.grad.add_(torch.sign(p), alpha=self.l1)

    def _apply_lr_schedule(self) -> None:
        """Set the optimizer's learning rate for this step from the schedule at the counters (no-op for a fixed
        rate; see `torchspark.nn.lr_scheduler`)."""
        if self.lr_scheduling is not None:
            self.lr_scheduling.sync(self.iteration, self.epoch)

    def current_lr(self) -> float:
        """The learning rate the next step will use (the first parameter group's, the schedule's at the counters)."""
        self._apply_lr_schedule()
        return float(self.optimizer.param_groups[0]["lr"])

    def compute_update(self, batch: Batch | Sequence[Batch], validate: bool = False) -> torch.Tensor:
        """The step the updater would take on ``batch`` (``params_before - params_after``), without taking it.

        ``batch`` may be a group of micro-batches (one accumulated step, [`train_group`][torchspark.Network.train_group]). The updater's own
        state (momentum, Adam moments) does advance, as it would on a real step. This is what gradient sharing
        encodes; [`apply_update`][torchspark.Network.apply_update] applies such a step.
        """
        before = self._flat.detach().clone()
        self.train_group(as_group(batch), validate)
        with torch.no_grad():
            update = before - self._flat
            self._flat.copy_(before)
        return update

    def apply_update(self, update: torch.Tensor) -> None:
        """``params -= update`` (a flat tensor of length [`num_params`][torchspark.Network.num_params])."""
        self._state.apply_update(update)

    def apply_update_at(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """``params[indices] -= values``: [`apply_update`][torchspark.Network.apply_update] of an update that is zero except at ``indices``
        (unique int64 indices). Bit-identical to it (``x - 0`` is ``x``), but touches only those elements."""
        self._state.apply_update_at(indices, values)

    def fit(
        self, data: Batch | Iterable[Batch], epochs: int = 1, batch_size: int = 32, accumulate_steps: int = 1
    ) -> Network:
        """Train on one process.

        Args:
            data: a DataSet/MultiDataSet (split into minibatches of ``batch_size``, in order) or an iterable of
                them (used as they come; must be re-iterable, such as a list, when ``epochs > 1``); or a torch
                ``DataLoader``, ``Dataset`` or ``IterableDataset`` (tensor, tuple or dict batches: `torchspark.data.torchdata`).
                Floating-point features are cast to the parameters' dtype (numpy's float64 default trains a float32
                network); integer features are passed as they are (token ids for an embedding).
            epochs: passes over the data.
            batch_size: minibatch size when ``data`` is a single DataSet/MultiDataSet or a torch ``Dataset``.
            accumulate_steps: minibatches per updater step (gradient accumulation, [`train_group`][torchspark.Network.train_group]): the
                step of ``accumulate_steps * batch_size`` examples with the memory of one minibatch. 1 (default)
                steps after every minibatch; an epoch whose minibatch count is not a multiple ends with a shorter
                group. The iteration counter counts updater steps.
        Returns:
            self, trained.
        """
        check_int("epochs", epochs, 1)
        check_int("accumulate_steps", accumulate_steps, 1, fix="1 steps after every minibatch")
        if epochs > 1 and not isinstance(data, (DataSet, MultiDataSet, *TORCH_DATA)) and iter(data) is data:
            raise ConfigError("data is a one-shot iterator but epochs > 1; pass a list or a DataSet instead")
        for _ in range(epochs):
            seen = 0
            for group in group_batches(iterate_minibatches(data, batch_size), accumulate_steps):
                self.train_group(as_group(group), validate=(seen == 0))
                seen += 1
            if seen == 0:
                raise DataError(
                    "fit got no data: the DataSet or iterable is empty (0 examples); pass data with at "
                    "least one example"
                )
            self.epoch += 1
        return self

    # ------------------------------------------------------------------ inference and scoring
    def output(
        self, features: Tensors | Any, train: bool = False, batch_size: int | None = None, non_finite: str = "error"
    ) -> Any:
        """Network outputs with the loss's output activation (softmax / sigmoid / identity), as a CPU tensor (a tuple
        for several outputs); ``batch_size`` evaluates in chunks. An example with NaN/inf features is a DataError
        (``non_finite="error"``, default) or gets NaN outputs (``"null"``). See
        `torchspark.nn.inference.output`."""
        return inference.output(self, features, train, batch_size, non_finite)

    def predict(self, data: Any, batch_size: int = 256, output: str = "probabilities") -> Any:
        """Outputs (``"probabilities"``, as [`output`][torchspark.Network.output]) or argmax ``"class"`` per example of any
        data [`fit`][torchspark.Network.fit] takes (labels ignored). See `torchspark.nn.inference.predict`."""
        return inference.predict(self, data, batch_size, output)

    def batch_losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(per_example_loss, weight)`` of one batch in the current mode, without gradients being required:
        the loss summed over outputs per example, and each example's weight (0 where every label is masked)."""
        return inference.batch_losses(self, batch)

    def score_examples(self, data: Batch | Iterable[Batch], batch_size: int = 256) -> torch.Tensor:
        """Per-example loss (summed over outputs), in data order, as a 1-D CPU tensor."""
        return inference.score_examples(self, data, batch_size)

    def score(self, data: Batch | Iterable[Batch], batch_size: int = 256) -> float:
        """Mean loss over all examples (label-masked examples excluded)."""
        return inference.score(self, data, batch_size)

    def default_evaluation(self, output_index: int = 0) -> Any:
        """The evaluation that fits the loss of output ``output_index``: classification, binary or regression."""
        return default_evaluation(self, output_index)

    def evaluate(
        self, data: Batch | Iterable[Batch], *evaluations: Any, batch_size: int = 256, output_index: int | None = None
    ) -> Any:
        """Fill evaluations with this network's outputs on ``data``: the given ones from output ``output_index``
        (0 when None), else the one that fits the loss (one per output, as a list, for a network with one loss per
        output and ``output_index=None``). See `torchspark.nn.outputs.evaluate`."""
        return evaluate(self, data, evaluations, batch_size, output_index)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str, save_updater: bool = True, allow_pickle: bool = False) -> str:
        """Save to a directory (any fsspec URL): ``config.json``, ``weights.safetensors``, ``updater.safetensors``.

        Never pickled by default: a module of yours is written as its class's import path and the arguments
        [`torchspark.nn.capture`][torchspark.nn.capture] recorded (``config.json``'s ``module.rebuild`` says
        whether a load can rebuild it; else load with ``module=``). A callable loss or updater needs
        ``allow_pickle=True`` (and then loads only with it).
        """
        return save_network(self, path, save_updater=save_updater, allow_pickle=allow_pickle)

    @classmethod
    def load(
        cls, path: str, allow_pickle: bool = False, factories: Any = None, trust_code: bool = False, module: Any = None
    ) -> Network:
        """Load a network written by [`save`][torchspark.Network.save].

        No code runs because a file names it: ``config.json`` may name torchspark's zoo models and built-in
        losses; a class, factory or loss of yours must be passed (``factories=[MyNet]``) or the file trusted as code
        (``trust_code=True``); ``module=MyNet(...)`` loads into a module you built, importing nothing. See
        [`torchspark.nn.load_network`][torchspark.nn.load_network].
        """
        return read_network(cls, path, allow_pickle, factories, trust_code, module)

    def copy(self) -> Network:
        """A deep copy with the same weights, updater state and counters (through the in-memory blueprint)."""
        return Blueprint.of(self).build_as(type(self))

    def __deepcopy__(self, memo: dict[int, Any]) -> Network:
        """``copy.deepcopy(net)`` is [`copy`][torchspark.Network.copy]: a field-by-field deep copy would give the module parameters their
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
