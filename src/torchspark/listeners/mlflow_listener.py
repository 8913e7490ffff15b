"""MLflow tracking for torchspark fits (the ``[mlflow]`` extra: ``pip install 'torchspark[mlflow]'``).

One MLflow run per fit:

  1. at the start, the training master's settings as params ``master.<name>`` and the network's as
     ``network.<name>`` (nested settings flattened with dots: ``master.threshold_algorithm.initial``);
  2. per epoch, metrics ``epoch_score``, ``epoch_examples_per_second``, ``epoch_seconds`` and, for gradient
     sharing, ``epoch_bytes_sent`` / ``epoch_dense_bytes`` (step = the network's epoch counter); with
     ``log_every`` > 0 also ``score`` and ``examples_per_second`` every ``log_every``-th progress report;
  3. at the end, ``fit_score``, ``fit_seconds`` and ``fit_examples``; the trained model as an MLflow PyTorch model
     under ``model/`` (``mlflow.pyfunc.load_model("runs:/<run_id>/model")``, ``mlflow.pyfunc.spark_udf``,
     ``mlflow.register_model``); torchspark's own ``Network.save`` directory under ``torchspark-network/``
     (safetensors: ``Network.load`` resumes training from it); the stats timeline ``stats.html`` and
     ``stats.json`` when the fit collected stats; and the run's status (FINISHED, or FAILED when the fit failed).

A fit called inside an active run (``with mlflow.start_run():``) logs into a nested run of it (a child run in the
parent's experiment: one child per fit, so two fits never collide on a parameter); otherwise the run is a new
top-level run in ``experiment``. The listener writes through an explicit ``MlflowClient`` and never starts, ends or
changes the caller's active run.

The MLflow model is ``mlflow.pytorch``'s own format: the module is stored with ``torch.save`` (pickle), as every
MLflow PyTorch model is; turning ``log_model`` on is the choice of that format (torchspark's own save beside it
stays pickle-free). Loading it needs the module's class importable (torchspark's ``models`` or your package).

Tracking URIs are passed to MLflow as they are (``databricks``, ``databricks://profile``, ``sqlite:///mlflow.db``,
``http(s)://host:port``...); only a plain path or a ``file:`` URI is checked as a local directory. The ``[mlflow]``
extra brings SQLAlchemy and Alembic, so a local ``sqlite:`` store (MLflow 3's default, ``sqlite:///mlflow.db``)
works; a ``file:`` store needs ``MLFLOW_ALLOW_FILE_STORE=true`` since MLflow 3 (refused at construction otherwise).
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


#: tracking URIs without a ``scheme:`` that MLflow understands (never taken for a local directory)
MLFLOW_URI_WORDS = frozenset({"databricks", "databricks-uc", "uc"})
#: schemes MLflow opens with SQLAlchemy (the ``[mlflow]`` extra brings it)
SQL_SCHEMES = frozenset({"sqlite", "postgresql", "mysql", "mssql"})


def uri_scheme(uri: str) -> str:
    """``"sqlite:///x.db"`` -> ``"sqlite"``; ``""`` for a plain path (``C:\\runs`` included: one letter is a drive)."""
    head, sep, _ = uri.partition(":")
    if not sep or len(head) == 1 or not head.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return ""
    return head.lower().split("+", 1)[0]


def local_store_path(uri: str) -> str | None:
    """The directory of a local file store (a plain path or ``file:`` URI); None for any other tracking URI."""
    scheme = uri_scheme(uri)
    if scheme == "file":
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(uri).path)
    if scheme or uri in MLFLOW_URI_WORDS:
        return None
    return uri


def _check_store(uri: str) -> None:
    """Refuse a tracking store the fit could not use (unreachable server, uncreatable local directory, a SQL store
    without SQLAlchemy). Any other URI (``databricks``, ``databricks://profile``...) is MLflow's to resolve."""
    scheme = uri_scheme(uri)
    path = local_store_path(uri)
    if scheme in ("http", "https"):
        check_reachable(uri, "MlflowListener tracking_uri")
    elif path is not None:
        check_directory(path, "MlflowListener tracking_uri")
    elif scheme in SQL_SCHEMES:
        import importlib.util

        missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"MlflowListener tracking_uri {uri!r} is a SQL store, which needs {' and '.join(missing)} "
                "(mlflow-skinny alone has no SQL store): pip install 'torchspark[mlflow]' (it brings them)"
            )


