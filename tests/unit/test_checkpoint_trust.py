"""Checkpoints are not trusted further than they are checked: damaged, planted or foreign checkpoints fall back to the
previous complete one or are refused with a clear error; a resume that would train differently is refused; the
storage is checked and the run locked before any worker starts (workers as threads, in one process)."""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
import subprocess
from functools import partial

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from helpers import onehot_rule_data
from interrupting import InterruptingMLP
from torchspark import Network, optim
from torchspark.errors import ConfigError, SerializationError, WorkerError
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner
from torchspark.training.checkpoint import acquire_run_lock, complete_checkpoints, store
from torchspark.training.checkpoint.lock import LOCK_FILE
from torchspark.training.driver.fit import build_task
from torchspark.training.driver.resume import resume_task
from torchspark.training.hooks import NullRecorder

_data = partial(onehot_rule_data, 192, seed=3)


def _net(after: int | None = None, lr: float = 0.01, dropout: float = 0.0) -> Network:
    return Network(
        InterruptingMLP(12, 16, 3, after=after, same_process=True, dropout=dropout), updater=optim.Adam(lr=lr), seed=0
    )


def _wrapper(net: Network, directory, workers: int = 2, **options) -> ParallelWrapper:
    return ParallelWrapper(
        net,
        num_workers=workers,
        averaging_frequency=3,
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        checkpoint_directory=str(directory),
        **options,
    )


def _two_checkpoints(tmp_path, **options) -> tuple[ParallelWrapper, list]:
    """A finished 2-epoch run ``r1`` with a checkpoint after each epoch."""
    wrapper = _wrapper(_net(), tmp_path, **options)
    wrapper.fit(_data(), epochs=2, batch_size=16, run_id="r1")
    found = complete_checkpoints(str(tmp_path), "r1")
    assert [c.manifest["fit_epoch"] for c in found] == [1, 2]
    return wrapper, found


def _resume(wrapper: ParallelWrapper, net: Network | None = None, epochs: int = 3):
    task = build_task(net or _net(), wrapper.master, epochs, False, NullRecorder(), run_id="r1")
    return resume_task(task)


def _edit_manifest(path: str, **changes) -> None:
    url = os.path.join(path, "manifest.json")
    manifest = json.loads(open(url).read())
    manifest.update(changes)
    with open(url, "w") as f:
        f.write(json.dumps(manifest))


def _edit_rank(path: str, which: int, tensors: dict | None = None, **meta_changes) -> None:
    url = os.path.join(path, f"rank-{which}.safetensors")
    blob = open(url, "rb").read()
    _, meta = store.read_rank_file(path, which)
    meta.update(meta_changes)
    data = {**st_load(blob), **(tensors or {})}
    with open(url, "wb") as f:
        f.write(st_save(data, {"torchspark.checkpoint": json.dumps(meta)}))


def _truncate(path: str, rank: int) -> None:
    url = os.path.join(path, f"rank-{rank}.safetensors")
    blob = open(url, "rb").read()
    with open(url, "wb") as f:
        f.write(blob[: len(blob) - 7])


