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


def payload_from_json(p: dict[str, Any]) -> dict[str, Any]:
    """The collector-style payload `payload_to_json` wrote, its lists as typed arrays again (null -> NaN)."""
    floats = lambda v: np.array([math.nan if x is None else float(x) for x in v], dtype=np.float64)  # noqa: E731
    ph, sc, enc = p["phases"], p["scores"], p["encoding"]
    return {
        "format": PAYLOAD_FORMAT,
        "worker": p["worker"],
        "clock_offset": p["clock_offset"],
        "phases": {
            "names": ph["names"],
            "code": np.array(ph["code"], dtype=np.int32),
            "start": floats(ph["start"]),
            "duration": floats(ph["duration"]),
            "attrs": {k: floats(v) for k, v in ph["attrs"].items()},
        },
        "scores": {"iteration": np.array(sc["iteration"], dtype=np.int64), "score": floats(sc["score"])},
        "encoding": {
            **{k: np.array(enc[k], dtype=np.int64) for k in ENCODING_INT_COLUMNS},
            **{k: floats(enc[k]) for k in ENCODING_FLOAT_COLUMNS},
            "format": np.array(enc["format"], dtype=np.int32),
            "format_names": enc["format_names"],
        },
    }


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


def checked_summary(fields: Any) -> dict[str, Any]:
    """``summary_fields`` of a stats document, refused (ValueError naming the field) when a field has the wrong
    type: a number field that is not a number, ``worker_ids`` not a list of strings, ``failures`` not a list of
    objects."""
    if not isinstance(fields, dict):
        raise ValueError(f"summary_fields must be an object, got {type(fields).__name__}")
    for key in NUMERIC_SUMMARY:
        value = fields.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"summary field {key!r} must be a number or null, got {value!r:.80}")
    ids = fields.get("worker_ids", [])
    if not isinstance(ids, list) or not all(isinstance(w, str) for w in ids):
        raise ValueError(f"summary field 'worker_ids' must be a list of strings, got {ids!r:.80}")
    failures = fields.get("failures", [])
    if failures is not None and (not isinstance(failures, list) or not all(isinstance(f, dict) for f in failures)):
        raise ValueError(f"summary field 'failures' must be a list of objects, got {failures!r:.80}")
    for failure in failures or ():
        for key in ("started", "time"):
            value = failure.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"summary field 'failures' has {key}={value!r:.80}, expected a number")
    return dict(fields)
