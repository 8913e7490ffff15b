"""The offline HTML report of a fit: one self-contained file (inline SVG + CSS, no JavaScript, no network).

Sections: summary tables, a worker x time timeline, per-worker phase shares, duration histograms per phase, score vs
iteration, and gradient-encoding series when present. Everything is aggregated before drawing (timeline bucketed
into ``buckets`` columns, histograms binned, series downsampled), so the file stays a few MB for millions of events.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from typing import Any, Protocol

import numpy as np

from torchspark._io import atomic_write_text
from torchspark.errors import ConfigError
from torchspark.stats._svg import (
    FONT,
    Markup,
    css_color,
    el,
    fmt,
    histogram_chart,
    join,
    line_chart,
    nice_ticks,
    page,
    phase_color,
    series_color,
    svg,
)
from torchspark.stats.aggregate import (
    downsample_series,
    log_histogram,
    mean_by_key,
    stacked_fractions,
    timeline_occupancy,
)
from torchspark.stats.events import EncodingTable, EventTable, ScoreTable

__all__ = ["render_html", "write_html", "ReportSource"]

log = logging.getLogger(__name__)

_CSS = (
    f"body{{{FONT};margin:24px;color:#222;max-width:1200px}}h1{{font-size:22px}}h2{{font-size:17px;"
    "margin-top:32px;border-bottom:1px solid #ddd}table{border-collapse:collapse;font-size:13px}"
    "td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}td:first-child,th:first-child"
    "{text-align:left}.sw{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px}"
    ".legend span{margin-right:14px;font-size:13px;white-space:nowrap}.grid{display:flex;flex-wrap:wrap;gap:8px}"
    ".note{color:#666;font-size:12px}"
)


class ReportSource(Protocol):
    """What the report reads: [`TrainingStats`][torchspark.stats.TrainingStats] (which calls `write_html` for its
    ``export_html``) provides it; this module does not import it."""

    @property
    def worker_ids(self) -> list[str]: ...

    @property
    def phase_names(self) -> list[str]: ...

    def events(self) -> EventTable: ...

    def scores(self) -> ScoreTable: ...

    def encoding(self) -> EncodingTable: ...

    def summary(self) -> dict[str, Any]: ...

    def driver_mask(self) -> np.ndarray: ...


def render_html(
    stats: ReportSource, *, title: str = "torchspark training stats", buckets: int = 400, max_points: int = 2000
) -> str:
    """The report as one HTML string.

    Every value from ``stats`` (worker ids, phase names, summary fields, failures...) is escaped: the page is built
    only with the escaping builder of ``torchspark.stats._svg``, so a stats document from someone else cannot add an element, an
    attribute or a script (the page has none of its own).

    Args:
        stats: the merged stats.
        title: page title.
        buckets: timeline columns per worker; 400 fits a laptop screen, more adds detail and bytes.
        max_points: cap on points per series line (score, encoding).

    Raises:
        ConfigError: ``buckets`` or ``max_points`` below 10.
    """
    if buckets < 10 or max_points < 10:
        raise ConfigError(f"buckets and max_points must be >= 10, got buckets={buckets}, max_points={max_points}")
    summary = stats.summary()
    phases = stats.phase_names
    workers = stats.worker_ids
    colors = {p: phase_color(p, i) for i, p in enumerate(phases)}
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    note = (
        f"Generated {stamp}. {summary.get('workers')} workers, {summary.get('events')} events, "
        f"{_number(summary.get('wall_seconds'))} s wall time. Times are on the driver's clock."
    )
    parts = [
        el("h1", None, title),
        el("p", {"class": "note"}, note),
        el("h2", None, "Summary"),
        _summary_table(summary),
        _phase_table(stats, phases, colors),
        el("h2", None, "Timeline"),
        _legend(phases, colors),
        _timeline(stats, workers, phases, colors, buckets),
        el("h2", None, "Time per phase per worker"),
        _shares(stats, workers, phases, colors),
        el("h2", None, "Phase durations"),
        _histograms(stats, phases, colors),
        el("h2", None, "Score"),
        _scores(stats, workers, max_points),
    ]
    if len(stats.encoding()):
        parts += [el("h2", None, "Gradient encoding"), _encoding(stats, max_points)]
    return page(title, _CSS, parts)


def write_html(stats: ReportSource, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """Render with `render_html` (``kwargs`` passed on) and write ``path`` atomically."""
    text = render_html(stats, **kwargs)
    atomic_write_text(path, text)
    log.info("wrote training stats report %s (%.1f kB)", os.fspath(path), len(text) / 1024)


# ---- sections -----------------------------------------------------------------------------------------------------


def _number(value: Any) -> str:
    return fmt(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _seconds(value: Any, default: float) -> float:
    """``value`` as a finite number of seconds, else ``default`` (a hand-made summary may hold anything)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _swatch(color: str) -> Markup:
    return el("i", {"class": "sw", "style": f"background:{css_color(color)}"})


