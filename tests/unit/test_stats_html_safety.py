"""stats.html is safe by construction, and from_json checks every field the report reads (issue 44).

A stats.json shared by someone else with markup in every string field renders as text: the page holds the same
elements and attributes as the page of a harmless document, and no script, image or event handler.
"""

from __future__ import annotations

import ast
import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchspark.stats.html as html_module
from torchspark.errors import SerializationError
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.stats._svg import Markup, css_color, el, esc, join, page
from torchspark.stats.html import render_html

HOSTILE = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</text><script>")


class _Page(HTMLParser):
    """Every start tag with its attribute names, and all text, of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, tuple[str, ...]]] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, tuple(name for name, _ in attrs)))
        self.attrs += [(tag, name, value) for name, value in attrs]

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _stats(names: tuple[str, str, str], *, hostile_numbers: bool = False) -> TrainingStats:
    """Two workers, a custom phase, scores, encoding and a failure; every string the report shows is built from
    ``names``."""
    a, b, c = names
    collectors = [StatsCollector(f"worker-0{a}"), StatsCollector(f"worker-1{b}")]
    for w, col in enumerate(collectors):
        for it in range(4):
            col.record_phase("fit", 0.1, start=1000.0 + it, examples=8, iteration=it)
            col.record_phase(f"phase{a}", 0.05, start=1000.5 + it)
            col.record_score(it, 1.0 / (it + 1 + w))
            col.record_encoding(it, 100 + it, 4000, 0.01, 1e-3, f"sparse{b}")
    driver = StatsCollector("driver")
    driver.record_phase(f"driver{c}", 0.2, start=999.0)
    stats = TrainingStats.from_payloads([driver.drain(), *(col.drain() for col in collectors)])
    failure: dict[str, Any] = {
        "attempt": 0,
        "rank": 1,
        "executor": f"exec{a}",
        "pid": 4321,
        "exit_status": f"signal{b}",
        "reason": f"lost{c}",
        "time": 1002.0,
        "started": 1000.0,
        "reached_epoch": 0,
        "reached_iteration": 2,
    }
    failures = [failure, {**failure, "attempt": 1, "rank": None, "exit_status": None}]
    if hostile_numbers:  # only an in-memory summary can hold these: from_json refuses them
        failure.update(attempt=a, rank=b, pid=c, reached_epoch=c)
        failures.append({**failure, "attempt": 2, "time": a, "started": b})
        for key in ("examples", "epochs", "workers", "events", "wall_seconds", "bytes_sent", "mean_sparsity"):
            stats.set_summary(key, a)
    stats.set_summary("failures", failures)
    stats.set_summary("recovered_from", {"checkpoint": f"/ckpt{a}", "epoch": 0})
    stats.set_summary("executors", {"0": f"host{b}", "1": f"host{c}"})
    stats.set_summary("devices", {"0": f"cuda:0{a}"})
    stats.set_summary(f"note{c}", [a, b, c])  # a field name the report shows as is
    return stats


def _hostile_page(page_text: str) -> None:
    """No element, attribute or handler from data: nothing but the page's own tags, and the markup as text."""
    parsed = _Page(page_text)
    tags = {t for t, _ in parsed.tags}
    assert not tags & {"script", "img", "iframe", "object", "embed", "a", "image", "foreignobject"}, tags
    assert [t for t, _ in parsed.tags].count("style") == 1  # the page's own CSS; it has no script of its own
    assert not [(t, n) for t, n, _ in parsed.attrs if n.startswith("on") or n in ("href", "src", "xlink:href")]
    assert not [v for _, _, v in parsed.attrs if v and ("<" in v or "javascript:" in v)]
    text = "".join(parsed.text)
    for bad in HOSTILE:
        assert bad in text  # shown as text (escaped), not dropped


