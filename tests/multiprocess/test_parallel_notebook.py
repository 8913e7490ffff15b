"""ParallelWrapper from a notebook cell: the network's module class is defined in ``__main__``, and that
``__main__`` has no file (a Jupyter kernel's user namespace; ``python -c`` gives the same), so workers can neither
re-import the caller's main module nor find the class by name. The fit still trains, and an MlflowListener logs
the user module as an MLflow model that ``mlflow.pyfunc`` loads back and that predicts what the network does."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

CELL = r"""
import json, sys
import numpy as np
import pandas as pd
import torch
from torch import nn
from torchspark import Network, datasets, optim
from torchspark.parallel import ParallelWrapper

assert getattr(sys.modules["__main__"], "__file__", None) is None  # as in a notebook kernel

class CellNet(nn.Module):  # defined in the cell: only __main__ knows it
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))

data = datasets.synthetic_classification(128, 4, 2, seed=0)
net = Network(CellNet(), updater=optim.Adam(lr=1e-2), seed=0)
before = net.params().clone()
wrapper = ParallelWrapper(net, num_workers=2, progress=None, training_mode="averaging", averaging_frequency=2)
listener = None
if sys.argv[1] != "-":
    from torchspark.listeners.mlflow_listener import MlflowListener
    listener = MlflowListener(tracking_uri=sys.argv[1], experiment="notebook", log_stats=False)
    wrapper.add_training_listener(listener)
wrapper.fit(data, epochs=2, batch_size=8)
result = {"changed": not torch.equal(before, net.params()), "score": float(net.score(data))}
if listener is not None:
    import mlflow
    mlflow.set_tracking_uri(sys.argv[1])
    model = mlflow.pyfunc.load_model(f"runs:/{listener.run_id}/model")
    frame = pd.DataFrame(data.features[:5].numpy(), columns=["f0", "f1", "f2", "f3"])
    got = np.asarray(model.predict(frame))
    result["max_diff"] = float(np.abs(got - net.output(data.features[:5]).numpy()).max())
print(json.dumps(result))
"""


def test_parallel_wrapper_trains_a_module_defined_in_a_notebook_cell(tmp_path: pathlib.Path) -> None:
    mlflow_args = ["-"]
    if all(__import__("importlib").util.find_spec(m) for m in ("mlflow", "sqlalchemy")):
        mlflow_args = [f"sqlite:///{tmp_path / 'mlflow.db'}"]
    proc = subprocess.run(
        [sys.executable, "-c", CELL, *mlflow_args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["changed"] and result["score"] < 10
    if mlflow_args != ["-"]:
        assert result["max_diff"] == pytest.approx(0.0, abs=1e-5)
