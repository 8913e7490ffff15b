"""PyTorch data in (Dataset, IterableDataset, DataLoader; tensor, tuple and dict batches) and outputs/losses as
PyTorch users write them (tensor, tuple, dict, ``.logits``; ``loss=None`` for the model's own loss)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from keyword_model import KeywordDataset, PairStream, TinySequenceClassifier, keyword_task
from torchspark import DataSet, MultiDataSet, Network, optim
from torchspark.data import dataset_from_bytes, dataset_to_bytes, iterate_minibatches
from torchspark.errors import ConfigError, DataError
from torchspark.nn.losses import MODEL_LOSS, resolve_loss
from torchspark.parallel.routing import from_torch_data, route_data


def _xy(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def _mlp() -> Network:
    return Network(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)), updater=optim.Adam(lr=1e-2), seed=3)


# ------------------------------------------------------------------ the keyword task, Hugging Face style
def test_a_hugging_face_style_model_trains_from_a_dataloader_of_dicts_as_a_plain_torch_loop_does() -> None:
    train, test = KeywordDataset(512, seed=0), KeywordDataset(256, seed=1)
    net = Network(TinySequenceClassifier(), loss=None, updater=optim.Adam(lr=0.05), seed=0)
    plain = TinySequenceClassifier()
    plain.load_state_dict(net.module.state_dict())
    net.fit(DataLoader(train, batch_size=32), epochs=4)

    opt = torch.optim.Adam(plain.parameters(), lr=0.05)
    for _ in range(4):
        for batch in DataLoader(train, batch_size=32):
            opt.zero_grad()
            plain(**batch).loss.backward()
            opt.step()
    with torch.no_grad():
        plain_logits = plain(test.ids, test.mask).logits
    plain_accuracy = float((plain_logits.argmax(1) == test.labels).float().mean())

    accuracy = net.evaluate(DataLoader(test, batch_size=64)).accuracy()
    assert plain_accuracy > 0.9 and accuracy >= plain_accuracy - 1e-9
    # the same steps on the same batches: the flat-parameter machinery changes nothing
    for (name, got), want in zip(net.module.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=name)
    classes = net.predict(DataLoader(test, batch_size=64), output="class")
    assert classes.dtype == torch.int64 and torch.equal(classes, plain_logits.argmax(1))
    probs = net.predict(test)  # a map-style Dataset, read in batch_size batches
    torch.testing.assert_close(probs, torch.softmax(plain_logits, 1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(net.output({"input_ids": test.ids, "attention_mask": test.mask}), probs)
    # score: the model's own (mean) loss
    with torch.no_grad():
        plain_loss = float(plain(test.ids, test.mask, labels=test.labels).loss)
    assert net.score(DataLoader(test, batch_size=256)) == pytest.approx(plain_loss, rel=1e-5)


def test_keyword_features_keep_their_names_and_dtypes_through_every_batch_operation() -> None:
    ids, mask, labels = keyword_task(10)
    batch = next(iter(iterate_minibatches(DataLoader(KeywordDataset(10), batch_size=4), 4)))
    assert isinstance(batch, MultiDataSet) and batch.feature_names == ("input_ids", "attention_mask")
    assert [f.dtype for f in batch.features] == [torch.int64, torch.int64] and torch.equal(batch.features[0], ids[:4])
    assert batch.labels is not None and torch.equal(batch.labels[0], labels[:4])
    whole = MultiDataSet({"input_ids": ids, "attention_mask": mask}, [labels])
    for copy in (
        dataset_from_bytes(dataset_to_bytes(whole)),
        pickle.loads(pickle.dumps(whole)),
        MultiDataSet.merge(whole.split(3)),
        whole.shuffle(1).shuffle(1).slice(0, 10),
    ):
        assert copy.feature_names == ("input_ids", "attention_mask")
        assert copy.features[0].dtype == torch.int64
    assert torch.equal(MultiDataSet.merge(whole.split(3)).features[1], mask)
    with pytest.raises(DataError, match="item 1 has arrays"):
        MultiDataSet.merge([whole, MultiDataSet([ids, mask], [labels])])
    with pytest.raises(DataError, match="not a Python identifier"):
        MultiDataSet({"input ids": ids})


# ------------------------------------------------------------------ tuple batches, IterableDataset, evaluate/predict
def test_a_tuple_dataloader_a_dataset_and_an_iterable_dataset_train_as_the_dataset_route_does() -> None:
    x, y = _xy()
    reference = _mlp().fit(DataSet(x, y), epochs=2, batch_size=16)
    for data in (
        DataLoader(TensorDataset(x, y), batch_size=16),
        TensorDataset(x, y),
        PairStream(x, y),
        DataLoader(PairStream(x, y), batch_size=16),
    ):
        net = _mlp().fit(data, epochs=2, batch_size=16)
        torch.testing.assert_close(net.params(), reference.params(), atol=0, rtol=0, msg=type(data).__name__)
        assert net.iteration == reference.iteration == 12
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    assert reference.evaluate(loader).accuracy() == reference.evaluate(DataSet(x, y)).accuracy()
    torch.testing.assert_close(reference.predict(loader), reference.output(x))
    torch.testing.assert_close(reference.output(loader), reference.output(x))
    assert reference.score(loader) == pytest.approx(reference.score(DataSet(x, y)), rel=1e-6)
    # several inputs: ((x1, x2), y) calls module(x1, x2)
    two = TensorDataset(x[:, :3], x[:, 3:], y)
    loader2 = DataLoader(
        two,
        batch_size=16,
        collate_fn=lambda items: (
            (torch.stack([a for a, _, _ in items]), torch.stack([b for _, b, _ in items])),
            torch.stack([c for _, _, c in items]),
        ),
    )

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.inner(torch.cat([a, b], 1))

    net = Network(Two(), updater=optim.Adam(lr=1e-2), seed=3)
    net.set_params(_mlp().params())
    net.fit(loader2, epochs=2)
    torch.testing.assert_close(net.params(), reference.params(), atol=0, rtol=0)


# ------------------------------------------------------------------ what a module may return
@dataclass
class _Out:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class _Returns(nn.Module):
    """A linear classifier returning its logits in the form ``kind`` names (and its loss, given labels)."""

    def __init__(self, kind: str, own_loss: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)
        self.kind = kind
        self.own_loss = own_loss

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> object:
        logits = self.linear(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        if self.kind == "tensor":
            return logits
        if self.kind == "dict":
            return {"logits": logits} if loss is None else {"loss": loss, "logits": logits}
        if self.kind == "object":
            return _Out(logits, loss)
        hidden = logits.detach() * 0
        if labels is None:  # Hugging Face's return_dict=False: (logits, hidden...) or (loss, logits, hidden...)
            return (logits, hidden) if self.own_loss else (logits,)
        return (loss, logits, hidden)


@pytest.mark.parametrize("kind", ["tensor", "dict", "object", "tuple"])
@pytest.mark.parametrize("loss", ["cross_entropy", None])
def test_every_output_form_trains_evaluates_and_predicts_alike(kind: str, loss: str | None) -> None:
    x, y = _xy()
    if kind == "tensor" and loss is None:
        with pytest.raises(ConfigError, match="returned no loss.*pass loss='cross_entropy'"):
            Network(_Returns(kind), loss=None, seed=0).fit(DataSet(x, y))
        return
    reference = Network(_Returns("tensor"), updater=optim.Adam(lr=1e-2), seed=0)
    net = Network(_Returns(kind, own_loss=loss is None), loss=loss, updater=optim.Adam(lr=1e-2), seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    reference.fit(loader, epochs=2)
    net.fit(loader, epochs=2)
    torch.testing.assert_close(net.params(), reference.params(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(net.output(x), reference.output(x))
    assert net.evaluate(loader).accuracy() == reference.evaluate(loader).accuracy()
    assert net.score(loader) == pytest.approx(reference.score(loader), rel=1e-5)


def test_output_forms_that_cannot_be_read_are_config_errors() -> None:
    x, y = _xy(8)

    class Bad(nn.Module):
        def __init__(self, out: object) -> None:
            super().__init__()
            self.linear = nn.Linear(6, 2)
            self.out = out

        def forward(self, x: torch.Tensor) -> object:
            self.linear(x)
            return self.out

    with pytest.raises(ConfigError, match=r"dict with keys \['scores'\] and no 'logits'"):
        Network(Bad({"scores": torch.zeros(8, 2)}), seed=0).fit(DataSet(x, y))
    with pytest.raises(ConfigError, match="returned a str; return a tensor of logits"):
        Network(Bad("logits"), seed=0).output(x)
    with pytest.raises(ConfigError, match="cannot be combined with other losses"):
        Network(Bad(None), loss=[None, "mse"])
    assert resolve_loss(None) is MODEL_LOSS and resolve_loss("model") is MODEL_LOSS


# ------------------------------------------------------------------ bad input
def test_unusable_batches_are_data_errors_naming_the_batch_its_type_and_the_forms_taken() -> None:
    x, y = _xy(8)
    net = _mlp()
    with pytest.raises(DataError, match=r"batch 0 of the data is a str; batches may be a tensor \(features\)"):
        net.fit(DataLoader(["a", "b"], batch_size=2, collate_fn=lambda items: "".join(items)))
    with pytest.raises(DataError, match="batch 0 of the data .a list. cannot be used: the batch is a list of 3 items"):
        net.fit(DataLoader(TensorDataset(x, x, y), batch_size=4))
    text = [{"text": f"row {i}", "labels": i % 2} for i in range(4)]
    with pytest.raises(DataError, match=r"batch 0 .*entry 'text' is a list of str, not a tensor"):
        net.fit(DataLoader(text, batch_size=2))
    with pytest.raises(DataError, match="holds only \\['labels'\\], no features"):
        net.fit(DataLoader([{"labels": 1}], batch_size=1))


def test_a_model_with_its_own_loss_needs_labels_named_labels() -> None:
    ids, mask, _ = keyword_task(8)
    net = Network(TinySequenceClassifier(), loss=None, seed=0)
    unlabelled = DataLoader(
        TensorDataset(ids, mask),
        batch_size=4,
        collate_fn=lambda items: {
            "input_ids": torch.stack([a for a, _ in items]),
            "attention_mask": torch.stack([b for _, b in items]),
        },
    )
    with pytest.raises(DataError, match="batch has no labels; give the batch a 'labels' entry"):
        net.fit(unlabelled)
    assert net.iteration == 0
    # prediction needs none
    assert net.predict(unlabelled).shape == (8, 2)
    with pytest.raises(ConfigError, match="_NoLabels.forward takes no labels .*pass loss='cross_entropy'"):
        Network(_NoLabels(), loss=None, seed=0).fit(DataLoader(KeywordDataset(8), batch_size=4))
    with pytest.raises(DataError, match=r"cannot take the keyword features \['input_ids', 'attention_mask'\]"):
        Network(_Positional(), seed=0).fit(DataLoader(KeywordDataset(8), batch_size=4))


class _Positional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.float())


class _NoLabels(TinySequenceClassifier):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):  # type: ignore[override]
        return super().forward(input_ids, attention_mask)


# ------------------------------------------------------------------ ParallelWrapper's shards (the routing, no processes)
def test_a_dataset_is_sharded_disjointly_over_the_workers_and_reshuffled_every_epoch_by_the_seed() -> None:
    n = 103
    ids = torch.arange(n)
    data = from_torch_data(DataLoader(TensorDataset(ids.float().unsqueeze(1), ids), batch_size=7, shuffle=True), 8, 3)
    assert isinstance(data, DataSet) and torch.equal(data.labels, ids)  # read once, in index order

    def shards(seed: int) -> list[list[list[int]]]:
        plan = route_data(data, 3, 8, epochs=3, rng_seed=seed, scope="global")
        assert plan.shares.epoch_feeds is not None
        return [[[int(i) for b in feed for i in b.labels] for feed in epoch] for epoch in plan.shares.epoch_feeds]

    first = shards(5)
    for epoch in first:
        seen = [i for feed in epoch for i in feed]
        assert sorted(seen) == list(range(n))  # disjoint, and the union is the dataset
        assert max(len(f) for f in epoch) - min(len(f) for f in epoch) <= 1
    assert first[0][0] != first[1][0]  # another order, another share, every epoch
    assert shards(5) == first and shards(6) != first  # seeded


def test_a_dataloader_with_a_sampler_of_its_own_and_an_iterable_dataset_over_several_epochs_are_refused() -> None:
    x, y = _xy(8)
    weighted = DataLoader(TensorDataset(x, y), batch_size=4, sampler=WeightedRandomSampler([1.0] * 8, 8))
    with pytest.raises(ConfigError, match="cannot honour the loader's WeightedRandomSampler"):
        from_torch_data(weighted, 4, 1)
    with pytest.raises(ConfigError, match="call fit once per epoch"):
        from_torch_data(PairStream(x, y), 4, 2)
    stream = from_torch_data(PairStream(x, y), 4, 1)
    assert [len(b) for b in stream] == [4, 4]
    with pytest.raises(DataError, match="batch 0 of the data is a str"):
        from_torch_data(DataLoader(["ab"], batch_size=1, collate_fn=lambda items: items[0]), 4, 1)