def test_a_shared_stats_json_with_markup_in_every_string_field_renders_as_text(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    _stats(HOSTILE).save_json(path)
    stats = TrainingStats.load_json(path)
    assert any(HOSTILE[0] in w for w in stats.worker_ids)  # the markup survived the round trip
    out = tmp_path / "stats.html"
    stats.export_html(out)
    text = out.read_text(encoding="utf-8")
    _hostile_page(text)
    # The same elements with the same attribute names as the page of a harmless document: no markup from data.
    _stats(("a", "b", "c")).save_json(tmp_path / "plain.json")
    plain = render_html(TrainingStats.load_json(tmp_path / "plain.json"))
    assert _Page(text).tags == _Page(plain).tags


def test_markup_in_numeric_summary_fields_and_failures_of_an_in_memory_summary_is_escaped() -> None:
    # set_summary takes any JSON value, so the renderer itself must escape (and survive) strings where numbers go
    hostile = render_html(_stats(HOSTILE, hostile_numbers=True), title=HOSTILE[2])
    _hostile_page(hostile)
    plain = render_html(_stats(("a", "b", "c"), hostile_numbers=True), title="c")
    assert _Page(hostile).tags == _Page(plain).tags
    assert "lost: attempt " + HOSTILE[0] in "".join(_Page(hostile).text)  # the failure mark's text, once a hole


def test_a_failure_without_times_draws_at_the_timeline_edges(tmp_path: Path) -> None:
    stats = _stats(("a", "b", "c"))
    stats.set_summary("failures", [{"attempt": 0, "rank": 0, "reason": "x", "started": None, "time": None}])
    stats.export_html(tmp_path / "r.html")  # was TypeError: float(None)
    marks = [a for a in _Page((tmp_path / "r.html").read_text()).attrs if a[1] == "class" and a[2] == "failure"]
    assert len(marks) == 1


def test_the_report_module_writes_markup_only_through_the_builder() -> None:
    """html.py holds no literal markup (no string with '<') and makes no Markup by hand: every tag comes from
    el()/page(), which escape every text and attribute value."""
    tree = ast.parse(Path(html_module.__file__).read_text(encoding="utf-8"))
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))]
    docstrings = {id(n.body[0].value) for n in scopes if n.body and isinstance(n.body[0], ast.Expr)}
    literal = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "<" in n.value and id(n) not in docstrings
    ]
    assert literal == []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Markup"]
    assert all(not c.args for c in calls)  # Markup() (empty) only


# ---- the builder ----------------------------------------------------------------------------------------------


def test_el_escapes_text_and_attribute_values_and_keeps_markup() -> None:
    got = el("text", {"x": 1.5, "title": '"><img src=x>', "skip": None}, "<b>", el("tspan", None, "&"))
    assert got == '<text x="1.5" title="&quot;&gt;&lt;img src=x&gt;">&lt;b&gt;<tspan>&amp;</tspan></text>'
    assert isinstance(got, Markup)
    assert el("rect", {"x": 0}) == '<rect x="0"/>' and el("i", {"class": "sw"}) == '<i class="sw"></i>'
    # A Markup glued with + is a plain str again: placed, it is escaped, never live
    assert el("p", None, el("b", None, "x") + "y") == "<p>&lt;b&gt;x&lt;/b&gt;y</p>"
    assert join([Markup("<br>"), "<br>"]) == "<br>&lt;br&gt;"
    assert esc(3) == "3" and esc(HOSTILE[2]) == "&lt;/text&gt;&lt;script&gt;"


@pytest.mark.parametrize(
    "tag, attrs",
    [
        ("script", {}),
        ("style", {}),
        ("text", {"onload": "x"}),
        ("text", {"OnClick": "x"}),
        ("a", {"href": "javascript:alert(1)"}),
        ("image", {"xlink:href": "x"}),
        ("text", {'x"y': "1"}),
        ("te xt", {}),
        ("img src=x", {}),
    ],
)
def test_el_refuses_script_handlers_urls_and_bad_names(tag: str, attrs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="report"):
        el(tag, attrs)


