"""The one-machine route of [`run`][torchspark.launch.run]: one fresh process per rank (forked from the fork
server with torch preloaded, as ``ParallelWrapper``'s workers are: `worker_context`), rank 0's
``torch.distributed`` store on loopback, rank 0's return value back through a pipe in parts.

Supervision: a rank that raises sends its traceback (the run fails with that rank's own error, not retried); a
rank whose process ends without a word (killed, ``os._exit``, out of memory), or whose peers only report that a
peer went away, makes the attempt a [`WorkerLost`][torchspark.errors.WorkerLost], which ``max_failures`` retries;
the fit's watchdog (silent ranks, ``stall_timeout_s``) too.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from typing import Any

from torchspark.errors import ConfigError, SetupError, WorkerLost
from torchspark.parallel.bootstrap import worker_context
from torchspark.ranks.body import RankSpec, load_result, result_parts, run_rank, unship_function
from torchspark.ranks.shares import DataShare, spool
from torchspark.training.driver.failures import is_peer_failure, root_cause, worker_failure

__all__ = ["LocalLauncher", "split_table"]

#: how long the other ranks get to report their own error after the first failure was seen
_ROOT_CAUSE_S = 3.0
_POLL_S = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(spec: RankSpec, blob: bytes, progress: Any, share: DataShare | None, threads: int, conn: Any) -> None:
    """A rank's process: run the function; send ``("ok",)`` and (rank 0) its value's parts, or ``("error", tb)``."""
    import traceback

    import torch

    torch.set_num_threads(threads)
    try:
        fn, args, kwargs = unship_function(blob)
        value = run_rank(spec, fn, args, kwargs, progress, share)
        conn.send(("ok",))
        if spec.rank == 0:
            for part in result_parts(value):
                conn.send_bytes(part)
            conn.send_bytes(b"")
    except BaseException:  # noqa: BLE001 - the driver shows it
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001 - the driver sees the exit instead
            pass
        os._exit(1)
    finally:
        conn.close()


def _parts(conn: Any) -> Any:
    """Rank 0's result parts from its pipe, up to the empty part that ends them."""
    while True:
        part = conn.recv_bytes()
        if not part:
            return
        yield part


def split_table(data: Any, workers: int, directory: str) -> list[DataShare]:
    """``data`` (a pyarrow Table or pandas DataFrame) dealt row by row to ``workers`` Arrow files in ``directory``.

    Raises:
        ConfigError: ``data`` is neither.
    """
    import numpy as np
    import pyarrow as pa

    if hasattr(data, "to_dict") and hasattr(data, "columns") and not isinstance(data, pa.Table):
        data = pa.Table.from_pandas(data, preserve_index=False)
    if not isinstance(data, pa.Table):
        raise ConfigError(
            f"run(data=...) on one machine takes a pyarrow Table or a pandas DataFrame, got a {type(data).__name__} "
            "(a Spark DataFrame needs run(..., spark=session) or local_mode=False)"
        )
    shares = []
    for rank in range(workers):
        part = data.take(pa.array(np.arange(rank, data.num_rows, workers)))
        shares.append(spool(part.to_batches(), os.path.join(directory, f"share-{rank}.arrow"), part.schema))
    return shares


