"""The JSON document of [`TrainingStats`][torchspark.stats.TrainingStats]: payloads to JSON and back, and the checks of
its summary fields.

A document is ``{"format", "summary_fields", "workers", "phases", "formats", "payloads"}``; each payload is a
collector payload ([`drain`][torchspark.stats.StatsCollector.drain]) whose arrays are JSON lists. JSON has no NaN
and no infinity, so NaN is written as null and +-inf as ``"inf"``/``"-inf"``; a document read back is checked
field by field (`checked_summary`), so a damaged file fails when it is read, not when the report is drawn.

Example::

    doc = [payload_to_json(p) for p in payloads]           # json.dumps(doc, allow_nan=False) works
    payloads = [payload_from_json(p) for p in doc]         # arrays again, NaN where null was
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchspark.stats.events import PAYLOAD_FORMAT

__all__ = [
    "ENCODING_INT_COLUMNS",
    "ENCODING_FLOAT_COLUMNS",
    "NUMERIC_SUMMARY",
    "payload_to_json",
    "payload_from_json",
    "checked_summary",
    "checked_document",
]

#: the integer and the float columns of a payload's ``encoding`` series (besides ``format`` and ``worker``)
ENCODING_INT_COLUMNS = ("step", "bytes_sent", "dense_bytes")
ENCODING_FLOAT_COLUMNS = ("sparsity", "threshold")


def payload_to_json(obj: Any) -> Any:
    """A payload (or any part of one) with its arrays as JSON lists: NaN becomes null, +-inf the strings
    ``"inf"``/``"-inf"`` (JSON has neither)."""
    if isinstance(obj, dict):
        return {k: payload_to_json(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        values = obj.tolist()
        if obj.dtype.kind == "f" and not np.isfinite(obj).all():
            # JSON has no NaN/inf: NaN -> null, +-inf -> "inf"/"-inf"
            values = [None if math.isnan(v) else (str(v) if math.isinf(v) else v) for v in values]
        return values
    return obj


def payload_from_json(p: Any, where: str = "payload") -> dict[str, Any]:
    """The collector-style payload `payload_to_json` wrote, its lists as typed arrays again (null -> NaN),
    checked field by field first: the types, and the ranges the report relies on (finite starts, durations >= 0,
    phase and format codes that index their names, columns of one length).

    Raises:
        ValueError: a field is missing or wrong; the message names it as ``{where}.phases.start[3]`` with its value.
    """
    p = _object(p, where)
    _text(_field(p, "worker", where), f"{where}.worker")
    offset = p.get("clock_offset", 0.0)
    _number(offset, f"{where}.clock_offset", "a finite number of seconds")
    ph = _object(_field(p, "phases", where), f"{where}.phases")
    names = _texts(_field(ph, "names", f"{where}.phases"), f"{where}.phases.names")
    at = f"{where}.phases"
    code = _int_column(_field(ph, "code", at), f"{at}.code", 0, len(names), f"a phase code in [0, {len(names)})")
    start = _float_column(_field(ph, "start", at), f"{at}.start", finite=True)
    duration = _float_column(_field(ph, "duration", at), f"{at}.duration", finite=True, minimum=0.0)
    attrs_in = _object(ph.get("attrs", {}), f"{at}.attrs")
    # ``examples`` is summed into summary()["examples"] (an int): finite and >= 0 there; others may be NaN/inf
    attrs = {
        k: _float_column(v, f"{at}.attrs.{k}", finite_or_null=k == "examples", minimum=0.0 if k == "examples" else None)
        for k, v in attrs_in.items()
    }
    _same_length(
        at, {"code": code, "start": start, "duration": duration, **{f"attrs.{k}": v for k, v in attrs.items()}}
    )
    sc = _object(_field(p, "scores", where), f"{where}.scores")
    iteration = _int_column(_field(sc, "iteration", f"{where}.scores"), f"{where}.scores.iteration", None, None, "")
    score = _float_column(_field(sc, "score", f"{where}.scores"), f"{where}.scores.score")
    _same_length(f"{where}.scores", {"iteration": iteration, "score": score})
    at = f"{where}.encoding"
    enc = _object(_field(p, "encoding", where), at)
    format_names = _texts(_field(enc, "format_names", at), f"{at}.format_names")
    columns: dict[str, np.ndarray] = {
        **{k: _int_column(_field(enc, k, at), f"{at}.{k}", 0, None, "") for k in ENCODING_INT_COLUMNS},
        **{k: _float_column(_field(enc, k, at), f"{at}.{k}") for k in ENCODING_FLOAT_COLUMNS},
    }
    columns["format"] = _int_column(
        _field(enc, "format", at), f"{at}.format", 0, len(format_names), f"a format code in [0, {len(format_names)})"
    )
    _same_length(at, columns)
    return {
        "format": PAYLOAD_FORMAT,
        "worker": p["worker"],
        "clock_offset": offset,
        "phases": {
            "names": names,
            "code": code.astype(np.int32),
            "start": start,
            "duration": duration,
            "attrs": attrs,
        },
        "scores": {"iteration": iteration, "score": score},
        "encoding": {
            **{k: columns[k] for k in (*ENCODING_INT_COLUMNS, *ENCODING_FLOAT_COLUMNS)},
            "format": columns["format"].astype(np.int32),
            "format_names": format_names,
        },
    }


# ---- field checks: each names the field (a path such as summary_fields.failures[0].started) and its value -----


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(where: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{where} = {_show(value)}, expected {expected}")


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where} has no field {key!r}")
    return obj[key]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(where, value, "a string")
    return value


def _texts(value: Any, where: str, *, unique: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise _bad(where, value, "a list of strings")
    for i, item in enumerate(value):
        _text(item, f"{where}[{i}]")
    if unique and len(set(value)) != len(value):
        twice = next(v for i, v in enumerate(value) if v in value[:i])
        raise _bad(where, value, f"names that differ ({twice!r} appears twice)")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(
    value: Any, where: str, expected: str, *, minimum: float | None = None, integer: bool = False, null: bool = False
) -> None:
    """A finite JSON number (an integer when ``integer``), ``>= minimum``; None only when ``null``."""
    if value is None and null:
        return
    ok = isinstance(value, int) if integer else _is_number(value)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or (minimum is not None and value < minimum):
        raise _bad(where, value, expected)


_INF = {"inf": math.inf, "-inf": -math.inf}


def _float_column(
    values: Any, where: str, *, finite: bool = False, finite_or_null: bool = False, minimum: float | None = None
) -> np.ndarray:
    """A list of numbers as float64: null is NaN, ``"inf"``/``"-inf"`` infinities (how `payload_to_json`
    writes them); ``finite`` refuses all three, ``finite_or_null`` the infinities."""
    if finite:
        expected = "a finite number"
    elif finite_or_null:
        expected = "a finite number or null"
    else:
        expected = 'a number, null, "inf" or "-inf"'
    if minimum is not None:
        expected += f" >= {minimum:g}"
    if not isinstance(values, list):
        raise _bad(where, values, f"a list of numbers ({expected})")
    out = np.empty(len(values), dtype=np.float64)
    for i, x in enumerate(values):
        if type(x) is float or type(x) is int:
            v = float(x)  # json.loads also reads NaN/Infinity literals: checked below
        elif x is None and not finite:
            out[i] = math.nan
            continue
        elif isinstance(x, str) and x in _INF and not (finite or finite_or_null):
            v = _INF[x]
        else:
            raise _bad(f"{where}[{i}]", x, expected)
        if ((finite or finite_or_null) and not math.isfinite(v)) or (minimum is not None and v < minimum):
            raise _bad(f"{where}[{i}]", x, expected)
        out[i] = v
    return out


def _int_column(values: Any, where: str, lo: int | None, hi: int | None, expected: str) -> np.ndarray:
    """A list of JSON integers in ``[lo, hi)`` (a None bound: open, within int64) as int64; ``expected`` says what
    a bad item should have been (default: from the bounds)."""
    low = -(2**63) if lo is None else lo
    high = 2**63 if hi is None else hi
    expected = expected or ("an integer" if lo is None else f"an integer >= {lo}")
    if not isinstance(values, list):
        raise _bad(where, values, f"a list of integers ({expected})")
    for i, x in enumerate(values):
        if type(x) is not int or not low <= x < high:
            raise _bad(f"{where}[{i}]", x, expected)
    return np.array(values, dtype=np.int64)


def checked_document(doc: dict[str, Any]) -> dict[str, Any]:
    """A whole stats document ([`to_json`][torchspark.stats.TrainingStats.to_json]) checked: ``workers``, ``phases``
    and ``formats`` lists of distinct strings, every payload (`payload_from_json`, returned as arrays) and
    ``summary_fields`` (`checked_summary`).

    Raises:
        ValueError: the first bad field, named as a path (``payloads[0].phases.start[3]``) with its value.
    """
    for key in ("workers", "phases", "formats", "payloads", "summary_fields"):
        _field(doc, key, "the document")
    payloads = doc["payloads"]
    if not isinstance(payloads, list):
        raise _bad("payloads", payloads, "a list of payload objects")
    return {
        "workers": _texts(doc["workers"], "workers", unique=True),
        "phases": _texts(doc["phases"], "phases", unique=True),
        "formats": _texts(doc["formats"], "formats", unique=True),
        "payloads": [payload_from_json(p, f"payloads[{i}]") for i, p in enumerate(payloads)],
        "summary_fields": checked_summary(doc["summary_fields"]),
    }


def _same_length(where: str, columns: dict[str, np.ndarray]) -> None:
    lengths = {k: len(v) for k, v in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{where} has columns of different lengths ({lengths}); every column holds one value per row")


#: summary fields that hold a number (or null) when set: what the HTML report formats as numbers
NUMERIC_SUMMARY = (
    "examples",
    "iterations",
    "minibatches",
    "epochs",
    "workers",
    "events",
    "wall_seconds",
    "bytes_sent",
    "dense_bytes",
    "compression_ratio",
    "mean_sparsity",
)


def checked_summary(fields: Any, where: str = "summary_fields") -> dict[str, Any]:
    """``summary_fields`` of a stats document, refused (ValueError naming the field and its value) when a field
    the report reads has the wrong type or range: a number field that is not a finite number >= 0 (or null),
    ``worker_ids`` not a list of strings, ``failures`` not a list of failure records (``attempt`` an integer >= 0,
    ``rank`` one or null, ``exit_status`` a string or null, ``reason`` a string, ``started`` <= ``time`` finite
    numbers of seconds...). Other fields may hold any JSON value (the report shows them as text)."""
    fields = _object(fields, where)
    for key in NUMERIC_SUMMARY:
        _number(fields.get(key), f"{where}.{key}", "a finite number >= 0 or null", minimum=0, null=True)
    if "worker_ids" in fields:
        _texts(fields["worker_ids"], f"{where}.worker_ids")
    failures = fields.get("failures")
    if failures is not None and not isinstance(failures, list):
        raise _bad(f"{where}.failures", failures, "a list of failure records or null")
    for i, failure in enumerate(failures or ()):
        _check_failure(failure, f"{where}.failures[{i}]")
    return dict(fields)


#: a failure record's fields (`FailureRecord`): (check, may be null)
_FAILURE_FIELDS: dict[str, tuple[str, bool]] = {
    "attempt": ("count", False),
    "rank": ("count", True),
    "pid": ("count", True),
    "reached_epoch": ("count", True),
    "reached_iteration": ("count", True),
    "executor": ("text", True),
    "exit_status": ("text", True),
    "reason": ("text", False),
    "time": ("seconds", False),
    "started": ("seconds", False),
}


def _check_failure(failure: Any, where: str) -> None:
    """One failure record: each known field of the right type when present (an unknown one is only shown)."""
    failure = _object(failure, where)
    for key, (kind, null) in _FAILURE_FIELDS.items():
        if key not in failure:
            continue
        value, at = failure[key], f"{where}.{key}"
        if kind == "text":
            if not (isinstance(value, str) or (null and value is None)):
                raise _bad(at, value, "a string or null" if null else "a string")
        elif kind == "count":
            _number(value, at, "an integer >= 0" + (" or null" if null else ""), minimum=0, integer=True, null=null)
        else:
            _number(value, at, "a finite number of seconds (time.time() on the driver)")
    if _is_number(failure.get("started")) and _is_number(failure.get("time")) and failure["started"] > failure["time"]:
        raise _bad(
            f"{where}.started", failure["started"], f"a time no later than the failure's time {failure['time']!r}"
        )