def test_page_and_css_color_refuse_what_could_break_out() -> None:
    text = page("<t>", "body{color:#000}", [el("p", None, "<x>")])
    assert text.startswith("<!DOCTYPE html>") and "<title>&lt;t&gt;</title>" in text and "<p>&lt;x&gt;</p>" in text
    with pytest.raises(ValueError, match="style"):
        page("t", "a{}</style><script>", [])
    assert css_color("#1f77b4") == "#1f77b4"
    for bad in ("red;background:url(http://x)", "#12345g", '#fff"', 3):
        with pytest.raises(ValueError, match="hex colour"):
            css_color(bad)


# ---- from_json checks every field the report reads ------------------------------------------------------------


def _doc() -> dict[str, Any]:
    return json.loads(_stats(("a", "b", "c")).to_json())


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``doc`` at a dotted path (``payloads.1.phases.start.0``; ``-key`` deletes the key)."""
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if last.startswith("-"):
        del node[last[1:]]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


# (path to change, value, what the message names: the field as a path, then the value as written)
BAD_FIELDS = [
    # the issue: a null start passed and export_html raised a raw TypeError
    ("summary_fields.failures.0.started", None, r"summary_fields\.failures\[0\]\.started = None, expected a finite"),
    ("summary_fields.failures.0.time", math.inf, r"failures\[0\]\.time = inf, expected a finite number of seconds"),
    ("summary_fields.failures.0.started", 2000.0, r"failures\[0\]\.started = 2000\.0, expected a time no later"),
    ("summary_fields.failures.0.attempt", HOSTILE[2], r"failures\[0\]\.attempt = '</text><script>', expected an int"),
    ("summary_fields.failures.0.attempt", -1, r"failures\[0\]\.attempt = -1, expected an integer >= 0"),
    ("summary_fields.failures.0.attempt", 1.5, r"failures\[0\]\.attempt = 1\.5, expected an integer"),
    ("summary_fields.failures.0.rank", "0", r"failures\[0\]\.rank = '0', expected an integer >= 0 or null"),
    ("summary_fields.failures.0.reason", 3, r"failures\[0\]\.reason = 3, expected a string"),
    (
        "summary_fields.failures.0.exit_status",
        ["x"],
        r"failures\[0\]\.exit_status = \['x'\], expected a string or null",
    ),
    ("summary_fields.failures.1", "lost", r"summary_fields\.failures\[1\] = 'lost', expected an object"),
    ("summary_fields.failures", {"a": 1}, r"summary_fields\.failures = \{'a': 1\}, expected a list of failure"),
    ("summary_fields.wall_seconds", "soon", r"summary_fields\.wall_seconds = 'soon', expected a finite number >= 0"),
    ("summary_fields.events", True, r"summary_fields\.events = True, expected a finite number"),
    ("summary_fields.workers", -2, r"summary_fields\.workers = -2, expected a finite number >= 0"),
    ("summary_fields.mean_sparsity", math.nan, r"summary_fields\.mean_sparsity = nan, expected a finite"),
    ("summary_fields.worker_ids", "w0", r"summary_fields\.worker_ids = 'w0', expected a list of strings"),
    ("summary_fields.worker_ids", ["w0", 1], r"summary_fields\.worker_ids\[1\] = 1, expected a string"),
    ("summary_fields", [1, 2], r"summary_fields = \[1, 2\], expected an object"),
    ("workers", ["driver", "driver"], r"workers = \['driver', 'driver'\], expected names that differ"),
    ("phases", "fit", r"phases = 'fit', expected a list of strings"),
    ("formats", [None], r"formats\[0\] = None, expected a string"),
    ("payloads", {}, r"payloads = \{\}, expected a list of payload objects"),
    ("payloads.1", 7, r"payloads\[1\] = 7, expected an object"),
    ("payloads.1.-scores", None, r"payloads\[1\] has no field 'scores'"),
    ("payloads.1.worker", 3, r"payloads\[1\]\.worker = 3, expected a string"),
    ("payloads.1.clock_offset", "0", r"payloads\[1\]\.clock_offset = '0', expected a finite number"),
    ("payloads.1.phases.names.0", ["fit"], r"payloads\[1\]\.phases\.names\[0\] = \['fit'\], expected a string"),
    ("payloads.1.phases.start.2", None, r"payloads\[1\]\.phases\.start\[2\] = None, expected a finite number"),
    ("payloads.1.phases.start.2", "soon", r"payloads\[1\]\.phases\.start\[2\] = 'soon', expected a finite number"),
    ("payloads.1.phases.duration.0", -0.1, r"phases\.duration\[0\] = -0\.1, expected a finite number >= 0"),
    ("payloads.1.phases.code.3", 9, r"payloads\[1\]\.phases\.code\[3\] = 9, expected a phase code in \[0, 2\)"),
    ("payloads.1.phases.code.3", 1.0, r"payloads\[1\]\.phases\.code\[3\] = 1\.0, expected a phase code"),
    ("payloads.1.phases.code", [0], r"payloads\[1\]\.phases has columns of different lengths \(\{'code': 1"),
    ("payloads.1.phases.attrs.examples.0", "inf", r"attrs\.examples\[0\] = 'inf', expected a finite number or null"),
    ("payloads.1.scores.score", "1.0", r"payloads\[1\]\.scores\.score = '1\.0', expected a list of numbers"),
    ("payloads.1.scores.iteration.0", True, r"payloads\[1\]\.scores\.iteration\[0\] = True, expected an integer"),
    ("payloads.1.encoding.bytes_sent.0", -5, r"encoding\.bytes_sent\[0\] = -5, expected an integer >= 0"),
    (
        "payloads.1.encoding.format.0",
        1,
        r"payloads\[1\]\.encoding\.format\[0\] = 1, expected a format code in \[0, 1\)",
    ),
    ("payloads.1.encoding.format_names", "sparse", r"encoding\.format_names = 'sparse', expected a list of strings"),
]


@pytest.mark.parametrize("path, value, message", BAD_FIELDS, ids=[f"{p}={v!r:.20}" for p, v, _ in BAD_FIELDS])
def test_a_bad_field_is_a_serialization_error_naming_the_file_the_field_and_the_value(
    tmp_path: Path, path: str, value: Any, message: str
) -> None:
    doc = _doc()
    _set(doc, path, value)
    file = tmp_path / "shared-stats.json"
    file.write_text(json.dumps(doc), encoding="utf-8")  # json writes NaN/Infinity literals, which json reads back
    with pytest.raises(SerializationError, match=f"training stats JSON '{file}' is damaged: .*{message}") as err:
        TrainingStats.load_json(file)
    assert "save_json" in str(err.value)
    with pytest.raises(SerializationError, match=f"training stats JSON is damaged: .*{message}"):
        TrainingStats.from_json(json.dumps(doc))


def test_every_document_to_json_writes_passes_the_checks(tmp_path: Path) -> None:
    stats = _stats(("a", "b", "c"))
    c = StatsCollector("worker-9")
    c.record_score(1, float("nan"))
    c.record_score(2, float("inf"))
    c.record_phase("fit", 0.0, start=1000.0, loss=float("inf"), examples=0)
    c.record_encoding(0, 0, 0, float("nan"), float("inf"), "empty")
    stats.merge([c.drain()])
    stats.set_summary("compression_ratio", None)
    stats.save_json(tmp_path / "s.json")
    back = TrainingStats.load_json(tmp_path / "s.json")
    assert back.to_json() == stats.to_json()
    sc = back.scores()
    assert np.isinf(sc.score).sum() == 1 and np.isnan(sc.score).sum() == 1


def test_an_unreadable_stats_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="cannot read training stats JSON .*missing.json"):
        TrainingStats.load_json(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SerializationError, match="bin.json"):
        TrainingStats.load_json(tmp_path / "bin.json")
