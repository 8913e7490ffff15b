"""Built-in datasets for examples, tests and benchmarks. None of them touches the network.

- [`digits`][torchspark.datasets.digits]: the 1,797 8x8 handwritten digits scikit-learn bundles, shipped with torchspark (117 KB of safetensors,
  no scikit-learn needed), in a fixed stratified train/test split.
- [`synthetic_classification`][torchspark.datasets.synthetic_classification] / [`synthetic_images`][torchspark.datasets.synthetic_images]: learnable random data of any size, seeded.
- [`synthetic_keywords`][torchspark.datasets.synthetic_keywords]: token sequences whose class is which keywords they contain (text classification).
- [`read_idx`][torchspark.datasets.read_idx]: MNIST-style IDX files the user already has (local path or fsspec URL, optionally gzipped).
"""

from __future__ import annotations

import functools
import gzip
import math
from typing import Any

import fsspec
import numpy as np
import torch

from torchspark.data.dataset import DataSet
from torchspark.errors import ConfigError, DataError
from torchspark.validation import check_float, check_int

__all__ = ["DIGITS_SPLITS", "digits", "synthetic_classification", "synthetic_images", "synthetic_keywords", "read_idx"]

DIGITS_SPLITS = ("train", "test")


#: The digits, shipped as package data: uint8 pixels 0..16 and uint8 labels per split, in the order scikit-learn 1.9's
#: ``train_test_split(load_digits(), test_size=0.2, stratify=y, random_state=0)`` gives them (a test checks it against
#: scikit-learn where it is installed). Source: the UCI "Optical Recognition of Handwritten Digits" data set (Alpaydin
#: and Kaynak, 1998; CC BY 4.0), as scikit-learn bundles it.
_DIGITS_FILE = "digits.safetensors"


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from importlib import resources

    from safetensors.numpy import load

    raw = load(resources.files("torchspark._data").joinpath(_DIGITS_FILE).read_bytes())
    out = {}
    for split in DIGITS_SPLITS:
        x = raw[f"{split}_pixels"].astype(np.float32) / 16.0  # (N, 1, 8, 8) in [0, 1]
        out[split] = (x, raw[f"{split}_labels"].astype(np.int64))  # labels (N,) int64
    return out


def digits(split: str = "train") -> DataSet:
    """The 1,797 handwritten 8x8 digits that scikit-learn bundles, shipped with torchspark (no download, no
    scikit-learn needed).

    Features are float32 in [0, 1] shaped ``(N, 1, 8, 8)``; labels are int64 classes 0-9. The split is fixed
    (stratified 80/20, ``random_state=0``), so results are comparable across runs and machines.

    Args:
        split: ``"train"`` (1,437 examples) or ``"test"`` (360 examples).

    Raises:
        ConfigError: ``split`` is not one of ``DIGITS_SPLITS``.
    """
    if split not in DIGITS_SPLITS:
        raise ConfigError(f"digits split must be one of {list(DIGITS_SPLITS)}, got {split!r}")
    x, y = _digits_arrays()[split]
    # Copies, so a caller modifying its tensors cannot corrupt the cached arrays.
    return DataSet(torch.tensor(x), torch.tensor(y))


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        check_int(name, value, 1)


