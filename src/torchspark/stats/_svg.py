"""Tiny hand-written SVG charts (no JavaScript, no CDN) for the offline stats report, and the markup builder every
byte of the report goes through.

HTML safety by construction: markup is made only by `el` (one element; its text children and every attribute
value are escaped, attribute names are checked, event-handler and URL attributes refused) and `page` (the
document around the body). Anything that is not a `Markup` -- a worker id, a phase name, a failure's reason,
a number formatted from data -- is escaped wherever it is placed, so a stats document shared by someone else cannot
put an element or an attribute into the report. ``Markup(...)`` by hand is for constants of this package only.

Coordinates are rounded to 0.1 px to keep the file small.
"""

from __future__ import annotations

import colorsys
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "Markup",
    "esc",
    "el",
    "join",
    "page",
    "css_color",
    "fmt",
    "nice_ticks",
    "line_chart",
    "histogram_chart",
    "PHASE_COLORS",
    "phase_color",
    "series_color",
    "svg",
]

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


class Markup(str):
    """Text that already is markup: `el`, `join` and `page` place it as it is.

    Only this module's helpers make one from data (always escaped); ``Markup("...")`` by hand is for constants.
    Concatenating a Markup with ``+`` or ``str.join`` gives a plain ``str`` again, which is escaped when placed:
    a slip shows as visible ``&lt;`` in the report, never as a live element.
    """

    __slots__ = ()


#: element and attribute names the builder writes (letters, digits, ``-``; a namespace prefix for ``xmlns:*``)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*(:[A-Za-z][A-Za-z0-9-]*)?\Z")
#: attributes never written: event handlers (``on*``) run script, URLs fetch or navigate (the report does neither)
_REFUSED_ATTRS = frozenset({"href", "xlink:href", "src", "srcset", "action", "formaction", "data", "srcdoc"})
#: elements whose content is not parsed as markup (raw text): made only by `page` (``style``) or never
_RAW_TEXT = frozenset({"script", "style", "iframe", "object", "embed", "textarea", "xmp", "noscript"})
#: empty elements written as ``<tag .../>`` (SVG shapes; HTML's void ``meta``); others always get a closing tag
_SELF_CLOSING = frozenset({"rect", "line", "path", "polyline", "circle", "meta"})
_HEX_COLOR = re.compile(r"#[0-9a-fA-F]{3}([0-9a-fA-F]{3})?\Z")


