"""``torchspark train`` refuses sizes it cannot run and never loses a trained model it cannot write (issue 31)."""

from __future__ import annotations

import re

import pytest
import torch

from torchspark import Network, models, optim
from torchspark.cli import main
from torchspark.cli_limits import MAX_EPOCHS, max_local_workers, save_model
from torchspark.errors import SetupError


def test_epochs_beyond_the_bound_are_refused_before_training(tmp_path, capsys) -> None:
    code = main(["train", "--parallel", "--epochs", "100000000", "--output", str(tmp_path / "out")])
    assert code == 2
    assert f"--epochs must be at most {MAX_EPOCHS}, got 100000000" in capsys.readouterr().err
    assert not (tmp_path / "out" / "model").exists()


def test_more_local_workers_than_the_open_file_limit_allows_are_refused(tmp_path, capsys) -> None:
    too_many = max_local_workers() + 1
    code = main(
        ["train", "--parallel", "--num-workers", str(too_many), "--epochs", "1", "--output", str(tmp_path / "out")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"--num-workers {too_many} cannot run on this machine" in err and "ulimit -n" in err


def test_a_model_that_cannot_be_written_is_kept_elsewhere_and_the_error_says_where() -> None:
    net = Network(models.mlp(4, 8, 2), updater=optim.Adam(lr=1e-3), seed=0)
    with pytest.raises(SetupError, match=r"cannot write the trained model to '/proc/.*saved to '.*' instead") as info:
        save_model(net, "/proc/torchspark-no-such/model")  # /proc refuses new directories, even to root
    kept = re.search(r"saved to '([^']+)'", str(info.value)).group(1)
    torch.testing.assert_close(Network.load(kept).params(), net.params())
