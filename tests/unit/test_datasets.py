"""Built-in datasets: the shipped digits, synthetic data, MNIST IDX files."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from torchspark.datasets import digits, read_idx, synthetic_classification, synthetic_images
from torchspark.errors import ConfigError, DataError

# --- digits ---------------------------------------------------------------------------------------------------


def test_digits_shapes_range_and_sizes() -> None:
    train, test = digits("train"), digits("test")
    assert len(train) == 1437 and len(test) == 360
    for ds in (train, test):
        assert ds.features.shape[1:] == (1, 8, 8) and ds.features.dtype == torch.float32
        assert ds.labels is not None and ds.labels.dtype == torch.int64
        assert float(ds.features.min()) == 0.0 and float(ds.features.max()) == 1.0
    assert digits().features.shape == (1437, 1, 8, 8)  # default split is train


def test_digits_split_is_fixed_stratified_and_disjoint() -> None:
    train, test = digits("train"), digits("test")
    assert train.labels is not None and test.labels is not None
    train_counts = torch.bincount(train.labels, minlength=10).float()
    test_counts = torch.bincount(test.labels, minlength=10).float()
    fraction = test_counts / (train_counts + test_counts)
    assert bool(((fraction - 0.2).abs() < 0.01).all()), fraction  # every class split 80/20
    torch.testing.assert_close(digits("test").features, test.features)  # same split every call
    train_rows = {tuple(r) for r in train.features.reshape(len(train), -1).tolist()}
    test_rows = [tuple(r) for r in test.features.reshape(len(test), -1).tolist()]
    assert sum(r in train_rows for r in test_rows) < 5  # (digits has a few duplicate images)


def test_shipped_digits_equal_scikit_learns_split() -> None:
    # The package ships the arrays; they must be exactly what scikit-learn's load_digits + the documented split give.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    for split, (xs, ys) in {"train": (x_train, y_train), "test": (x_test, y_test)}.items():
        ds = digits(split)
        assert ds.labels is not None
        assert np.array_equal(ds.features.numpy(), xs) and np.array_equal(ds.labels.numpy(), ys), split


def test_digits_load_without_scikit_learn() -> None:
    # scikit-learn is a test dependency only: digits() must not import it.
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "from torchspark.datasets import digits\n"
        "d = digits('test'); print(len(d), int(d.labels.sum()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["360", str(int(digits("test").labels.sum()))]  # type: ignore[union-attr]


def test_digits_returns_copies_of_the_cache() -> None:
    digits("train").features.zero_()
    assert float(digits("train").features.max()) == 1.0


@pytest.mark.parametrize("bad", ["validation", "TRAIN", None])
def test_digits_bad_split(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"one of \['train', 'test'\]"):
        digits(bad)  # type: ignore[arg-type]


# --- synthetic ------------------------------------------------------------------------------------------------


def test_synthetic_classification_is_seeded_balanced_and_learnable() -> None:
    ds = synthetic_classification(600, 10, 3, seed=1)
    assert ds.features.shape == (600, 10) and ds.features.dtype == torch.float32
    assert ds.labels is not None and ds.labels.dtype == torch.int64
    assert torch.bincount(ds.labels).tolist() == [200, 200, 200]
    torch.testing.assert_close(synthetic_classification(600, 10, 3, seed=1).features, ds.features)
    assert not torch.equal(synthetic_classification(600, 10, 3, seed=2).features, ds.features)
    x, y = ds.features.numpy(), ds.labels.numpy()
    model = LogisticRegression(max_iter=500).fit(x[:400], y[:400])
    assert model.score(x[400:], y[400:]) > 0.9


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"n": 0}, "n must be"),
        ({"n_features": 2.5}, "n_features must be"),
        ({"n_classes": 1}, "n_classes must be"),
        ({"noise": -1.0}, "noise must be"),
    ],
)
def test_synthetic_classification_validates(kwargs: dict, fragment: str) -> None:
    args = {"n": 10, "n_features": 3, "n_classes": 2, **kwargs}
    with pytest.raises(ConfigError, match=fragment):
        synthetic_classification(**args)


def test_synthetic_images_shape_range_and_learnable() -> None:
    ds = synthetic_images(500, channels=2, height=12, width=10, n_classes=5, seed=3)
    assert ds.features.shape == (500, 2, 12, 10) and ds.features.dtype == torch.float32
    assert float(ds.features.min()) >= 0.0 and float(ds.features.max()) <= 1.0
    assert ds.labels is not None and torch.bincount(ds.labels).tolist() == [100] * 5
    torch.testing.assert_close(synthetic_images(500, 2, 12, 10, 5, seed=3).features, ds.features)
    # nearest class mean (fit on 300, tested on 200) separates the classes: the data is learnable
    x, y = ds.features.reshape(500, -1), ds.labels
    means = torch.stack([x[:300][y[:300] == c].mean(0) for c in range(5)])
    predicted = torch.cdist(x[300:], means).argmin(1)
    assert float((predicted == y[300:]).float().mean()) > 0.9
    assert synthetic_images(3).features.shape == (3, 1, 28, 28)


def test_synthetic_images_validates() -> None:
    with pytest.raises(ConfigError, match="height must be"):
        synthetic_images(4, height=0)
    with pytest.raises(ConfigError, match="n_classes must be >= 2"):
        synthetic_images(4, n_classes=1)


# --- read_idx -------------------------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.fixture
def idx_arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (7, 5, 4), dtype=np.uint8), rng.integers(0, 10, 7, dtype=np.uint8)


@pytest.mark.parametrize("gzipped", [False, True])
def test_read_idx(tmp_path: Path, idx_arrays: tuple[np.ndarray, np.ndarray], gzipped: bool) -> None:
    images, labels = idx_arrays
    wrap = gzip.compress if gzipped else (lambda b: b)
    suffix = ".gz" if gzipped else ""
    (tmp_path / f"img{suffix}").write_bytes(wrap(idx_bytes(images)))
    (tmp_path / f"lbl{suffix}").write_bytes(wrap(idx_bytes(labels)))
    ds = read_idx(str(tmp_path / f"img{suffix}"), f"file://{tmp_path}/lbl{suffix}")
    assert ds.features.shape == (7, 1, 5, 4) and ds.features.dtype == torch.float32
    torch.testing.assert_close(ds.features[:, 0], torch.from_numpy(images).float() / 255)
    assert ds.labels is not None and ds.labels.dtype == torch.int64 and ds.labels.tolist() == labels.tolist()


def test_read_idx_errors_name_the_file(tmp_path: Path, idx_arrays: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = idx_arrays
    good_img, good_lbl = tmp_path / "img", tmp_path / "lbl"
    good_img.write_bytes(idx_bytes(images))
    good_lbl.write_bytes(idx_bytes(labels))
    cases = {
        "magic": (b"\x00\x00\x0d\x03" + idx_bytes(images)[4:], "bad magic"),
        "short": (idx_bytes(images)[:-3], "truncated or corrupt"),
        "header": (idx_bytes(images)[:9], "truncated"),
        "empty": (b"", "bad magic"),
        "gz": (gzip.compress(idx_bytes(images))[:20], "corrupt or truncated gzip"),
        "dims": (idx_bytes(labels), "has 1 dimensions, expected 3"),
    }
    for name, (content, fragment) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(DataError, match=fragment) as info:
            read_idx(str(bad), str(good_lbl))
        assert str(bad) in str(info.value)
    with pytest.raises(DataError, match=f"IDX file not found: {tmp_path / 'nope'}"):
        read_idx(str(tmp_path / "nope"), str(good_lbl))
    fewer = tmp_path / "fewer"
    fewer.write_bytes(idx_bytes(labels[:5]))
    with pytest.raises(DataError, match="7 images but .*fewer has 5 labels"):
        read_idx(str(good_img), str(fewer))