def esc(value: object) -> Markup:
    """``value`` as text safe inside an element or a quoted attribute: a `Markup` as it is, anything else
    ``str()``-ed with ``& < > " '`` escaped."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def join(parts: Iterable[object]) -> Markup:
    """``parts`` one after another, each through `esc` (so Markup stays markup and text stays text)."""
    return Markup("".join(esc(p) for p in parts))


def _checked_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"not a valid {what} name for the report: {name!r}")
    return name


def _attributes(attrs: Mapping[str, object]) -> str:
    out = []
    for name, value in attrs.items():
        if value is None:
            continue
        _checked_name(name, "attribute")
        if name.lower().startswith("on") or name.lower() in _REFUSED_ATTRS:
            raise ValueError(f"the report writes no {name!r} attribute (event handlers and URLs are refused)")
        out.append(f' {name}="{esc(value)}"')
    return "".join(out)


def el(tag: str, attrs: Mapping[str, object] | None = None, *children: object) -> Markup:
    """One element: ``<tag attrs>children</tag>`` (``<tag attrs/>`` for an empty SVG shape).

    Args:
        tag: element name (letters, digits, ``-``); ``script``, ``style`` and the other raw-text elements are
            refused (the page's one ``<style>`` comes from `page`).
        attrs: attribute name -> value; a None value leaves the attribute out; every value is escaped
            (``str()`` of numbers included), ``on*`` and URL attributes (``href``, ``src``...) are refused.
        children: text or `Markup`; text is escaped.

    Raises:
        ValueError: a bad or refused element or attribute name (a bug in the report, never caused by data).
    """
    _checked_name(tag, "element")
    if tag.lower() in _RAW_TEXT:
        raise ValueError(f"the report builds no <{tag}> element")
    opening = f"<{tag}{_attributes(attrs or {})}"
    if not children and tag in _SELF_CLOSING:
        return Markup(opening + "/>")
    return Markup(f"{opening}>{join(children)}</{tag}>")


def page(title: object, css: str, body: Iterable[object], lang: str = "en") -> str:
    """The whole HTML document: ``<!DOCTYPE html>``, a head with ``title`` (escaped) and the page's own ``css``,
    then ``body`` (each part through `esc`). No script anywhere.

    Raises:
        ValueError: ``css`` could end its ``<style>`` element (holds ``</``); it is this package's constant.
    """
    if "</" in css or "<!--" in css:
        raise ValueError("the report's CSS must not hold '</' or '<!--' (it would end the <style> element)")
    style = Markup(f"<style>{css}</style>")  # the package's constant, checked above: it cannot end the element
    head = el("head", None, el("meta", {"charset": "utf-8"}), el("title", None, title), style)
    return "<!DOCTYPE html>\n" + el("html", {"lang": lang}, head, el("body", None, *body)) + "\n"


def css_color(value: object) -> str:
    """``value`` when it is a hex colour (``#rgb`` / ``#rrggbb``), the only colours the report writes into CSS.

    Raises:
        ValueError: anything else (a colour is never taken from data unchecked).
    """
    if not isinstance(value, str) or not _HEX_COLOR.match(value):
        raise ValueError(f"not a hex colour: {value!r:.80}")
    return value


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


def svg(width: float, height: float, *children: object, view_box: bool = False) -> Markup:
    """An ``<svg>`` root of the report's font, ``width`` x ``height`` px, holding ``children``."""
    attrs: dict[str, object] = {"xmlns": "http://www.w3.org/2000/svg", "width": width, "height": height}
    if view_box:
        attrs["viewBox"] = f"0 0 {width} {height}"
    attrs["style"] = f"{FONT};font-size:11px"
    return el("svg", attrs, *children)


def _frame(width: int, height: int, title: object, xlabel: object, ylabel: object, body: object) -> Markup:
    return svg(
        width,
        height,
        el(
            "text",
            {"x": f"{width / 2:.0f}", "y": 16, "text-anchor": "middle", "font-size": 13, "font-weight": 600},
            title,
        ),
        el("text", {"x": f"{width / 2:.0f}", "y": height - 4, "text-anchor": "middle"}, xlabel),
        el("text", {"transform": f"translate(12,{height / 2:.0f}) rotate(-90)", "text-anchor": "middle"}, ylabel),
        body,
        view_box=True,
    )


def _axes(
    x0: float, y0: float, w: float, h: float, xt: Sequence[tuple[float, object]], yt: Sequence[tuple[float, object]]
) -> Markup:
    """Axis lines, grid and tick labels; ticks given as (pixel, label)."""
    grid = el(
        "g",
        {"stroke": "#ddd"},
        *(el("line", {"x1": x0, "x2": x0 + w, "y1": f"{y:.1f}", "y2": f"{y:.1f}"}) for y, _ in yt),
    )
    parts = [grid, el("path", {"d": f"M{x0},{y0} V{y0 + h} H{x0 + w}", "fill": "none", "stroke": "#333"})]
    parts += [el("text", {"x": f"{x:.1f}", "y": y0 + h + 13, "text-anchor": "middle"}, lab) for x, lab in xt]
    parts += [el("text", {"x": x0 - 4, "y": f"{y + 3:.1f}", "text-anchor": "end"}, lab) for y, lab in yt]
    return join(parts)


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
) -> Markup:
    """An SVG line chart; ``series`` is a list of ``(label, x, y, colour)``."""
    left, right, top, bottom = 64, 16 + (120 if legend and len(series) > 1 else 0), 26, 34
    pw, ph = width - left - right, height - top - bottom
    xs = np.concatenate([s[1] for s in series]) if series else np.zeros(0)
    ys = np.concatenate([s[2] for s in series]) if series else np.zeros(0)
    ok = np.isfinite(ys) & ((ys > 0) if log_y else True)
    if not ok.any():
        no_data = el("text", {"x": width / 2, "y": height / 2, "text-anchor": "middle"}, "no data")
        return _frame(width, height, title, xlabel, ylabel, no_data)
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
        line = {"fill": "none", "stroke": color, "stroke-width": width_px, "stroke-opacity": 0.85, "points": pts}
        body.append(el("polyline", line, el("title", None, label)))
    if legend and len(series) > 1:
        shown = series[: max(1, (height - top - 24) // 12)]
        for i, (label, _, _, color) in enumerate(shown):
            row_y = top + 4 + i * 12
            body.append(el("rect", {"x": width - right + 10, "y": row_y, "width": 10, "height": 3, "fill": color}))
            body.append(el("text", {"x": width - right + 24, "y": row_y + 5}, label))
        if len(series) > len(shown):
            more = f"+{len(series) - len(shown)} more"
            body.append(el("text", {"x": width - right + 10, "y": top + 8 + len(shown) * 12}, more))
    return _frame(width, height, title, xlabel, ylabel, join(body))


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
) -> Markup:
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
            bar = {
                "x": f"{left + i * bw:.1f}",
                "y": f"{top + ph - h:.1f}",
                "width": f"{max(bw - 1, 0.5):.1f}",
                "height": f"{h:.1f}",
                "fill": color,
            }
            body.append(el("rect", bar, el("title", None, f"{fmt(edges[i] * scale)}-{fmt(edges[i + 1] * scale)}: {c}")))
    step = max(1, n // 4)
    xt = [(left + i * bw, fmt(edges[i] * scale, 3)) for i in range(0, n + 1, step)]
    yt = [(top + ph - t / cmax * ph, fmt(t)) for t in nice_ticks(0, cmax, 4) if t == int(t)]  # counts are whole
    return _frame(width, height, title, xlabel, "events", join([_axes(left, top, pw, ph, xt, yt), *body]))
