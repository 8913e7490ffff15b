"""MLflow tracking for torchspark fits (the ``[mlflow]`` extra: ``pip install 'torchspark[mlflow]'``).

One MLflow run per fit:

  1. at the start, the training master's settings as params ``master.<name>`` and the network's as
     ``network.<name>`` (nested settings flattened with dots: ``master.threshold_algorithm.initial``);
  2. per epoch, metrics ``epoch_score``, ``epoch_examples_per_second``, ``epoch_seconds`` and, for gradient
     sharing, ``epoch_bytes_sent`` / ``epoch_dense_bytes`` (step = the network's epoch counter); with
     ``log_every`` > 0 also ``score`` and ``examples_per_second`` every ``log_every``-th progress report;
  3. at the end, ``fit_score``, ``fit_seconds`` and ``fit_examples``, the trained model (``Network.save``
     directory) under ``model/``, the stats timeline ``stats.html`` and ``stats.json`` when the fit collected
     stats, and the run's status (FINISHED, or FAILED when the fit failed).

It talks to MLflow through an explicit ``MlflowClient`` (no global active run, so it never interferes with the
caller's runs). A local file store needs ``MLFLOW_ALLOW_FILE_STORE=true`` in the environment since MLflow 3.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Any

from torchspark.errors import ConfigError
from torchspark.listeners.events import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingListener
from torchspark.listeners.places import check_directory, check_reachable
from torchspark.validation import check_float

__all__ = ["MlflowListener", "flatten_params"]

log = logging.getLogger(__name__)

#: MLflow refuses longer param values; longer ones are cut (the full master JSON is also logged as an artifact)
MAX_PARAM_CHARS = 6000


def flatten_params(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": "1", "c": "[1, 2]"}`` (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


def _mlflow() -> Any:
    try:
        import mlflow.tracking
    except ImportError as e:
        raise ConfigError("MlflowListener needs MLflow: pip install 'torchspark[mlflow]' (mlflow-skinny)") from e
    return mlflow.tracking


def _check_store(uri: str) -> None:
    """Refuse a tracking store the fit could not use (unreachable server, uncreatable local directory)."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme in ("http", "https"):
        check_reachable(uri, "MlflowListener tracking_uri")
    elif scheme == "file" or (not scheme and ":" not in uri):  # a file:// URI or a plain local path
        from urllib.parse import unquote, urlsplit

        check_directory(unquote(urlsplit(uri).path) if scheme else uri, "MlflowListener tracking_uri")