def _legend(phases: list[str], colors: dict[str, str]) -> Markup:
    return el("div", {"class": "legend"}, *(el("span", None, _swatch(colors[p]), p) for p in phases))


def _failure_text(f: dict[str, Any]) -> str:
    who = "a worker" if f.get("rank") is None else f"worker {f.get('rank')}"
    return f"attempt {f.get('attempt')}: {who} lost ({f.get('exit_status') or 'unknown'}): {f.get('reason', '')}"


def _summary_table(summary: dict[str, Any]) -> Markup:
    rows = []
    for key, value in summary.items():
        if key in ("seconds", "counts", "driver_seconds", "driver_counts"):
            continue
        if key == "failures" and isinstance(value, list):
            value = "; ".join(_failure_text(f) for f in value if isinstance(f, dict)) or "none"
        if key == "worker_ids" and isinstance(value, list):
            value = ", ".join(map(str, value))
        elif isinstance(value, float):
            value = fmt(value)
        rows.append(el("tr", None, el("td", None, key), el("td", None, value)))
    return el("table", None, *rows)


def _phase_groups(stats: ReportSource, phases: list[str]) -> list[tuple[str, str, np.ndarray]]:
    """(label, phase, durations) of every phase on the workers, then every phase on the driver ("fit (driver)"):
    a worker's fit is one minibatch, the driver's a whole fit or round, so their durations are never pooled."""
    ev = stats.events()
    code = {p: i for i, p in enumerate(ev.phase_names)}
    on_driver = stats.driver_mask()
    groups = []
    for scope, suffix in ((~on_driver, ""), (on_driver, " (driver)")):
        for p in phases:
            d = ev.duration[(ev.phase == code[p]) & scope]
            if d.size:
                groups.append((p + suffix, p, d))
    return groups


def _phase_table(stats: ReportSource, phases: list[str], colors: dict[str, str]) -> Markup:
    grand = float(stats.events().duration.sum()) or 1.0
    heads = ("phase", "events", "total s", "share", "mean ms", "p50 ms", "p95 ms", "max ms")
    rows = [el("tr", None, *(el("th", None, h) for h in heads))]
    for label, p, d in _phase_groups(stats, phases):
        p50, p95 = np.percentile(d, [50, 95]) * 1e3
        cells = (
            d.size,
            fmt(float(d.sum())),
            f"{100 * d.sum() / grand:.1f}%",
            fmt(float(d.mean()) * 1e3),
            fmt(p50),
            fmt(p95),
            fmt(float(d.max()) * 1e3),
        )
        rows.append(el("tr", None, el("td", None, _swatch(colors[p]), label), *(el("td", None, c) for c in cells)))
    return join([el("h3", None, "Phases (workers, then driver)"), el("table", None, *rows)])


def _note(text: str) -> Markup:
    return el("p", {"class": "note"}, text)