def _balanced_labels(n: int, n_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Each class ``n // n_classes`` or one more times, in random order; int64 ``(n,)``."""
    labels = torch.arange(n, dtype=torch.int64) % n_classes
    return labels[torch.randperm(n, generator=generator)]


def synthetic_classification(n: int, n_features: int, n_classes: int, seed: int = 0, noise: float = 1.0) -> DataSet:
    """Gaussian blobs: one random centroid per class (spread 3 per dimension) plus Gaussian noise.

    Args:
        n: number of examples.
        n_features: features per example.
        n_classes: number of classes (>= 2); classes are balanced.
        seed: same seed, same data.
        noise: noise standard deviation; 1.0 is easy for a small MLP with 10+ features, raise it to make the
            task harder.

    Returns:
        float32 features ``(n, n_features)`` and int64 labels ``(n,)``.

    Raises:
        ConfigError: a non-positive size, fewer than 2 classes, or a negative ``noise``.
    """
    _check_positive(n=n, n_features=n_features, n_classes=n_classes)
    if n_classes < 2:
        raise ConfigError(f"n_classes must be >= 2 for classification, got {n_classes}")
    check_float("noise", noise, minimum=0, finite=True)
    generator = torch.Generator().manual_seed(seed)
    centroids = torch.randn(n_classes, n_features, generator=generator) * 3.0  # (C, F)
    labels = _balanced_labels(n, n_classes, generator)  # (n,)
    features = centroids[labels] + noise * torch.randn(n, n_features, generator=generator)  # (n, F)
    return DataSet(features, labels)


def synthetic_images(
    n: int,
    channels: int = 1,
    height: int = 28,
    width: int = 28,
    n_classes: int = 10,
    seed: int = 0,
) -> DataSet:
    """Image-like data: each class has a smooth random template; examples are template + pixel noise.

    Values are float32 in [0, 1] shaped ``(n, channels, height, width)``, so it drops in for MNIST in
    benchmarks (LeNet on 28x28) without a download. A small CNN learns it to high accuracy in one epoch.

    Raises:
        ConfigError: a non-positive size or fewer than 2 classes.
    """
    _check_positive(n=n, channels=channels, height=height, width=width, n_classes=n_classes)
    if n_classes < 2:
        raise ConfigError(f"n_classes must be >= 2 for classification, got {n_classes}")
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(n_classes, channels, max(2, height // 4), max(2, width // 4), generator=generator)
    templates = torch.nn.functional.interpolate(
        coarse, size=(height, width), mode="bilinear", align_corners=False
    )  # (C, ch, H, W), smooth blobs
    labels = _balanced_labels(n, n_classes, generator)  # (n,)
    features = torch.empty(n, channels, height, width)
    chunk = 4096  # bounds the temporary noise tensor for large n
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        block = 0.5 + 0.2 * templates[labels[start:stop]]
        block += 0.25 * torch.randn(block.shape, generator=generator)
        features[start:stop] = block.clamp_(0.0, 1.0)
    return DataSet(features, labels)


def synthetic_keywords(
    n: int,
    seq_len: int = 64,
    vocab_size: int = 20000,
    n_classes: int = 4,
    keywords_per_class: int = 16,
    keywords_per_example: int = 4,
    seed: int = 0,
) -> DataSet:
    """Token sequences of a bag-of-keywords task: an example's class is the class of the keywords it contains.

    Each class owns ``keywords_per_class`` token ids (disjoint sets, drawn at random from the vocabulary). An example
    is ``seq_len`` background tokens, uniform over the non-keyword ids, with ``keywords_per_example`` of its class's
    keywords written at random positions. The class is a function of the tokens (no label noise), but not of any one
    position, so a model must look at the whole sequence: [`torchspark.models.text_transformer`][torchspark.models.text_transformer] learns it in a
    few epochs. With a large vocabulary most embedding rows are untouched by a minibatch (sparse gradients).

    Args:
        n: number of examples (classes balanced).
        seq_len: tokens per example (at most the model's ``max_len``).
        vocab_size: token ids are in ``[0, vocab_size)``; must leave room for the keywords.
        n_classes: number of classes (>= 2).
        keywords_per_class: keyword ids per class; more makes the task harder (each keyword is seen less often).
        keywords_per_example: keywords written into each example (<= ``seq_len``); fewer makes it harder.
        seed: same seed, same data.

    Returns:
        int64 tokens ``(n, seq_len)`` and int64 labels ``(n,)``.

    Raises:
        ConfigError: a non-positive size, fewer than 2 classes, more keywords per example than positions, or a
            vocabulary too small for ``n_classes * keywords_per_class`` keywords plus background tokens.

    Example: ``synthetic_keywords(4096)`` with ``models.text_transformer(20000, 4)``.
    """
    _check_positive(
        n=n,
        seq_len=seq_len,
        vocab_size=vocab_size,
        n_classes=n_classes,
        keywords_per_class=keywords_per_class,
        keywords_per_example=keywords_per_example,
    )
    if n_classes < 2:
        raise ConfigError(f"n_classes must be >= 2 for classification, got {n_classes}")
    if keywords_per_example > seq_len:
        raise ConfigError(f"keywords_per_example must be <= seq_len ({seq_len}), got {keywords_per_example}")
    n_keywords = n_classes * keywords_per_class
    if vocab_size <= n_keywords:
        raise ConfigError(
            f"vocab_size must exceed n_classes * keywords_per_class = {n_keywords} (background tokens "
            f"need ids of their own), got {vocab_size}; raise vocab_size or lower keywords_per_class"
        )
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab_size, generator=generator)
    keywords = ids[:n_keywords].reshape(n_classes, keywords_per_class)  # (C, K)
    background = ids[n_keywords:]  # (V - C*K,)
    labels = _balanced_labels(n, n_classes, generator)  # (n,)
    tokens = background[torch.randint(len(background), (n, seq_len), generator=generator)]  # (n, T)
    # keywords_per_example distinct positions per example: the first k of a random permutation of the positions
    positions = torch.rand(n, seq_len, generator=generator).argsort(dim=1)[:, :keywords_per_example]  # (n, k)
    which = torch.randint(keywords_per_class, (n, keywords_per_example), generator=generator)  # (n, k)
    tokens.scatter_(1, positions, keywords[labels.unsqueeze(1), which])
    return DataSet(tokens, labels)


def _read_bytes(path: str) -> bytes:
    try:
        with fsspec.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise DataError(f"IDX file not found: {path}") from exc
    except OSError as exc:
        raise DataError(f"cannot read IDX file {path} ({exc})") from exc
    if data[:2] == b"\x1f\x8b":  # gzip magic: decompress whatever the file is called
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DataError(f"IDX file {path} is a corrupt or truncated gzip file ({exc})") from exc
    return data


def _parse_idx(data: bytes, path: str, ndim: int) -> np.ndarray:
    """IDX: 2 zero bytes, dtype code (0x08 = uint8), number of dims, then big-endian uint32 dims and data."""
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise DataError(
            f"{path} is not an unsigned-byte IDX file (bad magic {data[:4].hex() or 'empty'}); "
            f"expected 0000 08 0{ndim}, as in the MNIST files"
        )
    if data[3] != ndim:
        raise DataError(f"{path} has {data[3]} dimensions, expected {ndim}; did you swap images and labels?")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path} is truncated: {len(data)} bytes, shorter than its {header}-byte header")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + math.prod(dims)
    if len(data) != expected:
        raise DataError(
            f"{path} has {len(data)} bytes but its header (dims {dims}) needs {expected}; "
            f"the file is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx(images: str, labels: str) -> DataSet:
    """Read an MNIST-style pair of IDX files (e.g. ``train-images-idx3-ubyte.gz``) that you have locally.

    Args:
        images: path or fsspec URL of the images file (uint8, 3 dims N x H x W); gzipped or not.
        labels: path or fsspec URL of the labels file (uint8, 1 dim N); gzipped or not.

    Returns:
        float32 features in [0, 1] shaped ``(N, 1, H, W)`` and int64 labels ``(N,)``.

    Raises:
        DataError: a missing file, bad magic, wrong size, or different counts; the message names the file.
    """
    pixels = _parse_idx(_read_bytes(images), images, ndim=3)  # (N, H, W) uint8
    targets = _parse_idx(_read_bytes(labels), labels, ndim=1)  # (N,) uint8
    if pixels.shape[0] != targets.shape[0]:
        raise DataError(
            f"{images} has {pixels.shape[0]} images but {labels} has {targets.shape[0]} labels; "
            f"pair files from the same split"
        )
    features = torch.from_numpy(pixels.astype(np.float32) / 255.0).unsqueeze(1)  # (N, 1, H, W)
    return DataSet(features, torch.from_numpy(targets.astype(np.int64)))
