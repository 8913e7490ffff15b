"""One worker's gradient-sharing state for a fit, and how it starts, checkpoints and persists.

`SharingState` holds the residual and threshold state (the encoder's memory) and the fit's traffic counters.
Both sharing algorithms build it with `start_state`, write it into checkpoints with `cut_state` and read
it back with `restore_state`. At the end of a fit the residuals and the averaged threshold state persist in
``net.extra_state`` under `RESIDUAL_KEY`, `THRESHOLD_KEY` and `WORLD_KEY`, and the next fit
starts from them.

Example::

    state = start_state(settings, net, comm)   # residual and threshold of a previous fit, when net has them
    tensors, record = cut_state(state, None)   # this rank's part of a checkpoint
    restore_state(state, tensors, record)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from torchspark.encoding import EncoderState, ThresholdState
from torchspark.encoding.compressor import Compressor, ThresholdCompressor
from torchspark.errors import TrainingError
from torchspark.nn import Network
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.comm import Communicator

__all__ = [
    "SharingAlgorithmBase",
    "SharingState",
    "RESIDUAL_KEY",
    "THRESHOLD_KEY",
    "WORLD_KEY",
    "restore_residual",
    "start_state",
    "cut_state",
    "restore_state",
]

#: ``extra_state`` keys: ``RESIDUAL_KEY.format(rank=r)`` per rank, the averaged threshold state, the world size.
RESIDUAL_KEY = "sharing.residual.{rank}"
THRESHOLD_KEY = "sharing.threshold_state"
WORLD_KEY = "sharing.world_size"


@dataclass
class SharingState:
    """One worker's gradient-sharing state for a fit (mutable: replaced encoder states are stored back here).

    Attributes:
        encoder: residual + threshold state.
        bytes_sent: payload bytes this worker handed to the exchange (flag byte included) in this fit.
        dense_bytes: what dense float32 exchange of the same updates would have sent (``4 * num_params`` each).
        steps: updates encoded in this fit.
        start_threshold: the threshold the fit started from (calibrated, restored or configured; None until known).
        pending_payload: a payload encoded but not yet exchanged when a checkpoint was taken (``overlap=True``);
            set by `restore_state`, exchanged first by the next epoch.
        divergence: the first divergence message of this fit on this worker (``on_divergence="warn"``), or None.
        skipped_steps: steps this worker skipped because their gradient was not finite (``on_divergence="warn"``).
        step_buffers: ``(before, update)``, two parameter-sized buffers reused by every step (see
            `step_into_residual`); None until the first step.
        residual_views: ``(residual, views)``: the residual cut into one view per parameter, for
            `train_step_into` (rebuilt when the residual
            tensor changes); None until the first direct step.
        param_norm: the parameters' norm for the divergence check, refreshed every
            `PARAM_NORM_EVERY` steps of the direct path (None
            until the first).
        overlap_via: how the last epoch overlapped its exchange (``extra_config["sharing.overlap_via"]``):
            ``"shared_memory"`` (every worker on one host: posted gathers, no exchange thread), ``"thread"`` (the
            exchange thread) or ``"off"`` (``overlap=False``).
    """

    encoder: EncoderState
    bytes_sent: int = 0
    dense_bytes: int = 0
    steps: int = 0
    start_threshold: float | None = None
    pending_payload: bytes | None = None
    divergence: str | None = None
    #: steps this worker skipped because their gradient was not finite (``on_divergence="warn"``)
    skipped_steps: int = 0
    #: the bounded-staleness loop's counters (`StaleStats`),
    #: else None
    staleness: Any = None
    step_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    residual_views: tuple[torch.Tensor, list[torch.Tensor]] | None = None
    param_norm: float | None = None
    #: how the last epoch overlapped its exchange: "shared_memory" (posted gathers), "thread" or "off"
    overlap_via: str | None = None
    #: the fit's codec (`Compressor`); None: threshold encoding with ``encoder.config``
    codec: Compressor | None = None

    @property
    def compressor(self) -> Compressor:
        """The codec that encodes this worker's steps and decodes every worker's messages."""
        return ThresholdCompressor(self.encoder.config) if self.codec is None else self.codec


def restore_residual(
    extra_state: dict[str, torch.Tensor], rank: int, world_size: int, length: int, device: torch.device | str
) -> torch.Tensor:
    """This rank's starting residual from a previous fit's ``extra_state`` (zeros when there is none).

    Same world size as saved: rank ``r`` gets ``sharing.residual.<r>``. Different world size: rank 0 gets the sum of
    all saved residuals and the others zeros, so the total unsent update mass is preserved (it is what the whole
    group still owes the parameters, whoever sends it).

    Raises:
        TrainingError: a saved residual does not have ``length`` elements (the state belongs to another model).
    """
    residual = torch.zeros(length, dtype=torch.float32, device=device)
    if WORLD_KEY not in extra_state:
        return residual
    saved_world = int(extra_state[WORLD_KEY].reshape(-1)[0])
    saved = [extra_state[k] for k in (RESIDUAL_KEY.format(rank=r) for r in range(saved_world)) if k in extra_state]
    for t in saved:
        if t.numel() != length:
            raise TrainingError(
                f"a saved gradient-sharing residual has {t.numel()} elements but the network has "
                f"{length} parameters; remove the 'sharing.*' entries from net.extra_state"
            )
    with torch.no_grad():
        if saved_world == world_size:
            key = RESIDUAL_KEY.format(rank=rank)
            if key in extra_state:
                residual.copy_(extra_state[key].reshape(-1).to(device, torch.float32))
        elif rank == 0:
            for t in saved:
                residual.add_(t.reshape(-1).to(device, torch.float32))
    return residual


def start_state(settings: SharingSettings, net: Network, comm: Communicator) -> SharingState:
    """Per-fit state: the residual and threshold state of a previous fit when ``net.extra_state`` has them.

    The threshold state is the averaged one of the previous fit, except with [`FixedThreshold`][torchspark.encoding.FixedThreshold] (stateless:
    the configured value wins) or when that fit never calibrated one (then the policy's initial state, calibrated
    in the first epoch for a calibrated start). Residuals: see `restore_residual`.
    """
    residual = restore_residual(net.extra_state, comm.rank, comm.world_size, net.num_params(), net.device)
    saved = (
        ThresholdState.from_tensor(net.extra_state[THRESHOLD_KEY].cpu()) if THRESHOLD_KEY in net.extra_state else None
    )
    codec = settings.compressor()
    encoder = codec.start(residual, saved)
    return SharingState(
        encoder, start_threshold=encoder.threshold_state.threshold, codec=None if settings.codec is None else codec
    )


def cut_state(state: SharingState, pending: bytes | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's part of a checkpoint: its residual and threshold state (tensors), its traffic counters (record),
    and ``pending``, a payload encoded but not yet exchanged at the cut (``overlap=True``), when given."""
    tensors = {"residual": state.encoder.residual, "threshold_state": state.encoder.threshold_state.to_tensor()}
    if pending is not None:
        tensors["pending"] = torch.frombuffer(bytearray(pending), dtype=torch.uint8)
    record = {
        "bytes_sent": state.bytes_sent,
        "dense_bytes": state.dense_bytes,
        "steps": state.steps,
        "skipped_steps": state.skipped_steps,
        "start_threshold": state.start_threshold,
    }
    return tensors, record


