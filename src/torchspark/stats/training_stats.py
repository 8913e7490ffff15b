"""The merged statistics of one fit: events of every worker and of the driver, score and encoding series, summary.

Build it on the driver from the payloads the workers return ([`TrainingStats.add_worker_payload`][torchspark.stats.TrainingStats.add_worker_payload]), let the
master set what only it knows (``set_summary("epochs", 3)``), then read `summary`, save `to_json` or
write the offline HTML report with [`export_html`][torchspark.stats.TrainingStats.export_html].
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from torchspark._bounded import load_json
from torchspark._io import atomic_write_text
from torchspark.errors import ConfigError, DataError, SerializationError
from torchspark.stats.document import (
    ENCODING_FLOAT_COLUMNS,
    ENCODING_INT_COLUMNS,
    checked_document,
    payload_to_json,
)
from torchspark.stats.events import DRIVER_ID, PAYLOAD_FORMAT, STANDARD_PHASES, EncodingTable, EventTable, ScoreTable
from torchspark.stats.html import write_html

__all__ = ["TrainingStats"]


class TrainingStats:
    """Events and series from all workers of a fit, merged on the driver's time axis.

    Worker ids and phase names are kept in order of first appearance; events are stored column-wise in chunks and
    concatenated on first read, so adding a payload is O(payload).
    """

    def __init__(self) -> None:
        self._workers: list[str] = []
        self._phases: list[str] = []
        self._formats: list[str] = []
        self._event_chunks: list[dict[str, Any]] = []
        self._score_chunks: list[dict[str, np.ndarray]] = []
        self._enc_chunks: list[dict[str, np.ndarray]] = []
        self._summary: dict[str, Any] = {}
        self._cache: dict[str, Any] = {}

    # ---- building -----------------------------------------------------------------------------------------------

    @classmethod
    def from_payloads(cls, payloads: Iterable[dict[str, Any]]) -> TrainingStats:
        """A new object holding ``payloads`` (each named by its own ``"worker"`` field)."""
        return cls().merge(payloads)

    def merge(self, payloads: Iterable[dict[str, Any] | TrainingStats]) -> TrainingStats:
        """Add collector payloads (or other [`TrainingStats`][torchspark.stats.TrainingStats]) to this object; returns ``self``."""
        for item in payloads:
            if isinstance(item, TrainingStats):
                self._merge_stats(item)
            else:
                self.add_worker_payload(_require(item, "worker", str), item)
        return self

    def add_worker_payload(self, worker_id: str, payload: dict[str, Any], clock_offset: float = 0.0) -> None:
        """Add one [`StatsCollector.drain`][torchspark.stats.StatsCollector.drain] payload.

        Args:
            worker_id: timeline row the events go to (overrides ``payload["worker"]``).
            payload: the collector's payload.
            clock_offset: worker-minus-driver clock offset still to remove from the payload's starts; 0.0 when the
                worker's collector already applied it (its ``clock_offset`` argument).

        Raises:
            DataError: the payload is not a torchspark stats payload or its columns disagree in length.
        """
        if not isinstance(payload, dict) or payload.get("format") != PAYLOAD_FORMAT:
            got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise DataError(
                f"not a stats payload (format {got!r}, expected {PAYLOAD_FORMAT!r}); pass what "
                "StatsCollector.drain() or snapshot() returned"
            )
        w = self._code(self._workers, str(worker_id))
        ph = _require(payload, "phases", dict)
        n = len(ph["code"])
        cols = {
            "start": np.asarray(ph["start"], dtype=np.float64) - float(clock_offset),
            "duration": np.asarray(ph["duration"], dtype=np.float64),
        }
        attrs = {k: np.asarray(v, dtype=np.float64) for k, v in ph.get("attrs", {}).items()}
        if any(len(c) != n for c in [*cols.values(), *attrs.values()]):
            raise DataError(
                f"stats payload of {worker_id!r} has phase columns of different lengths; it was "
                "corrupted on the way (build payloads only with StatsCollector)"
            )
        remap = np.array([self._code(self._phases, str(name)) for name in ph["names"]] or [0], dtype=np.int32)
        codes = np.asarray(ph["code"], dtype=np.int64)
        if n:
            self._event_chunks.append(
                {"worker": np.full(n, w, dtype=np.int32), "phase": remap[codes], **cols, "attrs": attrs}
            )
        sc = _require(payload, "scores", dict)
        if len(sc["score"]):
            self._score_chunks.append(
                {
                    "worker": np.full(len(sc["score"]), w, dtype=np.int32),
                    "iteration": np.asarray(sc["iteration"], dtype=np.int64),
                    "score": np.asarray(sc["score"], dtype=np.float64),
                }
            )
        enc = _require(payload, "encoding", dict)
        if len(enc["step"]):
            fremap = np.array([self._code(self._formats, str(f)) for f in enc["format_names"]] or [0], dtype=np.int32)
            chunk: dict[str, np.ndarray] = {k: np.asarray(enc[k], dtype=np.int64) for k in ENCODING_INT_COLUMNS}
            chunk.update({k: np.asarray(enc[k], dtype=np.float64) for k in ENCODING_FLOAT_COLUMNS})
            chunk["format"] = fremap[np.asarray(enc["format"], dtype=np.int64)]
            chunk["worker"] = np.full(len(enc["step"]), w, dtype=np.int32)
            self._enc_chunks.append(chunk)
        self._cache.clear()

    def set_summary(self, key: str, value: Any) -> None:
        """Set a summary field only the master knows (``examples``, ``epochs``, ``replicas_identical``, or any
        other JSON-serialisable value); it overrides the value [`summary`][torchspark.stats.TrainingStats.summary] would compute.

        Raises:
            ConfigError: the value is not JSON-serialisable.
        """
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"summary field {key!r}={value!r} is not JSON-serialisable; pass a number, string, "
                "bool, None, or a list/dict of those"
            ) from err
        self._summary[str(key)] = value

    def _merge_stats(self, other: TrainingStats) -> None:
        for wid in other.worker_ids:
            self._code(self._workers, wid)
        for payload in other._as_payloads():
            self.add_worker_payload(payload["worker"], payload)
        for key, value in other._summary.items():
            self._summary.setdefault(key, value)

    @staticmethod
    def _code(table: list[str], name: str) -> int:
        try:
            return table.index(name)
        except ValueError:
            table.append(name)
            return len(table) - 1

    # ---- reading ------------------------------------------------------------------------------------------------

    @property
    def worker_ids(self) -> list[str]:
        """Every worker id, the driver first, then workers in natural order (``worker-2`` before ``worker-10``)."""
        return sorted(self._workers, key=_natural_key)

    @property
    def phase_names(self) -> list[str]:
        """Every phase that occurred: standard phases in pipeline order, then the others in order of appearance."""
        seen = set(self.events().phase_names[c] for c in np.unique(self.events().phase))
        return [p for p in STANDARD_PHASES if p in seen] + [
            p for p in self._phases if p in seen and p not in STANDARD_PHASES
        ]

    def events(self) -> EventTable:
        """All phase events, column-wise (see [`EventTable`][torchspark.stats.EventTable])."""
        if "events" not in self._cache:
            chunks = self._event_chunks
            keys = sorted({k for c in chunks for k in c["attrs"]})

            def cat(name: str, dt: Any) -> np.ndarray:
                return np.concatenate([c[name] for c in chunks]) if chunks else np.zeros(0, dt)

            attrs = {
                k: np.concatenate([c["attrs"].get(k, np.full(len(c["start"]), np.nan)) for c in chunks]) for k in keys
            }
            self._cache["events"] = EventTable(
                tuple(self._workers),
                tuple(self._phases),
                cat("worker", np.int32),
                cat("phase", np.int32),
                cat("start", np.float64),
                cat("duration", np.float64),
                attrs,
            )
        return self._cache["events"]

    def scores(self) -> ScoreTable:
        """Score vs iteration of every worker (see [`ScoreTable`][torchspark.stats.ScoreTable])."""
        if "scores" not in self._cache:
            c = self._score_chunks

            def cat(name: str, dt: Any) -> np.ndarray:
                return np.concatenate([x[name] for x in c]) if c else np.zeros(0, dt)

            self._cache["scores"] = ScoreTable(
                tuple(self._workers), cat("worker", np.int32), cat("iteration", np.int64), cat("score", np.float64)
            )
        return self._cache["scores"]

    def encoding(self) -> EncodingTable:
        """Per-step encoding stats of every worker (see [`EncodingTable`][torchspark.stats.EncodingTable])."""
        if "encoding" not in self._cache:
            c = self._enc_chunks

            def cat(name: str, dt: Any) -> np.ndarray:
                return np.concatenate([x[name] for x in c]) if c else np.zeros(0, dt)

            self._cache["encoding"] = EncodingTable(
                tuple(self._workers),
                tuple(self._formats),
                cat("worker", np.int32),
                cat("step", np.int64),
                cat("bytes_sent", np.int64),
                cat("dense_bytes", np.int64),  # ENCODING_INT_COLUMNS
                cat("sparsity", np.float64),
                cat("threshold", np.float64),
                cat("format", np.int32),
            )
        return self._cache["encoding"]

    def driver_mask(self) -> np.ndarray:
        """bool (events,): which events the driver (the training master) recorded, as opposed to the workers.

        The two are counted apart: the driver's ``fit`` is the span of a whole fit (or averaging round) and its
        ``broadcast``/``aggregation`` happen once per fit or round, while a worker's ``fit`` is one minibatch.
        """
        ev = self.events()
        if DRIVER_ID not in self._workers:
            return np.zeros(len(ev), dtype=bool)
        return ev.worker == self._workers.index(DRIVER_ID)

    def _phase_totals(self, keep: np.ndarray) -> tuple[dict[str, float], dict[str, int]]:
        """(phase -> total seconds, phase -> events) over the events where ``keep`` (only phases that occur there)."""
        ev = self.events()
        totals = np.bincount(ev.phase[keep], weights=ev.duration[keep], minlength=len(ev.phase_names))
        counts = np.bincount(ev.phase[keep], minlength=len(ev.phase_names))
        codes = {name: i for i, name in enumerate(ev.phase_names)}
        present = [p for p in self.phase_names if counts[codes[p]]]
        return {p: float(totals[codes[p]]) for p in present}, {p: int(counts[codes[p]]) for p in present}

    def summary(self) -> dict[str, Any]:
        """Headline numbers of the fit.

        Worker and driver phases are counted apart: ``seconds``/``counts`` hold the workers' phases (``fit`` is
        one minibatch), ``driver_seconds``/``driver_counts`` the driver's (export, count, broadcast, its ``fit``
        span of each fit or averaging round, aggregation).

        Returns:
            A JSON-ready dict with ``examples`` (sum of the ``examples`` attribute of the workers' ``fit`` events),
            ``iterations`` (most ``fit`` events on one worker, i.e. steps per replica; falls back to the longest
            score series), ``minibatches`` (the workers' ``fit`` events), ``epochs`` (None unless set), ``workers``
            (ids other than ``"driver"``), ``worker_ids``, ``events`` (all, the driver's included), ``seconds``
            (phase -> total seconds over all workers), ``counts`` (phase -> events on the workers),
            ``driver_seconds`` and ``driver_counts`` (the same for the driver), ``wall_seconds`` (first start to
            last end), and when encoding stats exist ``bytes_sent``, ``dense_bytes``, ``compression_ratio``
            (dense / sent) and ``mean_sparsity``. Fields set with [`set_summary`][torchspark.stats.TrainingStats.set_summary] override the computed ones.
        """
        ev = self.events()
        codes = {name: i for i, name in enumerate(ev.phase_names)}
        on_driver = self.driver_mask()
        seconds, counts = self._phase_totals(~on_driver)
        driver_seconds, driver_counts = self._phase_totals(on_driver)
        fit = (ev.phase == codes["fit"]) & ~on_driver if "fit" in codes else np.zeros(len(ev), dtype=bool)
        examples = ev.attrs.get("examples")
        per_worker_fit = np.bincount(ev.worker[fit], minlength=len(self._workers)) if fit.any() else np.zeros(1)
        sc = self.scores()
        per_worker_scores = np.bincount(sc.worker, minlength=len(self._workers)) if len(sc) else np.zeros(1)
        out: dict[str, Any] = {
            "examples": int(np.nansum(examples[fit])) if examples is not None else 0,
            "iterations": int(per_worker_fit.max() or per_worker_scores.max()),
            "minibatches": int(fit.sum()),
            "epochs": None,
            "workers": sum(1 for w in self._workers if w != DRIVER_ID),
            "worker_ids": self.worker_ids,
            "events": len(ev),
            "seconds": seconds,
            "counts": counts,
            "driver_seconds": driver_seconds,
            "driver_counts": driver_counts,
            "wall_seconds": float((ev.start + ev.duration).max() - ev.start.min()) if len(ev) else 0.0,
        }
        enc = self.encoding()
        if len(enc):
            sent, dense = int(enc.bytes_sent.sum()), int(enc.dense_bytes.sum())
            out.update(
                bytes_sent=sent,
                dense_bytes=dense,
                compression_ratio=(dense / sent) if sent else None,
                mean_sparsity=float(enc.sparsity.mean()),
            )
        out.update(self._summary)
        return out

    # ---- persistence --------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The whole object as a JSON string (exact round trip through [`from_json`][torchspark.stats.TrainingStats.from_json]; NaN is written as null)."""
        return json.dumps(
            {
                "format": PAYLOAD_FORMAT,
                "summary_fields": self._summary,
                "workers": self._workers,
                "phases": self._phases,
                "formats": self._formats,
                "payloads": [payload_to_json(p) for p in self._as_payloads()],
            },
            allow_nan=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, source: str | None = None) -> TrainingStats:
        """Rebuild from [`to_json`][torchspark.stats.TrainingStats.to_json] output, checked field by field before anything is built: the types and
        ranges of every field [`summary`][torchspark.stats.TrainingStats.summary] and [`export_html`][torchspark.stats.TrainingStats.export_html] read (a stats document shared by someone
        else fails here, naming the field, not later in the report).

        Args:
            text: the JSON text.
            source: where ``text`` came from (a path), named in errors; [`load_json`][torchspark.stats.TrainingStats.load_json] passes the file's.

        Raises:
            SerializationError: not JSON, not written by [`to_json`][torchspark.stats.TrainingStats.to_json], or a field of the wrong type or range
                (``... 'stats.json' is damaged: summary_fields.failures[0].started = None, expected a finite
                number of seconds ...``).
        """
        what = "training stats JSON" + (f" {source!r}" if source else "")
        doc = load_json(text, f"{what} (pass what to_json() wrote)", SerializationError)
        if not isinstance(doc, dict) or doc.get("format") != PAYLOAD_FORMAT:
            raise SerializationError(
                f"{what} is not a training stats document (format "
                f"{doc.get('format') if isinstance(doc, dict) else None!r}, expected {PAYLOAD_FORMAT!r})"
            )
        stats = cls()
        try:
            doc = checked_document(doc)
            stats._workers, stats._phases, stats._formats = doc["workers"], doc["phases"], doc["formats"]
            for p in doc["payloads"]:
                stats.add_worker_payload(p["worker"], p)
            stats._summary = doc["summary_fields"]
        except ValueError as err:  # DataError too (a ValueError)
            raise SerializationError(
                f"{what} is damaged: {err}; write it again with TrainingStats.save_json() (or ask for a new copy)"
            ) from err
        return stats

    @classmethod
    def load_json(cls, path: str | os.PathLike[str]) -> TrainingStats:
        """Read a ``stats.json`` ([`save_json`][torchspark.stats.TrainingStats.save_json] output) with [`from_json`][torchspark.stats.TrainingStats.from_json], errors naming the file.

        Raises:
            SerializationError: the file cannot be read, or as [`from_json`][torchspark.stats.TrainingStats.from_json].
        """
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise SerializationError(f"cannot read training stats JSON {os.fspath(path)!r} ({err})") from err
        return cls.from_json(text, source=os.fspath(path))

    def save_json(self, path: str | os.PathLike[str]) -> None:
        """Write [`to_json`][torchspark.stats.TrainingStats.to_json] to ``path`` atomically (temporary name, then rename)."""
        atomic_write_text(path, self.to_json())

    def export_html(self, path: str | os.PathLike[str]) -> None:
        """Write the self-contained offline HTML report (timeline, histograms, series, summary) to ``path``.

        The file is written atomically and stays a few MB at most even for millions of events; see
        `torchspark.stats.html.render_html`.
        """
        write_html(self, path)

    def _as_payloads(self) -> list[dict[str, Any]]:
        """One collector-style payload per worker (what JSON and merging go through)."""
        ev, sc, enc = self.events(), self.scores(), self.encoding()
        out = []
        for w, wid in enumerate(self._workers):
            m = ev.worker == w
            used = np.unique(ev.phase[m])
            local = np.searchsorted(used, ev.phase[m]).astype(np.int32)
            attrs = {k: v[m] for k, v in ev.attrs.items() if not np.isnan(v[m]).all()}
            ms, me = sc.worker == w, enc.worker == w
            fused = np.unique(enc.format[me])
            encoding = {k: getattr(enc, k)[me] for k in (*ENCODING_INT_COLUMNS, *ENCODING_FLOAT_COLUMNS)}
            encoding.update(
                format=np.searchsorted(fused, enc.format[me]).astype(np.int32),
                format_names=[enc.format_names[f] for f in fused],
            )
            out.append(
                {
                    "format": PAYLOAD_FORMAT,
                    "worker": wid,
                    "clock_offset": 0.0,
                    "phases": {
                        "names": [ev.phase_names[p] for p in used],
                        "code": local,
                        "start": ev.start[m],
                        "duration": ev.duration[m],
                        "attrs": attrs,
                    },
                    "scores": {"iteration": sc.iteration[ms], "score": sc.score[ms]},
                    "encoding": encoding,
                }
            )
        return out

    def __repr__(self) -> str:
        return (
            f"TrainingStats(workers={len(self._workers)}, events={len(self.events())}, "
            f"scores={len(self.scores())}, encoding_steps={len(self.encoding())})"
        )


def _natural_key(name: str) -> tuple[int, list[Any]]:
    import re

    parts = [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
    return (0 if name == DRIVER_ID else 1, [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in parts])


def _require(doc: dict[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise DataError(
            f"stats payload field {key!r} should be a {kind.__name__}, got {type(value).__name__}; "
            "pass what StatsCollector.drain() returned"
        )
    return value
