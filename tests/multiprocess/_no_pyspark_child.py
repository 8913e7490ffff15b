"""Run by test_without_pyspark.py in a child Python whose ``sitecustomize`` blocks pyspark and py4j: the core of
torchspark (Network, both masters through ParallelWrapper, the codec, evaluation, ``torchspark train --parallel``)
must work, and nothing may even try to import pyspark, until a Spark route of the CLI is asked for."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile

import torch

BLOCKER = next(f for f in sys.meta_path if type(f).__name__ == "NoSpark")  # installed by the sitecustomize


def core() -> None:
    import torchspark
    from torchspark import DataSet, Evaluation, Network, ParameterAveragingTrainingMaster, SharedTrainingMaster, models
    from torchspark.encoding import FixedThreshold, decode, from_bytes, threshold_encode, to_bytes
    from torchspark.parallel import ParallelWrapper

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    data = DataSet(x, (x[:, 0] > 0).long())
    for master in (
        ParameterAveragingTrainingMaster(batch_size_per_worker=8, averaging_frequency=2),
        SharedTrainingMaster(batch_size_per_worker=8, threshold_algorithm=FixedThreshold(1e-4)),
    ):
        net = Network(models.mlp(6, 8, 2), seed=0)
        before = net.params().clone()
        ParallelWrapper(net, num_workers=2, master=master, progress=False).fit(data, epochs=1)
        assert not torch.equal(before, net.params()), f"{master.kind}: the fit changed nothing"
        evaluation = net.evaluate(data, Evaluation())
        assert 0.0 <= evaluation.accuracy() <= 1.0
    update = torch.randn(1000, generator=g)
    residual = torch.zeros(1000)
    message = from_bytes(to_bytes(threshold_encode(update, residual, 1.0)))
    restored = decode(message, residual.clone())
    torch.testing.assert_close(restored, update)  # sent steps + what stayed behind = the update
    assert torchspark.__version__


def cli_parallel() -> None:
    from torchspark import cli

    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(
            [
                "train",
                "--parallel",
                "--model",
                "mlp",
                "--epochs",
                "1",
                "--num-workers",
                "2",
                "--training-mode",
                "averaging",
                "--no-progress",
                "--output",
                out,
            ]
        )
    assert rc == 0, rc


def cli_spark_route() -> str:
    """``torchspark train`` without --parallel is the Spark route: exit code 1 (a SetupError: the environment lacks pyspark; 2 is for usage errors) and a message naming the fix."""
    from torchspark import cli

    err = io.StringIO()
    with (
        tempfile.TemporaryDirectory() as out,
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        rc = cli.main(["train", "--model", "mlp", "--epochs", "1", "--num-workers", "2", "--output", out])
    assert rc == 1, rc
    return err.getvalue()


if __name__ == "__main__":
    core()
    cli_parallel()
    tried = list(BLOCKER.tried)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j"))
    message = cli_spark_route()
    print(f"TRIED_BEFORE_SPARK_ROUTE={tried}")
    print(f"LEAKED={leaked}")
    print(f"SPARK_ROUTE_ERROR={message.strip()}")
    print("TRIED_ON_SPARK_ROUTE=" + ",".join(BLOCKER.tried))