class MlflowListener(TrainingListener):
    """Logs each fit as an MLflow run.

    Args:
        tracking_uri: where runs go (``file:///path/mlruns``, ``http://host:5000``, ``databricks``); None = MLflow's
            own default (``MLFLOW_TRACKING_URI``).
        experiment: experiment name, created when missing.
        run_name: the runs' name (None: MLflow picks one).
        log_model: log the trained network as the ``model/`` artifact (weights as safetensors: about 4 bytes
            per parameter per fit).
        log_stats: log ``stats.html`` / ``stats.json`` when the fit collected training stats.
        log_every: also log per-iteration ``score`` / ``examples_per_second`` every this many progress reports
            (0 = per-epoch metrics only). Each is one tracking call on the driver's progress thread: keep it at
            0 or >= 10 against a remote server.
        tags: extra tags for every run.
        end_timeout_s: how long the end of a fit waits for the final metrics, the model upload and the run's
            status ([`TrainingListener.end_timeout_s`][torchspark.listeners.TrainingListener.end_timeout_s]). Raise it for large models on a slow link (e.g.
            ``600.0``). A server seen hung (a call stuck for `HUNG_CALL_S` when the
            fit ends, or again after an earlier fit's end gave up on it) delays ``fit()`` by at most
            [`TrainingListener.hung_end_timeout_s`][torchspark.listeners.TrainingListener.hung_end_timeout_s] (10 s) instead.

    Raises:
        ConfigError: an ``http(s)://`` tracking server that does not accept a connection within
            `CONNECT_TIMEOUT_S` seconds, or a local store (``file://`` or a
            path) that cannot be created; checked here, so a fit never starts against them.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "torchspark",
        run_name: str | None = None,
        log_model: bool = True,
        log_stats: bool = True,
        log_every: int = 0,
        tags: dict[str, str] | None = None,
        end_timeout_s: float = 120.0,
    ) -> None:
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 0:
            raise ConfigError(
                f"MlflowListener: log_every must be an integer >= 0 (0 = per epoch only), got {log_every!r}"
            )
        if not isinstance(experiment, str) or not experiment:
            raise ConfigError(f"MlflowListener: experiment must be a non-empty name, got {experiment!r}")
        self.end_timeout_s = check_float(
            "end_timeout_s", end_timeout_s, above=0, finite=True, owner="MlflowListener", unit="seconds"
        )
        tracking = _mlflow()
        _check_store(tracking_uri if tracking_uri is not None else tracking.get_tracking_uri())
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.experiment, self.run_name = experiment, run_name
        self.log_model, self.log_stats, self.log_every = log_model, log_stats, log_every
        self.tags = dict(tags or {})
        self.run_ids: list[str] = []  # one per fit, in order
        self._run_id: str | None = None
        self._reports = 0

    @property
    def run_id(self) -> str | None:
        """The run of the current (or last) fit."""
        return self._run_id

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        return found.experiment_id if found is not None else self.client.create_experiment(self.experiment)

    # 1. start
    def on_fit_start(self, event: FitStarted) -> None:
        tags = {"torchspark.runner": event.runner, "torchspark.master": str(event.master.get("type")), **self.tags}
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name, tags=tags)
        self._run_id, self._reports = run.info.run_id, 0
        self.run_ids.append(self._run_id)
        params = {
            **flatten_params(event.master, "master."),
            **flatten_params(event.network, "network."),
            "epochs": str(event.epochs),
            "num_workers": str(event.num_workers),
        }
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self._run_id, params=items[i : i + 100])

    # 2. progress and epochs
    def on_iteration(self, event: IterationEvent) -> None:
        self._reports += 1
        if self._run_id is None or not self.log_every or self._reports % self.log_every:
            return
        self._log_metrics({"score": event.score, "examples_per_second": event.examples_per_second}, event.iteration)

    def on_epoch_end(self, event: EpochEvent) -> None:
        if self._run_id is None:
            return
        metrics = {
            "epoch_score": event.score,
            "epoch_examples_per_second": event.examples_per_second,
            "epoch_seconds": event.seconds,
            "epoch_examples": float(event.examples),
        }
        if event.dense_bytes:
            metrics.update(epoch_bytes_sent=float(event.bytes_sent), epoch_dense_bytes=float(event.dense_bytes))
        self._log_metrics(metrics, event.epoch)

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self._run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    # 3. end
    def on_fit_end(self, event: FitEnded) -> None:
        if self._run_id is None:
            return
        run_id = self._run_id
        try:
            self._log_metrics(
                {"fit_score": event.score, "fit_seconds": event.seconds, "fit_examples": float(event.examples)},
                event.network.epoch,
            )
            with tempfile.TemporaryDirectory(prefix="torchspark-mlflow-") as tmp:
                if self.log_model and event.error is None:
                    model_dir = os.path.join(tmp, "model")
                    event.network.save(model_dir)
                    self.client.log_artifacts(run_id, model_dir, "model")
                if self.log_stats and event.stats is not None:
                    html, js = os.path.join(tmp, "stats.html"), os.path.join(tmp, "stats.json")
                    event.stats.export_html(html)
                    with open(js, "w", encoding="utf-8") as f:
                        f.write(event.stats.to_json())
                    self.client.log_artifact(run_id, html)
                    self.client.log_artifact(run_id, js)
        finally:
            self.client.set_terminated(run_id, "FAILED" if event.error is not None else "FINISHED")