def _timeline(
    stats: ReportSource, workers: list[str], phases: list[str], colors: dict[str, str], buckets: int
) -> Markup:
    ev = stats.events()
    if not len(ev):
        return _note("No phase events recorded.")
    t0 = float(ev.start.min())
    t1 = max(float((ev.start + ev.duration).max()), t0 + 1e-6)
    # Rows and phases in display order, so colours and stacking match the legend.
    wmap = np.array([workers.index(w) for w in ev.worker_names], dtype=np.int64)
    pmap = np.array([phases.index(p) for p in ev.phase_names], dtype=np.int64)
    occ = timeline_occupancy(
        wmap[ev.worker], pmap[ev.phase], ev.start, ev.duration, len(workers), len(phases), t0, t1, buckets
    )
    bsec = (t1 - t0) / buckets
    cum = stacked_fractions(occ, bsec)  # (W, P, B) cumulative fractions
    label_w, bw, row_h, bar_h, top = 110, 2, 20, 16, 28
    plot_w = buckets * bw
    width, height = label_w + plot_w + 20, top + row_h * len(workers) + 40
    body = []
    for r, wid in enumerate(workers):
        base = top + r * row_h + bar_h
        body.append(el("text", {"x": label_w - 6, "y": base - 4, "text-anchor": "end"}, wid))
        body.append(el("rect", {"x": label_w, "y": base - bar_h, "width": plot_w, "height": bar_h, "fill": "#f2f2f2"}))
        # Draw the tallest cumulative band first; each later (lower) band covers it, leaving phase p's own slice.
        for p in range(len(phases) - 1, -1, -1):
            below = cum[r, p - 1] if p else 0.0
            if not (cum[r, p] - below > 1e-9).any():
                continue
            band = {"fill": colors[phases[p]], "d": _step_path(cum[r, p] * bar_h, label_w, bw, base)}
            body.append(el("path", band, el("title", None, f"{wid}: {phases[p]}")))
    axis_y = top + row_h * len(workers) + 2
    body += _failure_marks(stats.summary().get("failures"), t0, t1, label_w, plot_w, top, axis_y)
    for t in nice_ticks(0.0, t1 - t0, 8):
        x = f"{label_w + t / (t1 - t0) * plot_w:.1f}"
        tick = {"x1": x, "x2": x, "y1": top, "y2": axis_y, "stroke": "#000", "stroke-opacity": 0.15}
        body.append(el("line", tick))
        body.append(el("text", {"x": x, "y": axis_y + 12, "text-anchor": "middle"}, fmt(t)))
    body.append(
        el(
            "text",
            {"x": label_w + plot_w / 2, "y": axis_y + 28, "text-anchor": "middle"},
            f"seconds since first event (one column = {fmt(bsec, 3)} s)",
        )
    )
    body.append(
        el(
            "text",
            {"x": width / 2, "y": 16, "text-anchor": "middle", "font-size": 13, "font-weight": 600},
            "Worker timeline: share of each time column spent in each phase",
        )
    )
    return svg(width, height, *body)


def _failure_marks(
    failures: Any, t0: float, t1: float, label_w: int, plot_w: int, top: int, bottom: int
) -> list[Markup]:
    """Each failed attempt (``summary()["failures"]``) on the timeline: its lost interval (from the attempt's start
    to the failure: the work recovery trained again) shaded red, the failure itself a red line. A time that is
    not a finite number (a hand-made summary) draws at the timeline's start or end."""
    marks = []

    def x(t: float) -> float:
        return label_w + min(max(t - t0, 0.0), t1 - t0) / (t1 - t0) * plot_w

    for f in failures if isinstance(failures, list) else ():
        if not isinstance(f, dict):
            continue
        start, end = x(_seconds(f.get("started"), t0)), x(_seconds(f.get("time"), t1))
        label = f"{_failure_text(f)}; the shaded work was lost and trained again"
        span = {
            "x": f"{start:.1f}",
            "y": top,
            "width": f"{max(end - start, 1.0):.1f}",
            "height": bottom - top,
            "fill": "#d62728",
            "fill-opacity": 0.12,
        }
        line = {"x1": f"{end:.1f}", "x2": f"{end:.1f}", "y1": top, "y2": bottom, "stroke": "#d62728"}
        marks.append(el("rect", span, el("title", None, label)))
        marks.append(el("line", {**line, "stroke-width": 2, "class": "failure"}, el("title", None, label)))
        marks.append(
            el("text", {"x": f"{end + 2:.1f}", "y": top - 2, "fill": "#d62728"}, f"lost: attempt {f.get('attempt')}")
        )
    return marks


def _step_path(heights: np.ndarray, x0: int, bw: int, base: float) -> str:
    """A filled step shape of ``heights`` (px per column) standing on ``base``; equal neighbours are merged."""
    h = np.round(heights, 1)
    change = np.flatnonzero(np.diff(h)) + 1
    starts = np.concatenate([[0], change]).tolist()
    ends = np.concatenate([change, [h.size]]).tolist()
    parts = [f"M{x0},{base}"]
    for s, e in zip(starts, ends):
        parts.append(f"V{base - h[s]:.1f}H{x0 + e * bw}")
    parts.append(f"V{base}Z")
    return "".join(parts)


