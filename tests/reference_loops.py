"""Reference loops of the distributed algorithms, a few lines each, that the distributed runs must reproduce, and
the reference exchanges of gradient sharing (the plain all-gather + dense decode the training loop's exchanges
must equal)."""

from __future__ import annotations

import itertools

import torch

from torchspark import DataSet, Network
from torchspark.encoding import (
    EncodedUpdate,
    EncoderConfig,
    EncoderState,
    agree_threshold,
    decode_sum,
    encode_step,
    local_calibration,
    with_calibration,
)
from torchspark.training.algorithms.sharing.fused import can_step_into, train_step_into
from torchspark.training.algorithms.sharing.rounds import Round, dense_sum, parse_gathered, round_from_gathered
from torchspark.training.comm import Communicator


def gather_messages(comm: Communicator, payload: bytes, length: int) -> tuple[int, list[EncodedUpdate]]:
    """Step 3: all-gather the payloads; returns the number of active workers and their messages in rank order."""
    return parse_gathered(comm.all_gather_bytes(payload), length)


def dense_exchange(comm: Communicator, payload: bytes, length: int, device: torch.device | str) -> Round:
    """Steps 3 + 4a, the reference: gather every worker's payload and decode the messages, in rank order, into one
    dense sum (what the training loop's sparse and sharded exchanges must apply bit for bit)."""
    active, messages = gather_messages(comm, payload, length)
    return Round(active, dense_sum(messages, length, device))


def sparse_exchange(comm: Communicator, payload: bytes, length: int, device: torch.device | str) -> Round:
    """The training loop's all-gather exchange in one call (its transport and its finish, as
    ``topology.exchange_phases("all_gather", ...)`` splits them): the sum kept at the union of the indices when
    every message is sparse."""
    return round_from_gathered(comm.all_gather_bytes(payload), length, device)


def sharing_reference(
    net: Network, shards: list[list[DataSet]], epochs: int, overlap: bool, encoder: EncoderConfig
) -> tuple[list[Network], list[EncoderState]]:
    """The algorithm in a few lines: W replicas, encode, decode all messages in rank order, apply (one step late
    with overlap). Returns the replicas and encoder states."""
    nets = [net.copy() for _ in shards]
    states = [EncoderState.create(encoder, net.num_params()) for _ in shards]
    for _ in range(epochs):
        pending = None
        for t in range(max(len(s) for s in shards)):
            steps = [nets[r].iteration for r in range(len(shards))]  # the workers' 0-based steps
            calibrating = t == 0 and not states[0].threshold_state.calibrated
            if calibrating or not can_step_into(net):
                updates = [
                    nets[r].compute_update(shard[t]) if t < len(shard) else None for r, shard in enumerate(shards)
                ]
            else:  # as the training loop does: the updater steps straight into the residual (encode_step(None))
                updates = [None] * len(shards)
                for r, shard in enumerate(shards):
                    if t < len(shard):
                        train_step_into(nets[r], states[r].residual, shard[t])
            if calibrating:  # calibrated start: agree on one threshold
                agreed = agree_threshold([local_calibration(u, s) for u, s in zip(updates, states)])
                states = [with_calibration(s, agreed) for s in states]
            messages = []
            for r, (shard, update) in enumerate(zip(shards, updates)):
                if t < len(shard):
                    message, states[r] = encode_step(update, states[r], steps[r])
                    messages.append(message)
            total = decode_sum(messages, torch.zeros(net.num_params()))
            if overlap:
                total, pending = pending, total
            for replica in nets:
                if total is not None:
                    replica.apply_update(total)
        for replica in nets:
            if pending is not None:
                replica.apply_update(pending)
    return nets, states


def averaging_reference(
    net: Network, shards: list[list[DataSet]], epochs: int, frequency: int, save_updater: bool
) -> Network:
    """Parameter averaging in a few lines: each replica fits up to ``frequency`` minibatches, then params (and the
    updater state when ``save_updater``, else it is zeroed) become the example-weighted mean. Returns replica 0."""
    nets = [net.copy() for _ in shards]
    for _ in range(epochs):
        streams = [iter(shard) for shard in shards]
        while True:
            weights = []
            for replica, stream in zip(nets, streams):
                batches = list(itertools.islice(stream, frequency))
                for batch in batches:
                    replica.train_step(batch)
                weights.append(float(sum(len(b) for b in batches)))
            total = sum(weights)
            if total == 0:
                break
            params = sum(r.params() * w for r, w in zip(nets, weights)) / total
            state = sum(r.updater_state() * w for r, w in zip(nets, weights)) / total
            for replica in nets:
                replica.set_params(params)
                if save_updater:
                    replica.set_updater_state(state)
                else:
                    replica.reset_updater_state()
    return nets[0]
