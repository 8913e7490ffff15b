"""Threshold gradient sharing as a DDP communication hook, and as an optimizer-side wrapper for loops without DDP.

The shape of PyTorch's PowerSGD hook: a state object ([`ThresholdHookState`][torchspark.ddp.ThresholdHookState])
and a hook ([`threshold_hook`][torchspark.ddp.threshold_hook]) that any ``DistributedDataParallel`` model registers::

    state = ThresholdHookState(model)                      # before or after wrapping it in DDP
    ddp_model.register_comm_hook(state, threshold_hook)

Per bucket and step, every rank adds its share of the mean gradient (``grad / world_size``) to its residual,
threshold-encodes it ([`encode_step`][torchspark.encoding.encode_step]: the adaptive threshold, residual clipping
and calibrated start of ``SharedTrainingMaster``, the same code), and all-gathers the message bytes (the wire
format of `torchspark.encoding.wire`): first every rank's ``(length, size)``, then the messages padded to the
largest size, which works on gloo and nccl alike. Every rank decodes every message in rank order into one sum,
which becomes the bucket's gradient: the gradients, and so the replicas, are bit-identical on every rank.

The residuals live in one flat float32 tensor in the order of the model's parameters (so DDP's rebuilding of its
buckets after the first step loses nothing), the threshold state per bucket. ``state_dict()`` holds both as tensors
(safetensors-able), ``load_state_dict()`` restores them.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from torchspark.encoding import (
    AdaptiveThreshold,
    EncoderConfig,
    EncoderState,
    ResidualClipping,
    ResidualPostProcessor,
    ThresholdPolicy,
    ThresholdState,
    agree_threshold,
    decode,
    encode_step,
    from_bytes,
    local_calibration,
    to_bytes,
    with_calibration,
)
from torchspark.errors import ConfigError, SetupError
from torchspark.validation import check_int

__all__ = ["ThresholdHookState", "threshold_hook", "ThresholdGradients"]


class ThresholdHookState:
    """What [`threshold_hook`][torchspark.ddp.threshold_hook] carries between steps: residuals, threshold states,
    the step counter and the traffic counters.

    Args:
        model: the model whose gradients are shared (the module itself or its ``DistributedDataParallel``
            wrapper); its parameters that require grad fix the residual's layout.
        process_group: the group to exchange in; None: the default group (``torch.distributed`` must be
            initialised).
        threshold_algorithm: how the threshold moves, as on ``SharedTrainingMaster`` (default
            [`AdaptiveThreshold`][torchspark.encoding.AdaptiveThreshold]: a calibrated start agreed by all ranks).
        residual_post_processor: default [`ResidualClipping`][torchspark.encoding.ResidualClipping].
        shake_frequency: every this many steps also flush residual entries above t/3 (0 = off).

    Attributes:
        bytes_sent: bytes this rank put on the wire (the size exchange and its padded message) since the start.
        dense_bytes: what this rank would have sent with a dense float32 all-reduce of the same gradients (4 bytes
            per element and step).
        iteration: steps completed (a step ends with the last bucket's hook).

    Raises:
        SetupError: ``torch.distributed`` is not initialised, or the ranks' models disagree in their parameters'
            shapes (checked here with one all-gather, so a mismatch fails fast instead of hanging or mixing
            unrelated parameters).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        process_group: dist.ProcessGroup | None = None,
        *,
        threshold_algorithm: ThresholdPolicy | None = None,
        residual_post_processor: ResidualPostProcessor | None = None,
        shake_frequency: int = 0,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise SetupError(
                "ThresholdHookState needs torch.distributed: call torch.distributed.init_process_group(...) "
                "(or run under torchspark.run / torchrun) before creating it"
            )
        check_int("shake_frequency", shake_frequency, 0, owner="ThresholdHookState", meaning="(0 = off)")
        self.process_group = process_group
        self.config = EncoderConfig(
            threshold_policy=threshold_algorithm if threshold_algorithm is not None else AdaptiveThreshold(),
            residual_post_processor=residual_post_processor
            if residual_post_processor is not None
            else ResidualClipping(),
            shake_frequency=shake_frequency,
        )
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("ThresholdHookState: the model has no parameter that requires grad; nothing to share")
        check_same_shapes(params, process_group)
        self._offsets: dict[int, tuple[int, int]] = {}
        offset = 0
        for p in params:
            self._offsets[id(p)] = (offset, p.numel())
            offset += p.numel()
        self.residual = torch.zeros(offset, dtype=torch.float32, device=params[0].device)
        self.thresholds: dict[int, ThresholdState] = {}
        self.iteration = 0
        self.bytes_sent = 0
        self.dense_bytes = 0
        self._layouts: dict[int, tuple[tuple[int, ...], int, torch.Tensor | None]] = {}

    @property
    def compression(self) -> float:
        """``dense_bytes / bytes_sent`` so far (0.0 before the first step)."""
        return self.dense_bytes / self.bytes_sent if self.bytes_sent else 0.0

    def threshold(self, bucket: int = 0) -> float | None:
        """The threshold bucket ``bucket`` encodes its next step with (None: not calibrated yet)."""
        state = self.thresholds.get(bucket)
        return state.threshold if state is not None else self.config.threshold_policy.initial_state().threshold

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as tensors (safetensors-able): ``residual`` (flat, model parameter order),
        ``threshold.<bucket>`` (``[threshold, last_sparsity]``, NaN for none) and ``counters``
        (``[iteration, bytes_sent, dense_bytes]``)."""
        out = {"residual": self.residual.detach().cpu().clone()}
        for index, state in self.thresholds.items():
            out[f"threshold.{index}"] = state.to_tensor()
        out["counters"] = torch.tensor([self.iteration, self.bytes_sent, self.dense_bytes], dtype=torch.int64)
        return out

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what [`state_dict`][torchspark.ddp.ThresholdHookState.state_dict] returned.

        Raises:
            ConfigError: a tensor is missing, or the residual belongs to a model of another size.
        """
        missing = {"residual", "counters"} - set(tensors)
        if missing:
            raise ConfigError(
                f"hook state is missing {sorted(missing)}; pass what ThresholdHookState.state_dict() returned"
            )
        residual = tensors["residual"].reshape(-1)
        if residual.numel() != self.residual.numel():
            raise ConfigError(
                f"the saved residual has {residual.numel()} elements but this model has {self.residual.numel()} "
                "trainable parameters; load the hook state saved with this model"
            )
        with torch.no_grad():
            self.residual.copy_(residual.to(self.residual.device, torch.float32))
        self.thresholds = {
            int(key.split(".", 1)[1]): ThresholdState.from_tensor(value)
            for key, value in tensors.items()
            if key.startswith("threshold.")
        }
        self.iteration, self.bytes_sent, self.dense_bytes = (int(v) for v in tensors["counters"].tolist())

    def _bucket_residual(
        self, index: int, params: Sequence[torch.Tensor], length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This bucket's residual: a view of the flat residual when its parameters lie there in order, else a
        gathered copy and the indices to scatter it back to (DDP's buckets run in reverse parameter order)."""
        key = tuple(id(p) for p in params)
        layout = self._layouts.get(index)
        if layout is None or layout[0] != key:  # the first step, or DDP rebuilt its buckets
            spans = []
            for p in params:
                if id(p) not in self._offsets:
                    raise ConfigError(
                        "threshold_hook: a bucket holds a parameter ThresholdHookState does not know; create the "
                        "state from the model that DistributedDataParallel wraps"
                    )
                spans.append(self._offsets[id(p)])
            if sum(n for _, n in spans) != length:
                raise ConfigError(
                    f"threshold_hook: bucket {index} has {length} elements but its parameters "
                    f"{sum(n for _, n in spans)}; gradients must be dense tensors of the parameters' shapes"
                )
            contiguous = all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))
            gather = None if contiguous else torch.cat([torch.arange(o, o + n) for o, n in spans])
            layout = (key, spans[0][0], None if gather is None else gather.to(self.residual.device))
            self._layouts[index] = layout
        _, start, gather = layout
        if gather is None:
            return self.residual[start : start + length], None
        return self.residual[gather], gather

    def share(self, index: int, flat: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
        """Replace the flat local gradient ``flat`` (a bucket's) by the decoded sum of every rank's threshold-encoded
        share of the mean gradient, in place, and return it. A collective: every rank calls it for the same
        buckets in the same order. ``params``: the parameters whose gradients ``flat`` holds, in order."""
        residual, gather = self._bucket_residual(index, params, flat.numel())
        threshold_state = self.thresholds.get(index) or self.config.threshold_policy.initial_state()
        encoder = EncoderState(self.config, residual, threshold_state)
        update = flat.detach().reshape(-1).to(torch.float32) / self.world_size
        if not threshold_state.calibrated:  # the first step: every rank starts from one agreed threshold
            encoder = with_calibration(encoder, self._agree(local_calibration(update, encoder), flat.device))
        message, encoder = encode_step(update, encoder, self.iteration)
        self.thresholds[index] = encoder.threshold_state
        if gather is not None:
            with torch.no_grad():
                self.residual[gather] = encoder.residual
        payload = b"" if message.format == "empty" else to_bytes(message)
        total = self._exchange(payload, flat.numel(), flat.device)
        with torch.no_grad():
            flat.copy_(total.reshape(flat.shape))
        self.dense_bytes += 4 * flat.numel()
        return flat

    def _agree(self, local: float | None, device: torch.device) -> float | None:
        value = torch.tensor([math.nan if local is None else local], dtype=torch.float64, device=device)
        gathered = [torch.empty_like(value) for _ in range(self.world_size)]
        dist.all_gather(gathered, value, group=self.process_group)
        return agree_threshold([float(v) for v in gathered])

    def _exchange(self, payload: bytes, length: int, device: torch.device) -> torch.Tensor:
        """All-gather every rank's message (sizes first, then the padded messages); their decoded sum, rank order."""
        sizes = torch.tensor([length, len(payload)], dtype=torch.int64, device=device)
        all_sizes = [torch.empty_like(sizes) for _ in range(self.world_size)]
        dist.all_gather(all_sizes, sizes, group=self.process_group)
        rows = [tuple(int(v) for v in s.tolist()) for s in all_sizes]
        lengths = sorted({n for n, _ in rows})
        if len(lengths) > 1:
            raise SetupError(
                f"threshold_hook: the ranks' gradients disagree in size ({[n for n, _ in rows]} elements by rank); "
                "every rank must build the same model (same layers, same shapes) and register the hook on it"
            )
        width = max(nbytes for _, nbytes in rows)
        self.bytes_sent += sizes.numel() * 8 + width
        total = torch.zeros(length, dtype=torch.float32, device=device)
        if width == 0:
            return total
        mine = torch.zeros(width, dtype=torch.uint8, device=device)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self.process_group)
        for (_, nbytes), data in zip(rows, gathered):
            if nbytes:
                decode(from_bytes(data[:nbytes].cpu().numpy().tobytes()), total)
        return total


def threshold_hook(state: ThresholdHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: threshold-encoded gradient sharing with residuals (see the module docstring).

    Register with ``ddp_model.register_comm_hook(state, threshold_hook)``. The returned future holds the bucket's
    new gradient: the mean gradient as threshold sharing transmits it, identical on every rank."""
    buffer = bucket.buffer()
    state.share(bucket.index(), buffer, list(bucket.parameters()))
    if bucket.is_last():
        state.iteration += 1
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


class ThresholdGradients:
    """Threshold gradient sharing for a loop without DDP: call [`synchronize`][torchspark.ddp.ThresholdGradients.synchronize]
    between ``loss.backward()`` and ``optimizer.step()``::

        sharing = ThresholdGradients(model)         # broadcasts rank 0's parameters, as DDP does
        loss.backward()
        sharing.synchronize()                       # every rank's .grad: the same decoded mean gradient
        optimizer.step()

    Args:
        model: the model (every rank builds the same one).
        process_group, threshold_algorithm, residual_post_processor, shake_frequency: as for
            [`ThresholdHookState`][torchspark.ddp.ThresholdHookState], which ``self.state`` is (one bucket: every
            parameter).
    """

    def __init__(self, model: torch.nn.Module, process_group: dist.ProcessGroup | None = None, **options: Any) -> None:
        self.state = ThresholdHookState(model, process_group, **options)
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(
                    tensor, src=dist.get_global_rank(process_group, 0) if process_group else 0, group=process_group
                )

    def synchronize(self) -> None:
        """Share this step's gradients (a collective: every rank calls it once per step). A parameter without a
        gradient counts as a zero gradient."""
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        self.state.share(0, flat, self.params)
        offset = 0
        for p in self.params:
            values = flat[offset : offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = values.clone()
            else:
                p.grad.copy_(values)
            offset += p.numel()
        self.state.iteration += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``self.state.state_dict()``."""
        return self.state.state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """``self.state.load_state_dict(tensors)``."""
        self.state.load_state_dict(tensors)


def check_same_shapes(params: Sequence[torch.Tensor], process_group: dist.ProcessGroup | None = None) -> None:
    """Raise SetupError unless every rank's ``params`` have the same shapes in the same order (one all-gather of a
    32-byte digest)."""
    digest = hashlib.sha256(struct.pack(f"<{len(params)}q", *(p.numel() for p in params)))
    for p in params:
        digest.update(repr(tuple(p.shape)).encode())
    mine = torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8).to(params[0].device)
    world = dist.get_world_size(process_group)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=process_group)
    differing = [r for r, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
    if differing:
        raise SetupError(
            f"the ranks' models disagree in their parameters' shapes (rank(s) {differing} differ from rank 0, "
            f"this rank has {sum(p.numel() for p in params)} trainable elements in {len(params)} tensors); every "
            "rank must build the same model before registering threshold sharing (same layers, sizes and seeds "
            "of any shape-dependent code)"
        )


# DDP checks the hook's annotations as objects (register_comm_hook), and this module's are strings (PEP 563)
threshold_hook.__annotations__ = {
    "state": ThresholdHookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
