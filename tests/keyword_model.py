"""A Hugging Face style classifier without transformers (keyword inputs, an output object with ``loss`` and
``logits``) and a synthetic keyword task, for the PyTorch-data tests (module level, so worker processes import
them by name)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

VOCAB, LENGTH, KEYWORD = 30, 10, 7


@dataclass
class ClassifierOutput:
    """What ``BertForSequenceClassification`` returns, in small: the loss (when given labels) and the logits."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class TinySequenceClassifier(nn.Module):
    """Embedding, masked mean pool, linear; ``forward(input_ids, attention_mask, labels=None)``."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> ClassifierOutput:
        if input_ids.dtype != torch.int64:
            raise TypeError(f"input_ids must stay int64 token ids, got {input_ids.dtype}")
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits = self.head(pooled)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return ClassifierOutput(loss, logits)


def keyword_task(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)``: label 1 when token ``KEYWORD`` occurs among the real tokens of a
    padded sequence (ids 0 are padding), about half the examples each way."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
    ids[ids == KEYWORD] = KEYWORD + 1
    lengths = torch.randint(3, LENGTH + 1, (n,), generator=g)
    mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    labels = torch.randint(0, 2, (n,), generator=g)
    where = (torch.rand(n, generator=g) * lengths).long()
    ids[labels == 1, where[labels == 1]] = KEYWORD
    return ids * mask, mask, labels


class KeywordDataset(Dataset):
    """Map-style: item ``i`` is ``{"input_ids", "attention_mask", "labels"}``, as a tokenized Hugging Face dataset."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.ids, self.mask, self.labels = keyword_task(n, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class PairStream(IterableDataset):
    """An iterable dataset of ``(x, y)`` examples, in order."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(zip(self.x, self.y))
