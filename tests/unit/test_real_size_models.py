"""The zoo's real-size networks (``vgg``, ``text_transformer``) and the keyword data set: sizes, JSON specs, errors,
and that they learn their synthetic tasks (the Spark and ParallelWrapper runs: tests/spark/test_real_size_spark.py)."""

from __future__ import annotations

import pytest
import torch

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, DataError
from torchspark.nn.network_spec import NetworkSpec
from torchspark.nn.spec import module_spec


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_default_sizes_are_real_size() -> None:
    vgg = models.vgg()
    assert _count(vgg) == 13_503_722 >= 10_000_000
    assert sum(b.numel() for b in vgg.buffers()) > 0  # batch norm's running statistics travel as buffers
    text = models.text_transformer()
    assert _count(text) == 6_192_132 >= 5_000_000
    assert text.tokens.weight.numel() == 20_000 * 256 > _count(text) / 2  # the embedding dominates


@pytest.mark.parametrize(
    ("name", "kwargs", "features"),
    [
        ("vgg", {"in_channels": 3, "n_classes": 5, "widths": [8, 16], "hidden": 0}, torch.rand(4, 3, 32, 32)),
        ("vgg", {"in_channels": 1, "n_classes": 3, "widths": [4, 8, 8], "batch_norm": False}, torch.rand(2, 1, 7, 9)),
        ("text_transformer", {"vocab_size": 50, "n_classes": 3, "d_model": 16, "d_ff": 32}, torch.randint(50, (4, 9))),
    ],
)
def test_built_from_their_json_spec_and_saved_as_json(name, kwargs, features, tmp_path) -> None:
    spec = NetworkSpec.from_json(NetworkSpec(model=name, kwargs=kwargs, seed=3).to_json())
    net = spec.build()
    assert module_spec(net.module) is not None and module_spec(net.module)["factory"] == f"torchspark.models:{name}"
    out = net.output(features)
    assert out.shape == (len(features), kwargs["n_classes"])
    torch.testing.assert_close(spec.build().output(features), out)  # same seed, same network
    net.save(str(tmp_path / "m"))
    torch.testing.assert_close(Network.load(str(tmp_path / "m")).output(features), out)


def test_bad_sizes_name_the_value_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"vgg needs at least one stage width, got widths=\[\]"):
        models.vgg(widths=[])
    with pytest.raises(ConfigError, match=r"^vgg stage width must be an integer >= 1, got 0$"):
        models.vgg(widths=[8, 0])
    with pytest.raises(ConfigError, match=r"batch_norm must be True or False, got 'yes'"):
        models.vgg(batch_norm="yes")
    with pytest.raises(
        ConfigError, match=r"n_heads must divide d_model, got d_model=30, n_heads=4; use e.g. n_heads=2"
    ):
        models.text_transformer(d_model=30)
    with pytest.raises(ConfigError, match=r"^text_transformer: dropout must be a number in \[0.0, 1.0\), got 1.0$"):
        models.text_transformer(dropout=1.0)
    net = Network(models.text_transformer(50, 2, max_len=4, d_model=8, d_ff=8), seed=0)
    with pytest.raises(DataError, match="longer than max_len=4"):
        net.output(torch.zeros(1, 5, dtype=torch.int64))


def test_synthetic_keywords_class_is_the_keywords_it_contains() -> None:
    data = datasets.synthetic_keywords(400, seq_len=12, vocab_size=60, n_classes=4, keywords_per_class=2, seed=5)
    assert data.features.shape == (400, 12) and data.features.dtype == torch.int64
    assert torch.equal(data.labels.bincount(), torch.full((4,), 100))
    again = datasets.synthetic_keywords(400, seq_len=12, vocab_size=60, n_classes=4, keywords_per_class=2, seed=5)
    assert torch.equal(again.features, data.features) and torch.equal(again.labels, data.labels)
    # a token is a keyword iff it occurs in one class only (400 examples: every background token occurs in all)
    classes_of = {t: set() for t in range(60)}
    for tokens, label in zip(data.features.tolist(), data.labels.tolist()):
        for t in tokens:
            classes_of[t].add(label)
    keyword_class = {t: next(iter(c)) for t, c in classes_of.items() if len(c) == 1}
    assert len(keyword_class) == 8
    for tokens, label in zip(data.features.tolist(), data.labels.tolist()):
        assert {keyword_class[t] for t in tokens if t in keyword_class} == {label}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 3, "keywords_per_example": 4}, r"keywords_per_example must be <= seq_len \(3\), got 4"),
        ({"vocab_size": 8, "n_classes": 2, "keywords_per_class": 4}, r"vocab_size must exceed .* = 8 .* got 8"),
        ({"n_classes": 1}, r"n_classes must be >= 2"),
        ({"seq_len": 0}, r"seq_len must be an integer >= 1, got 0"),
    ],
)
def test_synthetic_keywords_refuses_impossible_settings(kwargs, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        datasets.synthetic_keywords(10, **kwargs)


@pytest.mark.parametrize("name", ["vgg", "text_transformer"])
def test_they_learn_their_synthetic_task_in_a_few_steps(name: str) -> None:
    """Narrow versions of both (the same code; the real-size defaults run on Spark in tests/spark): the training
    loss on a tiny subset drops within 8 steps. Measured in training mode: batch norm's running statistics need more
    than 8 steps to settle, and they are not what this checks."""
    if name == "vgg":
        data = datasets.synthetic_images(32, 3, 32, 32, n_classes=4, seed=1)
        module = models.vgg(3, 4, widths=[8, 16, 32], hidden=32)
    else:
        data = datasets.synthetic_keywords(32, seq_len=16, vocab_size=500, seed=1)
        module = models.text_transformer(500, d_model=32, d_ff=64)
    net = Network(module, updater=optim.Adam(lr=1e-2), seed=0)

    def train_loss() -> float:
        module.train()
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(module(data.features), data.labels))

    before = train_loss()
    net.fit(data, epochs=4, batch_size=16)  # 8 steps
    assert train_loss() < 0.7 * before


def test_the_cli_names_them_and_refuses_a_dataset_they_cannot_take(tmp_path, capsys) -> None:
    from torchspark import cli

    args = cli.build_parser().parse_args(["train", "--model", "text_transformer", "--dataset", "keywords"])
    train, test = cli._train_test(args)
    assert train.features.shape == (2048, 64) and len(test) == 512
    assert _count(cli._model("text_transformer", (64,), 4)) == 6_192_132
    assert _count(cli._model("vgg", (3, 32, 32), 10)) == 13_503_722
    code = cli.main(["train", "--parallel", "--model", "text_transformer", "--output", str(tmp_path / "out")])
    assert code == 2
    assert "--model text_transformer does not take the examples of --dataset digits; use --dataset keywords" in (
        capsys.readouterr().err
    )
