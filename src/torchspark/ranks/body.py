"""The body every rank of [`run`][torchspark.launch.run] executes, on every route: set the environment
``torchrun`` sets (so ``dist.init_process_group("gloo")`` in the user's function just works), open the progress
connection, make the rank's `TrainContext` current, call the function, and always clean up (the
environment restored, a process group the function left open destroyed: PySpark reuses its Python workers).

Also the two ends of what travels: the function (cloudpickled once on the driver, `ship_function`) and rank 0's
return value (cloudpickled on the rank, cut into parts, `result_parts`; unpickled on the driver straight from
the parts, `load_result`, so its bytes are never joined into a second copy).
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torchspark.errors import SerializationError
from torchspark.ranks.context import TrainContext, activate
from torchspark.ranks.shares import DataShare
from torchspark.training.worker.reporting import open_worker_hooks

__all__ = ["RankSpec", "run_rank", "ship_function", "unship_function", "result_parts", "load_result", "PART_BYTES"]

#: bytes per part of a result (under Spark Connect's Arrow batch size, far under any message cap)
PART_BYTES = 1 << 20


@dataclass(frozen=True)
class RankSpec:
    """What one rank of one attempt needs to know: its place in the world and where the run keeps things.

    Args:
        rank, world_size: ``RANK`` and ``WORLD_SIZE``.
        master_addr, master_port: rank 0's address for ``torch.distributed``'s ``env://`` rendezvous.
        local_rank, local_world_size: ``LOCAL_RANK`` (see `TrainContext`) and ``LOCAL_WORLD_SIZE`` (the ranks on
            this machine: all on one machine, 1 per task on Spark).
        device: the rank's torch device; ``backend``: the one that fits it.
        attempt, run_id, checkpoint_dir, seed: as `TrainContext`.
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int = 0
    local_world_size: int = 1
    device: str = "cpu"
    backend: str = "gloo"
    attempt: int = 0
    run_id: str = ""
    checkpoint_dir: str | None = None
    seed: int = 0

    def environment(self) -> dict[str, str]:
        """The variables ``torchrun`` sets for a rank, as this rank's."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": "0",
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.attempt),
        }


def ship_function(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """``(fn, args, kwargs)`` cloudpickled, as Spark ships a task's closure: checked here, on the driver.

    Raises:
        SerializationError: they cannot be pickled (names the object's error and the fix).
    """
    import cloudpickle

    if not callable(fn):
        raise SerializationError(f"run() needs a function to run on every rank, got a {type(fn).__name__}")
    try:
        return bytes(cloudpickle.dumps((fn, args, kwargs)))
    except Exception as e:  # noqa: BLE001 - whatever pickling raised (TypeError, PicklingError...)
        raise SerializationError(
            f"run() cannot ship {getattr(fn, '__qualname__', fn)!r} and its arguments to the workers: "
            f"{type(e).__name__}: {e}. Everything the function uses must be picklable by cloudpickle: create "
            "locks, open files, sockets, Spark sessions and CUDA tensors inside the function instead of capturing "
            "them, and pass plain data (paths, numbers, CPU tensors) as arguments"
        ) from e


def unship_function(blob: bytes) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The ``(fn, args, kwargs)`` of `ship_function` (on a rank)."""
    fn, args, kwargs = pickle.loads(blob)  # noqa: S301 - the driver's own closure, as Spark ships tasks
    return fn, args, kwargs


def result_parts(value: Any, part_bytes: int = PART_BYTES) -> Iterator[bytes]:
    """Rank 0's return value cloudpickled and cut into parts of at most ``part_bytes``.

    Raises:
        SerializationError: the value cannot be pickled (names its type and the fix).
    """
    import cloudpickle

    try:
        blob = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
        raise SerializationError(
            f"rank 0's return value (a {type(value).__name__}) cannot be sent back to the driver: {type(e).__name__}: "
            f"{e}; return plain data (numbers, CPU tensors, a state dict, a path)"
        ) from e
    view = memoryview(blob)
    for start in range(0, max(len(view), 1), part_bytes):
        yield bytes(view[start : start + part_bytes])


class _Parts:
    """A read-only file over parts, each dropped once read (pickle.load streams from it)."""

    def __init__(self, parts: Iterable[bytes]) -> None:
        self._parts = iter(parts)
        self._buf = memoryview(b"")

    def _fill(self) -> bool:
        while not self._buf:
            part = next(self._parts, None)
            if part is None:
                return False
            self._buf = memoryview(part)
        return True

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while (n < 0 or len(out) < n) and self._fill():
            take = len(self._buf) if n < 0 else min(n - len(out), len(self._buf))
            out += self._buf[:take]
            self._buf = self._buf[take:]
        return bytes(out)

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        done = 0
        while done < len(view) and self._fill():
            take = min(len(view) - done, len(self._buf))
            view[done : done + take] = self._buf[:take]
            self._buf = self._buf[take:]
            done += take
        return done

    def readline(self) -> bytes:
        out = bytearray()
        while self._fill():
            cut = bytes(self._buf).find(b"\n")
            take = len(self._buf) if cut < 0 else cut + 1
            out += self._buf[:take]
            self._buf = self._buf[take:]
            if cut >= 0:
                break
        return bytes(out)


def load_result(parts: Iterable[bytes]) -> Any:
    """The value `result_parts` cut, unpickled straight from its parts (on the driver)."""
    return pickle.load(_Parts(parts))  # noqa: S301 - rank 0's own return value, as TorchDistributor returns it


def run_rank(
    spec: RankSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    progress_address: Any = None,
    share: DataShare | None = None,
) -> Any:
    """Run ``fn(*args, **kwargs)`` as rank ``spec.rank``: the function's return value.

    A function that raises has its traceback sent over the progress channel first (the driver shows the rank's own
    error, not a peer's symptom), then the error propagates.
    """
    env = spec.environment()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if v})
    for k, v in env.items():
        if not v:
            os.environ.pop(k, None)
    hooks = open_worker_hooks(spec.rank, False, progress_address)
    activate(
        TrainContext(
            rank=spec.rank,
            world_size=spec.world_size,
            local_rank=spec.local_rank,
            attempt=spec.attempt,
            backend=spec.backend,
            device=spec.device,
            run_id=spec.run_id,
            checkpoint_dir=spec.checkpoint_dir,
            seed=spec.seed,
            share=share,
            progress=hooks.progress,
        )
    )
    try:
        return fn(*args, **kwargs)
    except BaseException:
        if hooks.report_error is not None:
            hooks.report_error(traceback.format_exc())
        raise
    finally:
        activate(None)
        _destroy_group()
        if hooks.close is not None:
            hooks.close()
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def _destroy_group() -> None:
    """Destroy the default process group the function left open (the next task in a reused worker may open one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a group whose peers are gone; nothing more to free
            pass