class LocalLauncher:
    """Runs the ranks of `run` as processes of this machine.

    Args:
        use_gpu: rank ``r`` trains on ``cuda:r`` (``LOCAL_RANK`` = ``r``), with the nccl backend in its context.
        data: a pyarrow Table or pandas DataFrame the ranks share, or None.
        exit_timeout_s: how long finished ranks get to exit before they are terminated.
    """

    def __init__(self, use_gpu: bool = False, data: Any = None, exit_timeout_s: float = 30.0) -> None:
        self.use_gpu = use_gpu
        self.data = data
        self.exit_timeout_s = exit_timeout_s

    def check_slots(self, workers: int) -> None:
        """Refuse more GPU ranks than this machine has GPUs.

        Raises:
            SetupError: naming the count and the fix.
        """
        if not self.use_gpu:
            return
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < workers:
            raise SetupError(
                f"num_workers={workers} with use_gpu=True, but this machine has {have} usable GPU(s); lower "
                "num_workers, or pass use_gpu=False to train on the CPU"
            )

    def capacity(self) -> int:
        import torch

        return torch.cuda.device_count() if self.use_gpu else (os.cpu_count() or 1)

    def launch(
        self,
        blob: bytes,
        workers: int,
        *,
        attempt: int,
        run_id: str,
        checkpoint_dir: str | None,
        seed: int,
        timeout_s: float,
        context: Any,
    ) -> Any:
        """Run one attempt: rank 0's return value (see the module docstring for the errors)."""
        mp = worker_context()
        scratch = tempfile.mkdtemp(prefix="torchspark-run-")
        procs: list[Any] = []
        conns: list[Any] = []
        try:
            shares: list[DataShare | None] = (
                list(split_table(self.data, workers, scratch)) if self.data is not None else [None] * workers
            )
            progress = context.progress_address()
            port = _free_port()
            threads = max(1, (os.cpu_count() or 1) // workers)
            for rank in range(workers):
                device = f"cuda:{rank}" if self.use_gpu else "cpu"
                spec = RankSpec(
                    rank=rank,
                    world_size=workers,
                    master_addr="127.0.0.1",
                    master_port=port,
                    local_rank=rank,
                    local_world_size=workers,
                    device=device,
                    backend="nccl" if self.use_gpu else "gloo",
                    attempt=attempt,
                    run_id=run_id,
                    checkpoint_dir=checkpoint_dir,
                    seed=seed,
                )
                parent, child = mp.Pipe(duplex=False)
                proc = mp.Process(
                    target=_child,
                    args=(spec, blob, progress, shares[rank], threads, child),
                    name=f"torchspark-rank-{rank}",
                    daemon=True,
                )
                proc.start()
                child.close()
                procs.append(proc)
                conns.append(parent)
            with context.recorder.phase("fit"):
                return self._supervise(procs, conns, workers, timeout_s, context)
        finally:
            for proc in procs:
                proc.join(self.exit_timeout_s if proc.exitcode is None else 0)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5.0)
            for conn in conns:
                conn.close()
            shutil.rmtree(scratch, ignore_errors=True)

    def _supervise(self, procs: list[Any], conns: list[Any], workers: int, timeout_s: float, context: Any) -> Any:
        done: set[int] = set()
        errors: list[tuple[int, str]] = []
        result: list[Any] = []
        first_failure: float | None = None
        while len(done) < workers:
            for rank, conn in enumerate(conns):
                if rank in done:
                    continue
                if conn.poll(_POLL_S / workers):
                    try:
                        msg = conn.recv()
                    except EOFError:
                        msg = ("gone",)
                    if msg[0] == "ok":
                        if rank == 0:
                            result.append(load_result(_parts(conn)))
                        done.add(rank)
                    elif msg[0] == "error":
                        errors.append((rank, msg[1]))
                        done.add(rank)
                    else:
                        done.add(rank)
                        errors.append((rank, ""))
                elif procs[rank].exitcode is not None and not conn.poll(0):
                    done.add(rank)
                    errors.append((rank, ""))  # ended without a word: lost
            if errors:
                first_failure = first_failure or time.monotonic()
                if time.monotonic() - first_failure > _ROOT_CAUSE_S or len(done) == workers:
                    break
            lost = context.stalled(workers, timeout_s)
            if lost is not None:
                for proc in procs:
                    if proc.is_alive():
                        proc.kill()
                raise lost
        for proc in procs:
            if proc.is_alive() and errors:
                proc.kill()
        if not errors:
            return result[0]
        silent = [rank for rank, tb in errors if not tb]
        if silent:
            code = procs[silent[0]].exitcode
            raise WorkerLost(
                f"rank {silent[0]} ended without a word (exit code {code}): its process was killed or exited",
                rank=silent[0],
                exit_status=None if code is None else f"exit code {code}",
                reason=f"the process of rank {silent[0]} ended (exit code {code})",
            )
        rank, tb = root_cause(errors)  # type: ignore[misc]
        if is_peer_failure(tb):
            raise WorkerLost(
                f"rank {rank} saw a peer go away: {tb.strip().splitlines()[-1]}",
                rank=None,
                reason=tb.strip().splitlines()[-1],
            )
        raise worker_failure(rank, tb)