def _open_client(tracking: Any, tracking_uri: str | None, uri: str) -> Any:
    """An ``MlflowClient`` for ``tracking_uri`` with its store opened now, so a store MLflow refuses (a file store
    without ``MLFLOW_ALLOW_FILE_STORE``, an unsupported URI) fails at construction, not after the fit."""
    try:
        client = tracking.MlflowClient(tracking_uri=tracking_uri)
        client._tracking_client.store  # noqa: B018  (builds the store: the file-store gate, the SQL schema)
    except Exception as e:
        path = local_store_path(uri)
        if path is not None:
            fix = (
                "set MLFLOW_ALLOW_FILE_STORE=true in the environment (MLflow 3 keeps file stores in maintenance "
                "mode), or use a SQL store: tracking_uri='sqlite:///mlflow.db'"
            )
        elif uri_scheme(uri) in SQL_SCHEMES:
            fix = "check the database URI and that it is writable"
        else:
            fix = "pass a tracking URI this MLflow supports (sqlite:///mlflow.db, http(s)://host:port, databricks)"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"MlflowListener tracking_uri {uri!r}: MLflow refuses it ({first[:400]}): {fix}") from None
    return client


def _example_frame(example: Any, module: Any) -> Any:
    """The model's input example as a pandas DataFrame of double columns ``f0..f{n-1}`` (None when unknown).

    Double, not float: Spark's numeric columns are doubles and MLflow's schema check refuses double -> float (it
    accepts float -> double); ``mlflow.pytorch`` converts the frame to float32 tensors itself.

    ``example``: a DataFrame (kept), a 2-D array or tensor (one column per feature), or None: a row of zeros when
    the module's first layer with weights is ``nn.Linear`` (its ``in_features`` columns)."""
    import numpy as np
    import pandas as pd
    import torch

    if example is None:
        first = next((m for m in module.modules() if getattr(m, "weight", None) is not None), None)
        if not isinstance(first, torch.nn.Linear):
            return None
        example = np.zeros((2, first.in_features))
    if isinstance(example, pd.DataFrame):
        return example
    arr = example.detach().cpu().numpy() if isinstance(example, torch.Tensor) else np.asarray(example)
    if arr.ndim != 2:
        raise ConfigError(
            f"MlflowListener input_example must be 2-D (examples x features) or a pandas DataFrame, got shape "
            f"{arr.shape}: models with other inputs log without an example (input_example=None)"
        )
    return pd.DataFrame(arr.astype(np.float64), columns=[f"f{i}" for i in range(arr.shape[1])])


def _scoring_module(network: Any) -> Any:
    """A CPU copy of the network's module in eval mode, followed by the loss's output activation (softmax for
    cross entropy, sigmoid for ``bce_with_logits``) so the MLflow model predicts what ``network.output`` does."""
    import copy

    import torch

    module = copy.deepcopy(network.module).cpu().eval()
    names = [lo.name for lo in network.losses]
    if names == ["cross_entropy"]:
        return torch.nn.Sequential(module, torch.nn.Softmax(dim=1)).eval()
    if names == ["bce_with_logits"]:
        return torch.nn.Sequential(module, torch.nn.Sigmoid()).eval()
    return module


def save_mlflow_model(network: Any, path: str, input_example: Any = None) -> None:
    """Save ``network`` at ``path`` as an MLflow PyTorch model (``MLmodel``, the pickled module, requirements and,
    when known, an input example and signature). See the module docstring for the format choice."""
    import mlflow.pytorch
    import numpy as np
    import torch
    from mlflow.models import infer_signature

    module = _scoring_module(network)
    frame = _example_frame(input_example, network.module)
    signature = None
    if frame is not None:
        with torch.no_grad():
            out = module(torch.from_numpy(frame.to_numpy(dtype=np.float32))).numpy()
        signature = infer_signature(frame, out)
    requirements = list(mlflow.pytorch.get_default_pip_requirements())
    if any(type(m).__module__.startswith("torchspark.") for m in module.modules()):
        import torchspark

        requirements.append(f"torchspark=={torchspark.__version__}")
    # "pickle": the module as torch.save stores it (any nn.Module; MLflow's newer default "pt2" traces the graph
    # with torch.export, which needs a tensor example and refuses data-dependent control flow)
    mlflow.pytorch.save_model(
        module,
        path,
        signature=signature,
        input_example=frame,
        pip_requirements=requirements,
        serialization_format="pickle",
    )


