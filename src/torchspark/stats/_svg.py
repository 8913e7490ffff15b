"""Tiny hand-written SVG charts (no JavaScript, no CDN) for the offline stats report.

Coordinates are rounded to 0.1 px to keep the file small.
"""

from __future__ import annotations

import colorsys
import html
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["esc", "fmt", "nice_ticks", "line_chart", "histogram_chart", "PHASE_COLORS", "phase_color", "series_color"]

#: Fixed colours for the standard phases, so reports from different runs look alike.
PHASE_COLORS = {
    "export": "#8c564b",
    "count": "#c49c94",
    "repartition": "#e377c2",
    "broadcast": "#f7b6d2",
    "network_init": "#7f7f7f",
    "data_wait": "#d62728",
    "fit": "#2ca02c",
    "averaging": "#1f77b4",
    "exchange": "#ff7f0e",
    "aggregation": "#9467bd",
    "evaluation": "#17becf",
}
_EXTRA = [
    "#bcbd22",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#dbdb8d",
    "#9edae5",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
]

FONT = "font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(x: float, digits: int = 4) -> str:
    """Compact number: ``digits`` significant digits below 10k, SI-like suffixes (k, M, G, T) above."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    ax = abs(x)
    if ax >= 1e12:
        return f"{x / 1e12:.3g}T"
    if ax >= 1e9:
        return f"{x / 1e9:.3g}G"
    if ax >= 1e6:
        return f"{x / 1e6:.3g}M"
    if ax >= 1e4:
        return f"{x / 1e3:.3g}k"
    if ax == 0 or ax >= 1e-3:
        return f"{x:.{digits}g}"
    return f"{x:.2e}"


def phase_color(name: str, index: int) -> str:
    return PHASE_COLORS.get(name, _EXTRA[index % len(_EXTRA)])


def series_color(i: int, n: int) -> str:
    """``n`` evenly spaced hues as hex (hex rather than hsl() so every SVG renderer understands it)."""
    r, g, b = colorsys.hls_to_rgb((i / max(n, 1)) % 1.0, 0.42, 0.65)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _frame(width: int, height: int, title: str, xlabel: str, ylabel: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{FONT};font-size:11px">'
        f'<text x="{width / 2:.0f}" y="16" text-anchor="middle" font-size="13" font-weight="600">{esc(title)}</text>'
        f'<text x="{width / 2:.0f}" y="{height - 4}" text-anchor="middle">{esc(xlabel)}</text>'
        f'<text transform="translate(12,{height / 2:.0f}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>'
        f"{body}</svg>"
    )


def _axes(x0: float, y0: float, w: float, h: float, xt: list[tuple[float, str]], yt: list[tuple[float, str]]) -> str:
    """Axis lines, grid and tick labels; ticks given as (pixel, label)."""
    parts = [
        '<g stroke="#ddd">'
        + "".join(f'<line x1="{x0}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}"/>' for y, _ in yt)
        + "</g>",
        f'<path d="M{x0},{y0} V{y0 + h} H{x0 + w}" fill="none" stroke="#333"/>',
    ]
    parts += [f'<text x="{x:.1f}" y="{y0 + h + 13}" text-anchor="middle">{esc(lab)}</text>' for x, lab in xt]
    parts += [f'<text x="{x0 - 4}" y="{y + 3:.1f}" text-anchor="end">{esc(lab)}</text>' for y, lab in yt]
    return "".join(parts)


def line_chart(
    series: Sequence[tuple[str, np.ndarray, np.ndarray, str]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 760,
    height: int = 280,
    log_y: bool = False,
    legend: bool = True,
) -> str:
    """An SVG line chart; ``series`` is a list of ``(label, x, y, colour)``."""
    left, right, top, bottom = 64, 16 + (120 if legend and len(series) > 1 else 0), 26, 34
    pw, ph = width - left - right, height - top - bottom
    xs = np.concatenate([s[1] for s in series]) if series else np.zeros(0)
    ys = np.concatenate([s[2] for s in series]) if series else np.zeros(0)
    ok = np.isfinite(ys) & ((ys > 0) if log_y else True)
    if not ok.any():
        return _frame(
            width,
            height,
            title,
            xlabel,
            ylabel,
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text>',
        )
    tf = np.log10 if log_y else (lambda v: v)
    xlo, xhi = float(xs[ok].min()), float(xs[ok].max())
    ylo, yhi = float(tf(ys[ok]).min()), float(tf(ys[ok]).max())
    xhi, yhi = (xhi if xhi > xlo else xlo + 1), (yhi if yhi > ylo else ylo + 1)
    pad = 0.05 * (yhi - ylo)  # keep lines off the frame
    ylo, yhi = ylo - pad, yhi + pad
    sx = lambda v: left + (v - xlo) / (xhi - xlo) * pw  # noqa: E731
    sy = lambda v: top + ph - (v - ylo) / (yhi - ylo) * ph  # noqa: E731
    xt = [(sx(t), fmt(t)) for t in nice_ticks(xlo, xhi, 6)]
    if log_y:
        yt = [(sy(t), fmt(10**t)) for t in range(math.ceil(ylo), math.floor(yhi) + 1)] or [(sy(ylo), fmt(10**ylo))]
    else:
        yt = [(sy(t), fmt(t)) for t in nice_ticks(ylo, yhi, 5)]
    body = [_axes(left, top, pw, ph, xt, yt)]
    width_px = 1.5 if len(series) <= 4 else 1.0
    for label, x, y, color in series:
        good = np.isfinite(y) & ((y > 0) if log_y else True)
        px, py = sx(x[good]), sy(tf(y[good]))
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px.tolist(), py.tolist()))
        body.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="{width_px}" stroke-opacity="0.85" '
            f'points="{pts}"><title>{esc(label)}</title></polyline>'
        )
    if legend and len(series) > 1:
        shown = series[: max(1, (height - top - 24) // 12)]
        for i, (label, _, _, color) in enumerate(shown):
            row_y = top + 4 + i * 12
            body.append(
                f'<rect x="{width - right + 10}" y="{row_y}" width="10" height="3" fill="{color}"/>'
                f'<text x="{width - right + 24}" y="{row_y + 5}">{esc(label)}</text>'
            )
        if len(series) > len(shown):
            body.append(
                f'<text x="{width - right + 10}" y="{top + 8 + len(shown) * 12}">'
                f"+{len(series) - len(shown)} more</text>"
            )
    return _frame(width, height, title, xlabel, ylabel, "".join(body))


def histogram_chart(
    edges: np.ndarray,
    counts: np.ndarray,
    *,
    title: str,
    xlabel: str,
    color: str,
    width: int = 370,
    height: int = 200,
    scale: float = 1.0,
) -> str:
    """Bars of ``counts`` over log-spaced ``edges`` (drawn equally wide; ticks show the edge values x ``scale``)."""
    left, right, top, bottom = 52, 10, 26, 34
    pw, ph = width - left - right, height - top - bottom
    n = counts.size
    cmax = max(int(counts.max()), 1)
    bw = pw / n
    body = []
    for i, c in enumerate(counts.tolist()):
        if c:
            h = c / cmax * ph
            body.append(
                f'<rect x="{left + i * bw:.1f}" y="{top + ph - h:.1f}" width="{max(bw - 1, 0.5):.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{fmt(edges[i] * scale)}-'
                f"{fmt(edges[i + 1] * scale)}: {c}</title></rect>"
            )
    step = max(1, n // 4)
    xt = [(left + i * bw, fmt(edges[i] * scale, 3)) for i in range(0, n + 1, step)]
    yt = [(top + ph - t / cmax * ph, fmt(t)) for t in nice_ticks(0, cmax, 4) if t == int(t)]  # counts are whole
    return _frame(width, height, title, xlabel, "events", _axes(left, top, pw, ph, xt, yt) + "".join(body))
