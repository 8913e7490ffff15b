"""The live progress channel: ProgressServer, ProgressClient and ProgressBar over real sockets and threads."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from torchspark.errors import ConfigError
from torchspark.training.hooks import ProgressUpdate, ScoreReport, WorkerHooks
from torchspark.training.progress import (
    ProgressBar,
    ProgressClient,
    ProgressServer,
    estimate_clock_offset,
)
from torchspark.training.rendezvous.auth import NONCE_BYTES, hello, new_token

WAIT_S = 10.0  # bound on every handshake in these tests; they normally finish in milliseconds


@pytest.fixture
def server() -> Iterator[ProgressServer]:
    with ProgressServer(host="127.0.0.1") as s:
        yield s


def _client(server: ProgressServer, rank: int, **kwargs: object) -> ProgressClient:
    return ProgressClient.to(server.endpoint, rank, **kwargs)  # type: ignore[arg-type]


def _raw_connection(server: ProgressServer, authenticated: bool = True) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    nonce = b""
    while len(nonce) < NONCE_BYTES:  # the server's challenge comes first
        nonce += sock.recv(NONCE_BYTES - len(nonce))
    if authenticated:
        sock.sendall(hello(server.token, nonce))
    return sock


def _wait_for(what: str, event: threading.Event) -> None:
    assert event.wait(WAIT_S), f"timed out waiting for the {what}"


class _Collector:
    """A listener that records updates and signals when a condition on them holds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.updates: list[ProgressUpdate] = []
        self.changed = threading.Condition(self.lock)

    def __call__(self, update: ProgressUpdate) -> None:
        with self.changed:
            self.updates.append(update)
            self.changed.notify_all()

    def wait_until(self, pred: Callable[[list[ProgressUpdate]], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: pred(self.updates), timeout=WAIT_S), (
                f"listener saw only {self.updates}"
            )


# --- progress messages ------------------------------------------------------------------------------------------


def test_two_workers_stream_progress_in_order_while_still_training(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    seen_live = {0: threading.Event(), 1: threading.Event()}
    worker_errors: list[BaseException] = []
    n_updates = 5

    def worker(rank: int) -> None:
        try:
            host, port = server.address
            client = ProgressClient(host, port, rank, timeout_s=WAIT_S, token=server.token).connect()
            hooks = WorkerHooks(progress=client, progress_every=1)
            assert hooks.progress is not None
            for i in range(1, n_updates + 1):
                hooks.progress(ProgressUpdate(rank, 0, i, i * 8, 1.0 / i))
            # "training" is still running: the client stays open until the driver has seen our updates
            assert seen_live[rank].wait(WAIT_S), f"driver never saw rank {rank} progress before close"
            client.close()
        except BaseException as e:  # reported to the test thread below
            worker_errors.append(e)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for rank in (0, 1):
        listener.wait_until(lambda ups, r=rank: sum(u.rank == r for u in ups) == n_updates)
        seen_live[rank].set()
    for t in threads:
        t.join(WAIT_S)
    assert not worker_errors, worker_errors
    for rank in (0, 1):
        mine = [u for u in listener.updates if u.rank == rank]
        assert [u.iteration for u in mine] == list(range(1, n_updates + 1))  # in order per rank
        assert mine[-1] == ProgressUpdate(rank, 0, n_updates, n_updates * 8, 1.0 / n_updates)
    assert server.latest() == {r: ProgressUpdate(r, 0, n_updates, n_updates * 8, 1.0 / n_updates) for r in (0, 1)}
    assert server.total_examples() == 2 * n_updates * 8


def test_total_examples_sums_cumulative_counts_over_epochs_and_ignores_stale_reports(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    with _client(server, rank=0, timeout_s=WAIT_S) as client:
        for epoch, examples in [(0, 10), (0, 30), (0, 20), (1, 5), (1, 15)]:  # (0, 20) arrives late
            client(ProgressUpdate(0, epoch, 1, examples, 0.5))
        listener.wait_until(lambda ups: len(ups) == 5)
    assert server.total_examples() == 30 + 15
    assert server.latest()[0].epoch == 1


def test_listener_exception_is_logged_and_other_listeners_still_run(
    server: ProgressServer, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(update: ProgressUpdate) -> None:
        raise RuntimeError("display crashed")

    good = _Collector()
    server.add_listener(broken)
    server.add_listener(good)
    with _client(server, rank=3, timeout_s=WAIT_S) as client:
        client.send(ProgressUpdate(3, 0, 1, 4, 0.1))
        client.send(ProgressUpdate(3, 0, 2, 8, 0.1))
        good.wait_until(lambda ups: len(ups) == 2)
    assert "display crashed" in caplog.text


# --- malformed input --------------------------------------------------------------------------------------------


def test_malformed_lines_are_ignored_and_the_server_keeps_serving(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    bad_lines = [
        b"not json\n",
        b"[1, 2]\n",
        b'{"kind": "progress", "rank": "zero"}\n',
        b'{"kind": "nope"}\n',
        b"\xff\xfe\n",
        b'{"kind": "error", "rank": 1, "traceback": 7}\n',
        b'{"no_kind": 1}\n',
    ]
    with _raw_connection(server) as sock:
        sock.sendall(b"".join(bad_lines))
        # the same connection still works after the garbage
        sock.sendall(
            json.dumps(
                {"kind": "progress", "rank": 5, "epoch": 0, "iteration": 1, "examples": 2, "score": None}
            ).encode()
            + b"\n"
        )
        listener.wait_until(lambda ups: len(ups) == 1)
    assert server.malformed_count() == len(bad_lines)
    assert listener.updates[0].rank == 5 and listener.updates[0].score != listener.updates[0].score  # None -> NaN
    # and new connections are still accepted
    with _client(server, rank=6, timeout_s=WAIT_S) as client:
        client.send(ProgressUpdate(6, 0, 1, 1, 0.0))
        listener.wait_until(lambda ups: len(ups) == 2)
    assert server.errors() == []


def test_over_long_line_is_dropped_without_losing_the_next_line(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    with _raw_connection(server) as sock:
        sock.sendall(b"x" * (3 << 20) + b"\n")
        sock.sendall(
            json.dumps(
                {"kind": "progress", "rank": 0, "epoch": 0, "iteration": 1, "examples": 1, "score": 1.0}
            ).encode()
            + b"\n"
        )
        listener.wait_until(lambda ups: len(ups) == 1)
    assert listener.updates[0] == ProgressUpdate(0, 0, 1, 1, 1.0)


# --- errors -----------------------------------------------------------------------------------------------------


def test_worker_traceback_reaches_the_driver(server: ProgressServer) -> None:
    got = threading.Event()
    received: list[tuple[int, str]] = []

    def on_error(rank: int, tb: str) -> None:
        received.append((rank, tb))
        got.set()

    server.add_error_listener(on_error)
    with _client(server, rank=2, timeout_s=WAIT_S) as client:
        with pytest.raises(ZeroDivisionError):
            with client.reporting_errors():
                1 / 0  # noqa: B018 - the worker's failure
        _wait_for("error listener", got)
    ((rank, tb),) = server.errors()
    assert rank == 2 and "ZeroDivisionError" in tb and "Traceback" in tb
    assert received == server.errors()


def test_send_error_sends_a_plain_traceback_text(server: ProgressServer) -> None:
    got = threading.Event()
    server.add_error_listener(lambda rank, tb: got.set())
    with _client(server, rank=1, timeout_s=WAIT_S) as client:
        client.send_error("Traceback (most recent call last):\nValueError: bad shard 7\n")
        _wait_for("error listener", got)
    assert server.errors() == [(1, "Traceback (most recent call last):\nValueError: bad shard 7\n")]


# --- clock offset -----------------------------------------------------------------------------------------------


def test_clock_offset_is_estimated_against_a_skewed_driver_clock() -> None:
    with ProgressServer(host="127.0.0.1", clock=lambda: time.time() + 123.4) as server:
        with _client(server, rank=0, timeout_s=WAIT_S) as client:
            client.send(ProgressUpdate(0, 0, 1, 1, 0.0))  # progress traffic on the same connection is fine
            offset = client.measure_clock_offset(samples=5)
    assert abs(offset - 123.4) < 0.05


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([(0.0, 10.5, 1.0)], 10.0),
        # the quiet probe (round trip 0.2) wins over the slow one whose reply was stamped late
        ([(0.0, 12.0, 2.0), (5.0, 15.1, 5.2), (6.0, 16.0, 6.4)], 10.0),
        ([(100.0, 40.0, 100.0)], -60.0),  # the driver's clock may be behind
    ],
)
def test_estimate_clock_offset_uses_the_smallest_round_trip(
    samples: list[tuple[float, float, float]], expected: float
) -> None:
    assert estimate_clock_offset(samples) == pytest.approx(expected)


def test_estimate_clock_offset_refuses_no_samples() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        estimate_clock_offset([])


# --- unreachable driver, shutdown -------------------------------------------------------------------------------


def _closed_port() -> int:
    """A port nobody listens on: bound then released (connections to it are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_driver_makes_the_client_a_noop(caplog: pytest.LogCaptureFixture) -> None:
    before = set(threading.enumerate())
    client = ProgressClient("127.0.0.1", _closed_port(), rank=4, timeout_s=2.0, token=new_token())
    client.connect()
    assert not client.active
    assert "cannot reach the driver" in caplog.text
    client.send(ProgressUpdate(4, 0, 1, 1, 0.0))
    client(ProgressUpdate(4, 0, 2, 2, 0.0))
    client.send_error("Traceback: boom")
    assert client.measure_clock_offset() == 0.0
    client.close()
    client.close()
    assert set(threading.enumerate()) == before


def test_client_survives_the_driver_going_away() -> None:
    server = ProgressServer(host="127.0.0.1").start()
    client = _client(server, rank=0, timeout_s=2.0).connect()
    server.close()
    for i in range(200):  # the first sends may still succeed; later ones hit the closed connection
        client.send(ProgressUpdate(0, 0, i, i, 0.0))
    client.send_error("Traceback: late")
    client.measure_clock_offset(samples=2)  # returns 0.0 or stale data, but never raises
    client.close()


def test_close_joins_every_thread_and_is_idempotent() -> None:
    before = set(threading.enumerate())
    listener = _Collector()
    server = ProgressServer(host="127.0.0.1", listeners=[listener]).start()
    clients = [_client(server, rank=r, timeout_s=WAIT_S).connect() for r in range(2)]
    for c in clients:
        c.send(ProgressUpdate(c.rank, 0, 1, 1, 0.0))
    listener.wait_until(lambda ups: len(ups) == 2)
    # close the server while the clients are still connected: its connection threads must still stop
    server.close()
    server.close()
    for c in clients:
        c.close()
        c.close()
    assert set(threading.enumerate()) == before


def test_client_close_flushes_queued_updates(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    client = _client(server, rank=0, timeout_s=WAIT_S, queue_size=1000).connect()
    for i in range(1, 301):
        client.send(ProgressUpdate(0, 0, i, i, 0.0))
    client.close()
    listener.wait_until(lambda ups: len(ups) == 300)
    assert [u.iteration for u in listener.updates] == list(range(1, 301))
    assert client.dropped == 0


def test_full_queue_drops_the_oldest_update_without_blocking(server: ProgressServer) -> None:
    listener = _Collector()
    server.add_listener(listener)
    client = _client(server, rank=0, timeout_s=WAIT_S, queue_size=2).connect()
    # hold the socket so the sender thread cannot drain the queue while we overfill it
    with client._write_lock:
        for i in range(1, 51):
            client.send(ProgressUpdate(0, 0, i, i, 0.0))
        assert client.dropped >= 46
    client.close()
    listener.wait_until(lambda ups: ups and ups[-1].iteration == 50)
    assert server.latest()[0].iteration == 50  # the newest update always survives


def test_score_reports_are_never_dropped_and_a_draining_close_reads_them_all() -> None:
    """Progress is lossy by design, score reports are not: overfill the queue while the socket is held, then
    close the client and the server with ``drain_s``; every report arrives, in order, before close returns."""
    got: list[ScoreReport] = []
    listener = _Collector()
    server = ProgressServer(host="127.0.0.1", listeners=[listener], score_listeners=[got.append]).start()
    client = _client(server, rank=0, timeout_s=WAIT_S, queue_size=2).connect()
    client.send(ProgressUpdate(0, 0, 0, 0, 0.0))
    listener.wait_until(lambda ups: len(ups) == 1)  # the server has accepted this connection: drain waits for it
    reports = [
        ScoreReport(epoch=e, round=r, examples=32, score=1.0 / (1 + 3 * e + r)) for e in range(2) for r in (1, 2, 3)
    ] + [ScoreReport(epoch=2, round=None, examples=60, score=0.25)]
    with client._write_lock:
        for i, report in enumerate(reports):
            client.send(ProgressUpdate(0, 0, i + 1, i + 1, 0.0))
            client.send(ProgressUpdate(0, 0, i + 1, i + 1, 0.0))
            client.send_score(report)
        assert client.dropped > 0  # progress lost some updates meanwhile
    client.close()
    server.close(drain_s=WAIT_S)
    assert got == reports


def test_malformed_score_message_is_counted_not_delivered(server: ProgressServer) -> None:
    got: list[ScoreReport] = []
    arrived = threading.Event()
    server.add_score_listener(lambda report: (got.append(report), arrived.set()))
    with _raw_connection(server) as sock:
        sock.sendall(
            b'{"kind": "score", "epoch": "one", "round": 1, "examples": 8, "score": 0.5}\n'
            b'{"kind": "score", "epoch": 0, "round": null, "examples": 8, "score": 0.5}\n'
        )
        _wait_for("score report", arrived)
    assert got == [ScoreReport(epoch=0, round=None, examples=8, score=0.5)]
    assert server.malformed_count() == 1


def test_start_errors_and_bad_settings_name_the_fix() -> None:
    with ProgressServer(host="127.0.0.1") as s:
        with pytest.raises(Exception, match="start"):
            s.start()
        with pytest.raises(Exception, match="bind"):
            ProgressServer(host="127.0.0.1", port=s.address[1]).start()
    with pytest.raises(Exception, match="start"):
        _ = ProgressServer().address
    with pytest.raises(ConfigError, match="timeout_s"):
        ProgressClient("127.0.0.1", 1, 0, timeout_s=0, token=new_token())
    with pytest.raises(ConfigError, match="queue_size"):
        ProgressClient("127.0.0.1", 1, 0, queue_size=0, token=new_token())


# --- progress bar -----------------------------------------------------------------------------------------------


def test_bar_off_when_not_a_tty_renders_nothing_but_counts() -> None:
    out = io.StringIO()  # not a TTY
    bar = ProgressBar(total_examples=100, enabled=None, file=out)
    assert not bar.enabled
    bar.update(ProgressUpdate(0, 0, 1, 10, 0.5))
    bar.update(ProgressUpdate(1, 0, 1, 20, 1.5))
    bar.update(ProgressUpdate(0, 0, 2, 25, float("nan")))  # NaN score: the rank's score is unknown again
    bar.close()
    bar.close()
    assert out.getvalue() == ""
    assert bar.examples == 45
    assert bar.score == pytest.approx(1.5)


def test_bar_enabled_shows_examples_epoch_and_mean_score() -> None:
    out = io.StringIO()
    with ProgressBar(total_examples=100, desc="epoch", enabled=True, file=out, mininterval=0.0) as bar:
        bar.update(ProgressUpdate(0, 1, 1, 10, 0.5))
        bar(ProgressUpdate(1, 1, 1, 30, 1.5))
    text = out.getvalue()
    assert "epoch 1" in text and "40.0/100" in text and "score=1" in text and "ex/s" in text
    assert bar.score == pytest.approx(1.0)


def test_bar_explicitly_disabled_even_on_a_tty() -> None:
    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = FakeTTY()
    with ProgressBar(file=out) as auto:
        assert auto.enabled
    bar = ProgressBar(file=out, enabled=False)
    bar.update(ProgressUpdate(0, 0, 1, 3, 0.1))
    bar.close()
    assert bar.examples == 3


def test_bar_in_a_notebook_draws_without_a_terminal_and_stays_quiet_elsewhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A notebook kernel's stderr is no terminal, yet the bar shows there (a widget with ipywidgets, else text
    in the cell); a script writing to a log gets nothing; an explicit file or enabled=False wins."""
    import importlib.util

    from torchspark.training.progress.bar import choose_display

    assert choose_display(None, None, notebook=True, widgets=True) == ("widget", True)
    assert choose_display(None, None, notebook=True, widgets=False) == ("text", True)
    assert choose_display(False, None, notebook=True, widgets=True) == ("text", False)
    assert choose_display(None, io.StringIO(), notebook=True, widgets=True) == ("text", False)  # a log file
    assert choose_display(None, None, notebook=False, widgets=True) == ("text", False)  # pytest's stderr: no tty

    widgets = importlib.util.find_spec("ipywidgets") is not None
    with ProgressBar(total_examples=10, desc="nb", mininterval=0.0, detect_notebook=lambda: True) as bar:
        assert bar.enabled and bar.kind == ("widget" if widgets else "text")
        bar.update(ProgressUpdate(0, 0, 1, 10, 0.5))
    if not widgets:
        assert "nb 0" in capsys.readouterr().err  # the cell's output shows the text bar
    with ProgressBar(total_examples=10, detect_notebook=lambda: False) as quiet:
        quiet.update(ProgressUpdate(0, 0, 1, 10, 0.5))
    assert not quiet.enabled and capsys.readouterr().err == ""


def test_in_notebook_recognises_a_kernel_but_not_a_terminal_ipython(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from torchspark.training.progress.bar import in_notebook

    monkeypatch.delitem(__import__("sys").modules, "IPython", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    assert not in_notebook()  # IPython never imported: a script

    class Kernel:  # what Jupyter's ZMQInteractiveShell carries: the kernel app's config
        config = {"IPKernelApp": {"connection_file": "kernel-1.json"}}

    class TerminalInteractiveShell:
        config: dict = {}

    fake = types.ModuleType("IPython")
    monkeypatch.setitem(__import__("sys").modules, "IPython", fake)
    for shell, expected in [(Kernel(), True), (TerminalInteractiveShell(), False), (None, False)]:
        fake.get_ipython = lambda shell=shell: shell  # type: ignore[attr-defined]
        assert in_notebook() is expected, shell
    fake.get_ipython = lambda: TerminalInteractiveShell()  # type: ignore[attr-defined]
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")  # a Databricks notebook's shell
    assert in_notebook()


def test_bar_fed_by_the_server_counts_all_workers(server: ProgressServer) -> None:
    bar = ProgressBar(enabled=False)
    done = _Collector()
    server.add_listener(bar.update)
    server.add_listener(done)
    clients = [_client(server, rank=r, timeout_s=WAIT_S).connect() for r in range(3)]
    for c in clients:
        for i in range(1, 4):
            c.send(ProgressUpdate(c.rank, 0, i, 10 * i, float(c.rank)))
    done.wait_until(lambda ups: len(ups) == 9)
    for c in clients:
        c.close()
    bar.close()
    assert bar.examples == server.total_examples() == 90
    assert bar.score == pytest.approx(1.0)