def _shares(stats: ReportSource, workers: list[str], phases: list[str], colors: dict[str, str]) -> Markup:
    ev = stats.events()
    if not len(ev):
        return Markup()
    wmap = np.array([workers.index(w) for w in ev.worker_names], dtype=np.int64)
    pmap = np.array([phases.index(p) for p in ev.phase_names], dtype=np.int64)
    tot = np.zeros((len(workers), len(phases)))
    np.add.at(tot, (wmap[ev.worker], pmap[ev.phase]), ev.duration)
    label_w, plot_w, row_h, top = 110, 600, 16, 24
    body = [
        el(
            "text",
            {"x": label_w, "y": 14, "font-size": 13, "font-weight": 600},
            "Share of recorded phase time per worker (total seconds at right)",
        )
    ]
    for r, wid in enumerate(workers):
        y, x, s = top + r * row_h, float(label_w), tot[r].sum() or 1.0
        body.append(el("text", {"x": label_w - 6, "y": y + 11, "text-anchor": "end"}, wid))
        for p, sec in enumerate(tot[r]):
            if sec > 0:
                w = sec / s * plot_w
                bar = {"x": f"{x:.1f}", "y": y, "width": f"{w:.1f}", "height": row_h - 3, "fill": colors[phases[p]]}
                tip = f"{wid} {phases[p]}: {fmt(sec)} s ({100 * sec / s:.1f}%)"
                body.append(el("rect", bar, el("title", None, tip)))
                x += w
        body.append(el("text", {"x": label_w + plot_w + 6, "y": y + 11}, f"{fmt(s)} s"))
    return svg(label_w + plot_w + 80, top + row_h * len(workers) + 8, *body)


def _histograms(stats: ReportSource, phases: list[str], colors: dict[str, str]) -> Markup:
    charts = []
    for label, p, d in _phase_groups(stats, phases):
        edges, counts = log_histogram(d)
        charts.append(
            histogram_chart(
                edges, counts, title=f"{label} duration", xlabel="milliseconds (log bins)", color=colors[p], scale=1e3
            )
        )
    return el("div", {"class": "grid"}, *charts) if charts else _note("No phase events.")


def _scores(stats: ReportSource, workers: list[str], max_points: int) -> Markup:
    sc = stats.scores()
    if not len(sc):
        return _note("No scores recorded.")
    present = [w for w in workers if w in sc.worker_names and (sc.worker == sc.worker_names.index(w)).any()]
    per_series = min(max_points, max(200, 4 * max_points // len(present)))
    series = []
    for i, wid in enumerate(present):
        m = sc.worker == sc.worker_names.index(wid)
        x, y = downsample_series(sc.iteration[m], sc.score[m], per_series)
        series.append((wid, x, y, series_color(i, len(present))))
    return line_chart(series, title="Score vs iteration", xlabel="iteration", ylabel="score", width=900, height=320)


def _encoding(stats: ReportSource, max_points: int) -> Markup:
    enc = stats.encoding()
    steps, sent = mean_by_key(enc.step, enc.bytes_sent, "sum")
    _, dense = mean_by_key(enc.step, enc.dense_bytes, "sum")
    _, sparsity = mean_by_key(enc.step, enc.sparsity)
    _, threshold = mean_by_key(enc.step, enc.threshold)
    ds = lambda y: downsample_series(steps, y, max_points)  # noqa: E731
    charts = [
        line_chart(
            [("bytes sent", *ds(sent), "#ff7f0e"), ("dense bytes", *ds(dense), "#7f7f7f")],
            title="Bytes per step (all workers)",
            xlabel="step",
            ylabel="bytes",
            log_y=True,
        ),
        line_chart(
            [("sparsity", *ds(sparsity), "#1f77b4")],
            title="Sparsity (fraction sent, mean over workers)",
            xlabel="step",
            ylabel="fraction",
            log_y=True,
            legend=False,
        ),
        line_chart(
            [("threshold", *ds(threshold), "#2ca02c")],
            title="Threshold (mean over workers)",
            xlabel="step",
            ylabel="threshold",
            log_y=True,
            legend=False,
        ),
    ]
    counts = np.bincount(enc.format, minlength=len(enc.format_names))
    fmts = ", ".join(f"{n}: {c}" for n, c in zip(enc.format_names, counts.tolist()))
    return join([_note(f"Message formats (steps x workers): {fmts}"), el("div", {"class": "grid"}, *charts)])