def restore_state(state: SharingState, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
    """Inverse of `cut_state`, applied to the state `start_state` returned."""
    with torch.no_grad():
        state.encoder.residual.copy_(tensors["residual"].reshape(-1).to(state.encoder.residual.device))
    state.encoder = replace(state.encoder, threshold_state=ThresholdState.from_tensor(tensors["threshold_state"]))
    state.bytes_sent = int(record.get("bytes_sent", 0))
    state.dense_bytes = int(record.get("dense_bytes", 0))
    state.steps = int(record.get("steps", 0))
    state.skipped_steps = int(record.get("skipped_steps", 0))
    state.start_threshold = record.get("start_threshold")
    pending = tensors.get("pending")
    state.pending_payload = bytes(pending.numpy().tobytes()) if pending is not None else None


@dataclass(frozen=True)
class SharingAlgorithmBase:
    """What the synchronous and the bounded-staleness sharing algorithms share: their settings, per-fit state
    (`start_state`) and this rank's checkpoint state (`cut_state` / `restore_state`); each
    subclass brings its own ``epoch`` and ``finish``."""

    settings: SharingSettings

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SharingAlgorithmBase:
        return cls(SharingSettings.from_dict(settings))

    def to_dict(self) -> dict[str, Any]:
        return self.settings.to_dict()

    def start(self, net: Network, comm: Communicator) -> SharingState:
        """Per-fit state (`start_state`)."""
        return start_state(self.settings, net, comm)

    def rank_state(self, state: SharingState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's part of a checkpoint: its residual and threshold state (tensors), its traffic counters."""
        return cut_state(state, None)

    def restore(
        self, state: SharingState, net: Network, tensors: dict[str, torch.Tensor], record: dict[str, Any]
    ) -> None:
        """Inverse of `rank_state` (and of a cut's state with its pending payload)."""
        restore_state(state, tensors, record)
