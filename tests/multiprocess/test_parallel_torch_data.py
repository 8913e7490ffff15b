"""ParallelWrapper on PyTorch data: a Dataset or DataLoader is sharded over the workers as a DataSet is (the same
shards, the same result), a Hugging Face style model with its own loss trains from a Dataset of dicts as one
process running the same algorithm does, and an IterableDataset streams every example to one worker."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from keyword_model import KeywordDataset, PairStream, TinySequenceClassifier
from reference_loops import averaging_reference
from torchspark import Network, datasets, optim
from torchspark.errors import DataError
from torchspark.parallel import ParallelWrapper
from torchspark.parallel.routing import from_torch_data
from torchspark.training.assignment import split_examples

WORKERS, BATCH, FREQUENCY = 2, 8, 3


def _wrapper(net: Network) -> ParallelWrapper:
    """Averaging without reshuffling (``rng_seed=None``): the route `averaging_reference` runs in one process
    (the seeded shards are checked in tests/unit/test_torch_data.py)."""
    return ParallelWrapper(
        net, num_workers=WORKERS, averaging_frequency=FREQUENCY, threads_per_worker=1, progress=False
    )


def test_a_dataloader_trains_as_the_dataset_it_holds_and_as_one_process_does() -> None:
    data = datasets.synthetic_classification(90, 12, 3, seed=2)
    assert isinstance(data.labels, torch.Tensor)
    net = Network(torch.nn.Linear(12, 3), updater=optim.Adam(lr=1e-2), seed=1)
    from_dataset, from_loader = net.copy(), net.copy()
    shards = split_examples([data], BATCH, WORKERS, None)
    reference = averaging_reference(net, shards, epochs=2, frequency=FREQUENCY, save_updater=True)
    _wrapper(from_dataset).fit(data, epochs=2, batch_size=BATCH)
    # the loader's batch size is the workers' batch size; its shuffling is replaced by the shards
    loader = DataLoader(TensorDataset(data.features, data.labels), batch_size=BATCH, shuffle=True)
    _wrapper(from_loader).fit(loader, epochs=2)
    torch.testing.assert_close(from_loader.params(), from_dataset.params(), atol=0, rtol=0)
    torch.testing.assert_close(from_loader.params(), reference.params(), atol=1e-6, rtol=1e-5)
    assert from_loader.iteration == from_dataset.iteration > 0


def test_a_hugging_face_style_model_trains_from_a_dataset_of_dicts_as_one_process_does() -> None:
    train = KeywordDataset(160, seed=0)
    net = Network(TinySequenceClassifier(), loss=None, updater=optim.Adam(lr=0.05), seed=0)
    trained = net.copy()
    keywords = from_torch_data(train, BATCH, 1)  # what the workers get: int64 token ids, keyword names
    assert keywords.feature_names == ("input_ids", "attention_mask") and keywords.features[0].dtype == torch.int64
    reference = averaging_reference(
        net, split_examples([keywords], BATCH, WORKERS, None), epochs=2, frequency=FREQUENCY, save_updater=True
    )
    _wrapper(trained).fit(train, epochs=2, batch_size=BATCH)
    torch.testing.assert_close(trained.params(), reference.params(), atol=1e-6, rtol=1e-5)
    test = KeywordDataset(128, seed=1)
    assert trained.evaluate(DataLoader(test, batch_size=64)).accuracy() > 0.8


def test_an_iterable_dataset_streams_every_example_once_and_bad_batches_fail_before_any_worker_starts() -> None:
    data = datasets.synthetic_classification(40, 12, 3, seed=3)
    net = Network(torch.nn.Linear(12, 3), seed=0)
    wrapper = _wrapper(net)
    wrapper.fit(PairStream(data.features, data.labels), batch_size=BATCH)
    assert sum(r.examples for r in wrapper.last_results) == 40
    with pytest.raises(DataError, match="batch 0 of the data is a str"):
        wrapper.fit(DataLoader(["ab", "cd"], batch_size=1, collate_fn=lambda items: items[0]))
    with pytest.raises(DataError, match="batch has no labels; give the batch a 'labels' entry"):
        _wrapper(Network(TinySequenceClassifier(), loss=None, seed=0)).fit(
            DataLoader(
                TensorDataset(torch.ones(8, 4, dtype=torch.int64), torch.ones(8, 4, dtype=torch.int64)),
                batch_size=4,
                collate_fn=lambda items: {
                    "input_ids": torch.stack([a for a, _ in items]),
                    "attention_mask": torch.stack([b for _, b in items]),
                },
            )
        )