def _flip(path: str, rank: int, tensor: str) -> None:
    """Flip one exponent bit of a float of ``tensor`` in rank ``rank``'s file: the tensor data, not the header."""
    url = os.path.join(path, f"rank-{rank}.safetensors")
    blob = bytearray(open(url, "rb").read())
    (n,) = struct.unpack("<Q", blob[:8])
    begin, end = json.loads(blob[8 : 8 + n])[tensor]["data_offsets"]
    at = 8 + n + begin + ((end - begin) // 8) * 4 + 3  # the high byte of a float32 in the middle
    blob[at] ^= 0x20
    with open(url, "wb") as f:
        f.write(blob)


def _fifo(path: str, name: str) -> None:
    os.remove(os.path.join(path, name))
    os.mkfifo(os.path.join(path, name), 0o600)


def _deep_manifest(path: str) -> None:
    url = os.path.join(path, "manifest.json")
    text = open(url).read()
    with open(url, "w") as f:
        f.write(text.replace('"settings": {', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "settings": {', 1))


def _nan_params(path: str) -> None:
    tensors, _ = store.read_rank_file(path, 0)
    _edit_rank(path, 0, {"params": torch.full_like(tensors["params"], float("nan"))})


DAMAGE = {
    "world_size=1e10": (lambda p: _edit_manifest(p, world_size=10**10), "world_size must be an integer in"),
    "world_size float": (lambda p: _edit_manifest(p, world_size=1e10), "world_size must be an integer in"),
    "fit_epoch=-5": (lambda p: _edit_manifest(p, fit_epoch=-5), "fit_epoch must be an integer in"),
    "manifest not JSON": (
        lambda p: open(os.path.join(p, "manifest.json"), "wb").write(b"\x00{garbage"),
        "manifest.json' is not valid JSON",
    ),
    "manifest without fit_epoch": (lambda p: _edit_manifest(p, fit_epoch=None), "fit_epoch must be an integer"),
    "truncated rank file": (lambda p: _truncate(p, 1), "rank-1.safetensors"),
    "flipped bit in rank 0's parameters": (
        lambda p: _flip(p, 0, "params"),
        "rank-0.safetensors' does not match the checksum written with it",
    ),
    "flipped bit in rank 1's updater state": (
        lambda p: _flip(p, 1, "updater_state"),
        "rank-1.safetensors' does not match the checksum written with it",
    ),
    "rank file replaced by a FIFO": (lambda p: _fifo(p, "rank-1.safetensors"), "is a FIFO (named pipe)"),
    "manifest replaced by a FIFO": (lambda p: _fifo(p, "manifest.json"), "is a FIFO (named pipe)"),
    "manifest nested 100,000 deep": (_deep_manifest, "manifest.json' nests lists or mappings deeper than 64 levels"),
    "rank file of another rank": (lambda p: _edit_rank(p, 1, rank=0), "rank must be an integer in [1, 1]"),
    "NaN parameters": (_nan_params, "non-finite (NaN/inf) parameters"),
    "group-writable (planted)": (lambda p: os.chmod(p, 0o777), "belongs to uid"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning_naming_it(
    tmp_path, caplog, damage
) -> None:
    wrapper, (older, newest) = _two_checkpoints(tmp_path)
    tamper, message = DAMAGE[damage]
    tamper(newest.path)
    with caplog.at_level(logging.WARNING, logger="torchspark.training.driver.resume"):
        task, point = _resume(wrapper)
    assert point is not None and point.path == older.path and point.fit_epoch == 1
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert os.path.basename(newest.path) in warned and message in warned, warned


def test_a_rank_reading_its_flipped_file_refuses_it(tmp_path) -> None:
    _, (_, newest) = _two_checkpoints(tmp_path)
    store.read_rank_file(newest.path, 1)  # intact: read
    _flip(newest.path, 1, "updater_state")
    with pytest.raises(SerializationError, match="rank-1.safetensors' does not match the checksum written with it"):
        store.read_rank_file(newest.path, 1)


def test_a_checkpoint_written_without_checksums_resumes_with_a_warning(tmp_path, caplog) -> None:
    wrapper, (_, newest) = _two_checkpoints(tmp_path)
    for rank in (0, 1):
        _edit_rank(newest.path, rank)  # rewritten as a torchspark before checksums wrote it: no checksum
    with caplog.at_level(logging.WARNING, logger="torchspark.training.checkpoint.store"):
        _, point = _resume(wrapper)
    assert point is not None and point.path == newest.path
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "rank-0.safetensors, rank-1.safetensors carry no checksum" in warned and newest.path in warned


def test_every_checkpoint_damaged_is_refused_naming_them_not_a_silent_fresh_start(tmp_path) -> None:
    wrapper, found = _two_checkpoints(tmp_path)
    for c in found:
        _edit_manifest(c.path, fit_epoch=-5)
    with pytest.raises(
        SerializationError, match=r"has checkpoints but none is usable.*step-0+4.*step-0+2.*refused: delete .*r1"
    ):
        _resume(wrapper)
    with pytest.raises(SerializationError, match="none is usable"):  # the fit itself: nothing trained, nothing pruned
        _wrapper(_net(), tmp_path).fit(_data(), epochs=3, batch_size=16, run_id="r1")
    assert [os.path.basename(c.path) for c in found] == sorted(
        n for n in os.listdir(tmp_path / "r1") if n.startswith("step-")
    )


def test_checkpoint_files_are_private_to_their_owner(tmp_path) -> None:
    _, found = _two_checkpoints(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "r1").st_mode) == 0o700
    for c in found:
        assert stat.S_IMODE(os.stat(c.path).st_mode) == 0o700
        for name in os.listdir(c.path):
            assert stat.S_IMODE(os.stat(os.path.join(c.path, name)).st_mode) == 0o600, name


def test_a_run_directory_another_can_write_is_refused_at_fit_start(tmp_path) -> None:
    os.makedirs(tmp_path / "r1")
    os.chmod(tmp_path / "r1", 0o777)  # as another user's planted run directory in a shared (1777) directory
    with pytest.raises(ConfigError, match="run directory .*r1.* is not trusted.*only you can write"):
        _wrapper(_net(), tmp_path).fit(_data(), epochs=1, batch_size=16, run_id="r1")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"lr": 0.02}, r"updater: .*0\.01.* then, .*0\.02.* now"),
        ({"rng_seed": 7}, "rng_seed: None then, 7 now"),
        ({"accumulate_steps": 2}, "accumulate_steps: 1 then, 2 now"),
    ],
)
def test_a_resume_with_another_updater_learning_rate_or_data_order_is_refused(tmp_path, change, match) -> None:
    wrapper, _ = _two_checkpoints(tmp_path)
    lr = change.pop("lr", 0.01)
    other = _wrapper(_net(), tmp_path, **change)
    with pytest.raises(ConfigError, match=f"written by a fit with other settings.*{match}.*new run_id"):
        _resume(other, _net(lr=lr))


def test_a_resume_with_another_shuffle_scope_is_refused(tmp_path) -> None:
    wrapper, _ = _two_checkpoints(tmp_path, rng_seed=3)
    _resume(_wrapper(_net(), tmp_path, rng_seed=3))  # the same order resumes
    with pytest.raises(ConfigError, match="shuffle_scope: 'worker' then, 'global' now"):
        _resume(_wrapper(_net(), tmp_path, rng_seed=3, shuffle_scope="global"))


def _interrupted(tmp_path) -> str:
    """Run ``r1`` stopped inside epoch 2 (each worker: 6 minibatches of 16 per epoch), cut after 3 of them."""
    with pytest.raises(WorkerError, match="worker stopped after 15 minibatches"):
        _wrapper(_net(after=15), tmp_path, checkpoint_every=1).fit(_data(), epochs=3, batch_size=16, run_id="r1")
    cut = complete_checkpoints(str(tmp_path), "r1")[-1]
    assert (cut.manifest["fit_epoch"], store.read_rank_file(cut.path, 0)[1]["done"]) == (2, 3)
    return cut.path


@pytest.mark.parametrize("batch_size", [32, 8])
def test_a_mid_epoch_resume_with_another_batch_size_is_refused(tmp_path, batch_size) -> None:
    _interrupted(tmp_path)
    with pytest.raises(
        WorkerError,
        match=r"cut after 3 minibatches of the 6 it had then in epoch 2, but this fit "
        r"gives the rank \d+ minibatches.*batch size changed",
    ):
        _wrapper(_net(), tmp_path, checkpoint_every=1).fit(_data(), epochs=3, batch_size=batch_size, run_id="r1")


def test_a_rank_record_claiming_more_done_than_the_epoch_has_is_refused(tmp_path) -> None:
    path = _interrupted(tmp_path)
    assert store.read_rank_file(path, 0)[1]["epoch_length"] == 6  # what the cut records of its epoch
    _edit_rank(path, 0, done=1000000)
    with pytest.raises(WorkerError, match="rank-0.safetensors.*cut after 1000000 minibatches.*gives the rank 6"):
        _wrapper(_net(), tmp_path, checkpoint_every=1).fit(_data(), epochs=3, batch_size=16, run_id="r1")


def test_the_ranks_commit_a_checkpoint_together(tmp_path, monkeypatch) -> None:
    """The manifest (what makes a checkpoint count) is written only once every rank's file is there, however slow
    a rank is to write: a fault right after a checkpoint then always finds it complete (the flaky
    test_parallel_resume[averaging] lost its newest checkpoint this way)."""
    import time

    real_rank, real_manifest = store.write_rank_file, store.write_manifest
    seen: list[bool] = []

    def slow_rank_1(path, rank, tensors, meta):
        if rank == 1:
            time.sleep(0.2)
        return real_rank(path, rank, tensors, meta)

    def manifest(path, record):
        seen.append(os.path.exists(os.path.join(path, "rank-1.safetensors")))
        return real_manifest(path, record)

    monkeypatch.setattr(store, "write_rank_file", slow_rank_1)
    monkeypatch.setattr(store, "write_manifest", manifest)
    _wrapper(_net(), tmp_path, checkpoint_every=2).fit(_data(), epochs=1, batch_size=16, run_id="r1")
    assert seen == [True]


def test_a_checkpoint_in_memory_storage_is_refused_when_workers_are_processes() -> None:
    wrapper = ParallelWrapper(
        _net(), num_workers=2, averaging_frequency=3, progress=False, checkpoint_directory="memory://ckpt"
    )
    with pytest.raises(
        ConfigError,
        match="checkpoint_directory='memory://ckpt': memory:// storage lives inside "
        "one process.*use a directory on disk",
    ):
        wrapper.fit(_data(), epochs=1, batch_size=16)


@pytest.mark.parametrize("where", ["file", "unwritable"])
def test_an_unusable_checkpoint_directory_is_found_at_fit_start(tmp_path, where) -> None:
    if where == "file":
        directory = tmp_path / "a-file"
        directory.write_text("not a directory")
    else:  # even root cannot create directories in /proc
        directory = "/proc/torchspark-checkpoints"
    net = _net(after=0)  # any minibatch trained would fail the fit with another error
    with pytest.raises(ConfigError, match="cannot create checkpoint run directory"):
        _wrapper(net, directory).fit(_data(), epochs=1, batch_size=16, run_id="r1")


def test_a_second_fit_of_a_running_run_is_refused_and_a_stale_lock_is_taken_over(tmp_path) -> None:
    lock = acquire_run_lock(str(tmp_path), "r1")  # as a fit of run r1 in progress
    try:
        with pytest.raises(ConfigError, match=f"run 'r1' is being trained by another fit \\(pid {os.getpid()} on"):
            _wrapper(_net(), tmp_path).fit(_data(), epochs=1, batch_size=16, run_id="r1")
    finally:
        lock.release()
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = {**lock.record, "pid": gone.pid, "start": None}
    (tmp_path / "r1" / LOCK_FILE).write_text(json.dumps(record))  # a driver killed with kill -9
    _wrapper(_net(), tmp_path).fit(_data(), epochs=1, batch_size=16, run_id="r1")
    assert not (tmp_path / "r1" / LOCK_FILE).exists()  # taken over, and released at the end


def test_dropout_draws_after_a_resume_what_the_uninterrupted_fit_drew(tmp_path) -> None:
    """One worker (its random stream is the process's own): a fit with dropout interrupted mid-epoch and resumed
    by run id from a differently seeded process state ends bit for bit where the uninterrupted fit ends."""
    data = _data()
    torch.manual_seed(11)
    reference = _net(dropout=0.5)
    _wrapper(reference, tmp_path / "ref", workers=1, checkpoint_every=1).fit(data, epochs=2, batch_size=16)
    torch.manual_seed(11)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        _wrapper(_net(after=16, dropout=0.5), tmp_path, workers=1, checkpoint_every=1).fit(
            data, epochs=2, batch_size=16, run_id="r1"
        )
    torch.manual_seed(12345)  # another process state: the resumed stream must come from the checkpoint
    resumed = _net(dropout=0.5)
    _wrapper(resumed, tmp_path, workers=1, checkpoint_every=1).fit(data, epochs=2, batch_size=16, run_id="r1")
    assert torch.equal(resumed.params(), reference.params())


def _zoo_net() -> Network:
    from torchspark.models import mlp

    return Network(mlp(n_in=4, hidden=8, n_out=3), updater=optim.Adam(lr=0.01), seed=0)


def _flip_bytes(url, count: int) -> None:
    """Flip ``count`` bytes of the tensor data of a safetensors file (its header stays intact)."""
    blob = bytearray(open(url, "rb").read())
    (n,) = struct.unpack("<Q", blob[:8])
    for i in range(count):
        blob[8 + n + (i * 7919) % (len(blob) - 8 - n)] ^= 0x01
    with open(url, "wb") as f:
        f.write(blob)


@pytest.mark.parametrize(
    "name, count", [("weights.safetensors", 100), ("weights.safetensors", 1), ("updater.safetensors", 1)]
)
def test_a_saved_network_with_flipped_bytes_is_refused_naming_the_file(tmp_path, name, count) -> None:
    net = _zoo_net()
    path = tmp_path / "model"
    net.save(str(path))
    _flip_bytes(path / name, count)
    with pytest.raises(SerializationError, match=f"{name}' does not match the checksum recorded when it was saved"):
        Network.load(str(path))


def test_a_saved_network_without_checksums_loads_with_a_warning(tmp_path, caplog) -> None:
    net = _zoo_net()
    path = tmp_path / "model"
    net.save(str(path))
    config = json.loads((path / "config.json").read_text())
    del config["checksums"]  # as a torchspark before checksums saved it
    (path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="torchspark.nn.portable"):
        loaded = Network.load(str(path))
    assert torch.equal(loaded.params(), net.params())
    assert "saved without checksums" in caplog.text and str(path) in caplog.text


def test_a_config_asking_for_a_network_far_larger_than_its_weights_is_refused_before_building(tmp_path) -> None:
    path = tmp_path / "model"
    _zoo_net().save(str(path))
    config = json.loads((path / "config.json").read_text())
    config["module"]["kwargs"]["hidden"] = 10**6  # 32 MB of weights asked of a file holding 268 bytes
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        SerializationError,
        match=r"config.json' describes a network whose weights take 32,000,012 bytes, but .*weights.safetensors' "
        r"holds 268 bytes of tensors.*refused before allocating",
    ):
        Network.load(str(path))


def test_a_saved_network_with_nan_weights_is_refused_at_load(tmp_path) -> None:
    net = _net()
    net.set_params(torch.full_like(net.params(), float("nan")))
    path = str(tmp_path / "model")
    net.save(path, allow_pickle=True)
    with pytest.raises(SerializationError, match="weights.safetensors' holds non-finite"):
        Network.load(path, allow_pickle=True)