class MlflowListener(TrainingListener):
    """Logs each fit as an MLflow run.

    Args:
        tracking_uri: where runs go, any URI MLflow understands (``sqlite:///mlflow.db``, ``http://host:5000``,
            ``databricks``, ``databricks://profile``, ``file:///path/mlruns``); None = MLflow's own default
            (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working directory).
        experiment: experiment name, created when missing (a fit inside an active run logs a nested run in the
            parent run's experiment instead).
        run_name: the runs' name (None: MLflow picks one).
        log_model: log the trained network as an MLflow PyTorch model under ``model/`` (pickled by
            ``mlflow.pytorch``, MLflow's format) and torchspark's safetensors save under ``torchspark-network/``
            (about 8 bytes per parameter per fit in all).
        input_example: a few input rows for the MLflow model's example and signature: a pandas DataFrame, or a 2-D
            array / tensor (columns named ``f0..f{n-1}``); None derives a row of zeros from a first ``nn.Linear``
            layer, else logs the model without a signature.
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
            path) that cannot be created or that MLflow refuses (a ``file:`` store without
            ``MLFLOW_ALLOW_FILE_STORE=true``), or a SQL store (``sqlite:``...) without SQLAlchemy; checked here, so a
            fit never starts against them.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "torchspark",
        run_name: str | None = None,
        log_model: bool = True,
        input_example: Any = None,
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
        uri = tracking_uri if tracking_uri is not None else tracking.get_tracking_uri()
        _check_store(uri)
        self.client = _open_client(tracking, tracking_uri, uri)
        self.tracking_uri = uri
        self.input_example = input_example
        self.experiment, self.run_name = experiment, run_name
        self.log_model, self.log_stats, self.log_every = log_model, log_stats, log_every
        self.tags = dict(tags or {})
        self.run_ids: list[str] = []  # one per fit, in order
        self._run_id: str | None = None
        self._reports = 0
        self._parent: tuple[str, str] | None = None  # (run id, experiment id) of the caller's active run

    @property
    def run_id(self) -> str | None:
        """The run of the current (or last) fit."""
        return self._run_id

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        return found.experiment_id if found is not None else self.client.create_experiment(self.experiment)

    # 1. start
    def on_fit_called(self, event: FitStarted) -> None:
        """On the thread that called ``fit()``: remember its active MLflow run (MLflow's active run is per thread),
        when that run lives in this listener's tracking store."""
        import mlflow

        active = mlflow.active_run()
        same_store = mlflow.get_tracking_uri() == self.tracking_uri
        self._parent = (active.info.run_id, active.info.experiment_id) if active is not None and same_store else None

    def on_fit_start(self, event: FitStarted) -> None:
        tags = {"torchspark.runner": event.runner, "torchspark.master": str(event.master.get("type")), **self.tags}
        if self._parent is not None:
            from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

            parent_id, experiment_id = self._parent
            tags[MLFLOW_PARENT_RUN_ID] = parent_id
        else:
            experiment_id = self._experiment_id()
        run = self.client.create_run(experiment_id, run_name=self.run_name, tags=tags)
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
                    save_mlflow_model(event.network, model_dir, self.input_example)
                    self.client.log_artifacts(run_id, model_dir, "model")
                    self._log_network(run_id, event.network, os.path.join(tmp, "torchspark-network"))
                if self.log_stats and event.stats is not None:
                    html, js = os.path.join(tmp, "stats.html"), os.path.join(tmp, "stats.json")
                    event.stats.export_html(html)
                    with open(js, "w", encoding="utf-8") as f:
                        f.write(event.stats.to_json())
                    self.client.log_artifact(run_id, html)
                    self.client.log_artifact(run_id, js)
        finally:
            self.client.set_terminated(run_id, "FAILED" if event.error is not None else "FINISHED")

    def _log_network(self, run_id: str, network: Any, path: str) -> None:
        """torchspark's safetensors save beside the MLflow model; a module it cannot save without pickle is
        skipped (logged): the MLflow model above already holds it."""
        from torchspark.errors import SerializationError

        try:
            network.save(path)
        except SerializationError as e:
            log.warning("MlflowListener: torchspark-network/ not logged (%s); the MLflow model is", e)
            return
        self.client.log_artifacts(run_id, path, "torchspark-network")
