"""Tests for secagg.data: loaders, the IDX reader, and the partitioners."""

from __future__ import annotations

import gzip
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from secagg.data import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIRS,
    ClientData,
    Dataset,
    Partition,
    dirichlet_split,
    iid_split,
    label_skew,
    load_dataset,
    read_idx,
    shard_split,
)
from secagg.errors import DataError, SecaggError

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

IDX_TYPE = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
            np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode an array as IDX, written from the format description (independent of the code
    under test): 0, 0, type byte, ndim, then big-endian uint32 dims, then big-endian data."""
    arr = np.asarray(arr)
    head = bytes([0, 0, IDX_TYPE[arr.dtype], arr.ndim])
    head += b"".join(struct.pack(">I", d) for d in arr.shape)
    return head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray, compress: bool | None = None) -> Path:
    data = idx_bytes(arr)
    if compress is None:
        compress = path.suffix == ".gz"
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def write_mnist_dir(d: Path, n_train: int = 30, n_test: int = 10, seed: int = 0,
                    gz: bool = True) -> dict[str, np.ndarray]:
    """A tiny MNIST-style directory with known contents."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test)[::-1] % 10).astype(np.uint8),
    }
    arrays["train-images-idx3-ubyte"][0, 0, 0] = 255
    arrays["train-images-idx3-ubyte"][0, 0, 1] = 0
    for stem, a in arrays.items():
        write_idx(d / (stem + (".gz" if gz else "")), a, compress=gz)
    return arrays


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)


def all_indices(p: Partition) -> np.ndarray:
    parts = []
    for c in p:
        parts.append(c.indices)
        if c.test_indices is not None:
            parts.append(c.test_indices)
    return np.concatenate(parts)


def same_partition(a: Partition, b: Partition) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x.indices, y.indices) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------ digits


def test_digits_shapes_ranges_classes(digits: Dataset) -> None:
    assert digits.name == "digits"
    assert digits.input_shape == (64,)
    assert digits.n_classes == 10
    assert digits.n_train + digits.n_test == 1797
    assert digits.x_train.shape == (digits.n_train, 64)
    assert digits.x_test.shape == (digits.n_test, 64)
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert digits.x_train.min() == 0.0 and digits.x_train.max() == 1.0
    assert digits.x_test.min() >= 0.0 and digits.x_test.max() <= 1.0
    assert set(np.unique(digits.y_train)) == set(range(10))
    assert set(np.unique(digits.y_test)) == set(range(10))
    # 80/20, stratified: each class's test share is within one sample of 20%
    assert abs(digits.n_test - 0.2 * 1797) < 1
    tr = np.bincount(digits.y_train, minlength=10)
    te = np.bincount(digits.y_test, minlength=10)
    assert np.all(np.abs(te - 0.2 * (tr + te)) <= 1.0)


def test_digits_load_without_importing_sklearn_and_equal_its_loader(digits: Dataset) -> None:
    """The digits are read from scikit-learn's own file without importing scikit-learn (a
    Flower ClientApp loads them in every message's fresh process), and they are exactly
    the rows load_digits returns, split as before."""
    import subprocess
    import sys

    code = ("import sys; from secagg.data import load_dataset; d = load_dataset('digits'); "
            "print('sklearn' in sys.modules, d.n_train, d.n_test)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["False", str(digits.n_train), str(digits.n_test)]
    from sklearn.datasets import load_digits

    from secagg.data import _stratified_split

    raw = load_digits()
    x = (raw.data / 16.0).astype(np.float32)
    y = raw.target.astype(np.int64)
    train, test = _stratified_split(y, 0.2, np.random.default_rng(0))
    np.testing.assert_array_equal(digits.x_train, x[train])
    np.testing.assert_array_equal(digits.y_train, y[train])
    np.testing.assert_array_equal(digits.x_test, x[test])
    np.testing.assert_array_equal(digits.y_test, y[test])


def test_digits_split_is_deterministic_and_disjoint(digits: Dataset) -> None:
    from sklearn.datasets import load_digits

    again = load_dataset("digits")
    assert np.array_equal(again.x_train, digits.x_train)
    assert np.array_equal(again.y_test, digits.y_test)
    # train and test are a split of the scikit-learn rows (scaled by 1/16), nothing duplicated
    raw = load_digits()
    rows = {r.tobytes() for r in (raw.data / 16.0).astype(np.float32)}
    mine = [r.tobytes() for r in np.concatenate([digits.x_train, digits.x_test])]
    assert set(mine) == rows
    assert len(mine) == raw.data.shape[0]


def test_dataset_arrays_are_read_only(digits: Dataset) -> None:
    with pytest.raises(ValueError):
        digits.x_train[0, 0] = 5.0
    with pytest.raises(ValueError):
        digits.y_train[0] = 3


def test_dataset_validation() -> None:
    x = np.zeros((4, 3), np.float32)
    y = np.array([0, 1, 0, 1])
    ok = Dataset("toy", x, y, x, y, n_classes=2, input_shape=(3,))
    assert ok.n_train == 4
    with pytest.raises(DataError, match="shape"):
        Dataset("toy", x, y[:3], x, y, n_classes=2, input_shape=(3,))
    with pytest.raises(DataError, match="expected"):
        Dataset("toy", x, y, x, y, n_classes=2, input_shape=(4,))
    with pytest.raises(DataError, match="outside"):
        Dataset("toy", x, y + 1, x, y, n_classes=2, input_shape=(3,))


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(DataError) as e:
        load_dataset("cifar10")
    msg = str(e.value)
    assert "cifar10" in msg
    for name in ("digits", "fashion-mnist", "mnist"):
        assert name in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, SecaggError)


# ------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(3 * 28 * 28, dtype=np.int64).reshape(3, 28, 28).astype(np.uint8),
        np.array([0, 9, 3, 7], dtype=np.uint8),
        np.array([[-70000, 1, 2], [3, 2**31 - 1, -(2**31)]], dtype=np.int32),
        np.array([[-1.5, 2.25], [1e-3, 7.0]], dtype=np.float64),
        np.array([-300, 300, 0], dtype=np.int16),
    ],
    ids=["u8-images", "u8-labels", "i32", "f64", "i16"],
)
def test_read_idx_round_trip(tmp_path: Path, arr: np.ndarray, suffix: str) -> None:
    p = write_idx(tmp_path / f"a-idx{suffix}", arr)
    out = read_idx(p)
    assert out.shape == arr.shape
    assert out.dtype == arr.dtype
    assert np.array_equal(out, arr)
    out.flat[0] = out.flat[1]  # the result is an ordinary writable array


def test_read_idx_truncated_raw(tmp_path: Path) -> None:
    arr = np.ones((5, 28, 28), np.uint8)
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(idx_bytes(arr)[:-100])
    with pytest.raises(DataError) as e:
        read_idx(p)
    msg = str(e.value)
    assert "truncated" in msg and str(p) in msg
    assert "SECAGG_DATA_DIR" in msg  # says how to get the data


def test_read_idx_truncated_gzip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8)
    blob = gzip.compress(idx_bytes(arr))
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="truncated") as e:
        read_idx(p)
    assert str(p) in str(e.value)


def test_read_idx_truncated_header(tmp_path: Path) -> None:
    p = tmp_path / "x-idx"
    p.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">I", 5))  # 3 dims, only 1 given
    with pytest.raises(DataError, match="truncated"):
        read_idx(p)
    p.write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="truncated"):
        read_idx(p)


def test_read_idx_trailing_bytes(tmp_path: Path) -> None:
    p = tmp_path / "x-idx"
    p.write_bytes(idx_bytes(np.arange(4, dtype=np.uint8)) + b"\x00")
    with pytest.raises(DataError, match="extra bytes"):
        read_idx(p)


@pytest.mark.parametrize(
    "head",
    [b"\x12\x34\x08\x01", b"\x00\x00\x07\x01", b"\x00\x00\x08\x00", b"PK\x03\x04"],
    ids=["nonzero-lead", "bad-type", "zero-dims", "zip"],
)
def test_read_idx_wrong_magic(tmp_path: Path, head: bytes) -> None:
    p = tmp_path / "labels-idx1-ubyte"
    p.write_bytes(head + struct.pack(">I", 3) + b"\x00\x01\x02")
    with pytest.raises(DataError) as e:
        read_idx(p)
    msg = str(e.value)
    assert "magic" in msg and str(p) in msg and "0x00000801" in msg


def test_read_idx_missing_and_corrupt_gzip(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_idx(tmp_path / "nope.gz")
    p = tmp_path / "bad.gz"
    p.write_bytes(b"\x1f\x8b" + b"garbage that is not deflate" * 3)
    with pytest.raises(DataError, match="gzip"):
        read_idx(p)


# ------------------------------------------------------------------------ MNIST-style dirs


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "uncompressed"])
def test_load_mnist_from_dir(tmp_path: Path, no_env: None, gz: bool) -> None:
    arrays = write_mnist_dir(tmp_path / "m", gz=gz)
    ds = load_dataset("mnist", data_dir=tmp_path / "m")
    assert ds.name == "mnist" and ds.n_classes == 10 and ds.input_shape == (1, 28, 28)
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_train[0, 0, 0, 0] == 1.0 and ds.x_train[0, 0, 0, 1] == 0.0
    expect = arrays["train-images-idx3-ubyte"].astype(np.float64) / 255.0
    assert np.allclose(ds.x_train[:, 0], expect, atol=1e-7)
    assert np.array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"].astype(np.int64))
    assert np.array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"].astype(np.int64))


def test_env_var_and_subdirectory_layout(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist_dir(tmp_path / "mnist", n_train=20, seed=1)
    write_mnist_dir(tmp_path / "fashion-mnist", n_train=40, seed=2)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert load_dataset("mnist").n_train == 20
    assert load_dataset("fashion-mnist").n_train == 40
    assert load_dataset("fashion_mnist").name == "fashion-mnist"
    # data_dir wins over the environment variable
    write_mnist_dir(tmp_path / "other", n_train=12, seed=3)
    assert load_dataset("mnist", data_dir=tmp_path / "other").n_train == 12


def test_missing_directory_says_how_to_get_data(tmp_path: Path, no_env: None) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as e:
        load_dataset("fashion-mnist", data_dir=missing)
    msg = str(e.value)
    assert str(missing) in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert DATA_DIR_ENV in msg and "train-images-idx3-ubyte.gz" in msg


def test_missing_file_is_named(tmp_path: Path, no_env: None) -> None:
    write_mnist_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    assert "t10k-labels-idx1-ubyte" in str(e.value) and DATA_DIR_ENV in str(e.value)


def test_mnist_needs_a_directory(no_env: None) -> None:
    with pytest.raises(DataError) as e:
        load_dataset("mnist")
    assert "data_dir" in str(e.value) and DATA_DIR_ENV in str(e.value)


def test_image_label_count_mismatch(tmp_path: Path, no_env: None) -> None:
    write_mnist_dir(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(29, np.uint8))
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    msg = str(e.value)
    assert "30 images" in msg and "29 labels" in msg


def test_label_out_of_range(tmp_path: Path, no_env: None) -> None:
    write_mnist_dir(tmp_path)
    labels = np.zeros(10, np.uint8)
    labels[4] = 10
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    assert "label 10" in str(e.value) and "t10k-labels-idx1-ubyte.gz" in str(e.value)


def test_labels_file_in_place_of_images(tmp_path: Path, no_env: None) -> None:
    write_mnist_dir(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros(30, np.uint8))
    with pytest.raises(DataError, match="28x28"):
        load_dataset("mnist", data_dir=tmp_path)


def test_fashion_mnist_from_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in CI (which installs dataset-fashion-mnist); locally it is skipped only when the
    Debian directory is absent. Under CI=true a missing directory fails."""
    assert DEFAULT_DATA_DIRS["fashion-mnist"] == FASHION_DIR
    if not FASHION_DIR.is_dir() and os.environ.get("CI") != "true":
        pytest.skip("needs `apt-get install dataset-fashion-mnist` (always runs under CI=true)")
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    ds = load_dataset("fashion-mnist")
    assert ds.x_train.shape == (60_000, 1, 28, 28)
    assert ds.x_test.shape == (10_000, 1, 28, 28)
    assert ds.x_train.dtype == np.float32
    assert np.array_equal(np.bincount(ds.y_train, minlength=10), np.full(10, 6_000))
    assert np.array_equal(np.bincount(ds.y_test, minlength=10), np.full(10, 1_000))
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    assert 0.2 < float(ds.x_train.mean()) < 0.4  # Fashion-MNIST's mean pixel is about 0.286


# ------------------------------------------------------------------------------ partitions


def test_dirichlet_deterministic_by_seed(digits: Dataset) -> None:
    a = dirichlet_split(digits, 15, alpha=0.5, seed=3)
    b = dirichlet_split(digits, 15, alpha=0.5, seed=3)
    c = dirichlet_split(digits, 15, alpha=0.5, seed=4)
    assert same_partition(a, b)
    assert not same_partition(a, c)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.x, y.x) and np.array_equal(x.y, y.y)


@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_dirichlet_covers_every_sample_once(digits: Dataset, fraction: float) -> None:
    p = dirichlet_split(digits, 25, alpha=0.3, seed=1, local_test_fraction=fraction)
    idx = all_indices(p)
    assert np.array_equal(np.sort(idx), np.arange(digits.n_train))
    for c in p:
        assert c.n >= 1
        assert np.array_equal(c.x, digits.x_train[c.indices])
        assert np.array_equal(c.y, digits.y_train[c.indices])
        if fraction:
            assert np.array_equal(c.x_test, digits.x_train[c.test_indices])
            assert np.array_equal(c.y_test, digits.y_train[c.test_indices])
        else:
            assert c.x_test is None and c.y_test is None
    assert [c.id for c in p] == list(range(25))


def test_lower_alpha_gives_more_skew(digits: Dataset) -> None:
    for seed in range(3):
        low = label_skew(dirichlet_split(digits, 20, alpha=0.1, seed=seed))
        mid = label_skew(dirichlet_split(digits, 20, alpha=1.0, seed=seed))
        high = label_skew(dirichlet_split(digits, 20, alpha=100.0, seed=seed))
        assert low > mid + 0.15, (seed, low, mid)
        assert mid > high + 0.15, (seed, mid, high)
        assert low > high + 0.5, (seed, low, high)
        assert high < 0.1


def test_label_skew_extremes(digits: Dataset) -> None:
    # one class per client: each client's distribution is a point mass, TV = 1 - p(class)
    p = shard_split(digits, 10, classes_per_client=1, seed=0)
    glob = np.bincount(digits.y_train) / digits.n_train
    expect = np.mean([1.0 - glob[c.y[0]] for c in p])
    assert label_skew(p) == pytest.approx(expect, abs=1e-12)
    one = iid_split(digits, 1)
    assert label_skew(one) == pytest.approx(0.0, abs=1e-12)


def test_dirichlet_min_size(digits: Dataset) -> None:
    p = dirichlet_split(digits, 10, alpha=0.2, seed=0, min_size=40)
    assert p.sizes().min() >= 40
    assert p.params["alpha"] == 0.2 and p.params["min_size"] == 40
    with pytest.raises(DataError) as e:
        dirichlet_split(digits, 28, alpha=0.01, seed=0, min_size=50, max_attempts=3,
                        rebalance=False)
    assert "larger alpha" in str(e.value) and "3 attempts" in str(e.value)


def test_iid_split(digits: Dataset) -> None:
    p = iid_split(digits, 7, seed=2)
    sizes = p.sizes()
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == digits.n_train
    assert np.array_equal(np.sort(all_indices(p)), np.arange(digits.n_train))
    assert same_partition(p, iid_split(digits, 7, seed=2))
    assert not same_partition(p, iid_split(digits, 7, seed=5))
    assert label_skew(p) < 0.1


@pytest.mark.parametrize("cpc", [1, 2, 3])
def test_shard_split_classes_per_client(digits: Dataset, cpc: int) -> None:
    p = shard_split(digits, 20, classes_per_client=cpc, seed=1, local_test_fraction=0.2)
    assert np.array_equal(np.sort(all_indices(p)), np.arange(digits.n_train))
    holders = np.zeros(10, dtype=int)
    for c in p:
        labels = np.unique(np.concatenate([c.y, c.y_test]))
        assert labels.size == cpc
        holders[labels] += 1
    # usage balanced: every class held by floor or ceil of 20*cpc/10 clients
    assert holders.min() >= (20 * cpc) // 10 and holders.max() <= -(-20 * cpc // 10)
    assert same_partition(p, shard_split(digits, 20, cpc, seed=1, local_test_fraction=0.2))
    assert not same_partition(p, shard_split(digits, 20, cpc, seed=2, local_test_fraction=0.2))


def test_local_test_follows_client_distribution(digits: Dataset) -> None:
    f = 0.25
    p = dirichlet_split(digits, 12, alpha=0.3, seed=5, local_test_fraction=f)
    base = dirichlet_split(digits, 12, alpha=0.3, seed=5)
    for c, b in zip(p, base, strict=True):
        # the split only divides the client's own samples; membership does not change
        assert np.array_equal(np.sort(np.concatenate([c.indices, c.test_indices])), b.indices)
        assert np.intersect1d(c.indices, c.test_indices).size == 0
        total = c.n + c.n_test
        assert abs(c.n_test - f * total) <= 1.0
        assert set(np.unique(c.y_test)) <= set(np.unique(c.y))
        tr = np.bincount(c.y, minlength=10)
        te = np.bincount(c.y_test, minlength=10)
        # per class, the test share is within ~one sample of f times the class count
        assert np.all(np.abs(te - f * (tr + te)) < 2.0), (c.id, tr, te)


def test_local_test_tiny_clients() -> None:
    # every test label must occur in the client's training labels, even for tiny clients
    x = np.zeros((7, 2), np.float32)
    y = np.array([0, 1, 2, 3, 0, 0, 1])
    ds = Dataset("tiny", x, y, x[:1], y[:1], n_classes=4, input_shape=(2,))
    p = iid_split(ds, 2, seed=0, local_test_fraction=0.5)
    for c in p:
        assert c.n >= 1
        assert set(c.y_test.tolist()) <= set(c.y.tolist())
    # a client whose classes are all singletons cannot spare a test sample
    q = shard_split(ds, 4, classes_per_client=1, seed=0, local_test_fraction=0.5)
    assert sorted(c.n + c.n_test for c in q) == [1, 1, 2, 3]
    for c in q:
        if c.n + c.n_test == 1:
            assert c.n == 1 and c.n_test == 0


def test_partition_sequence_and_summary(digits: Dataset) -> None:
    p = dirichlet_split(digits, 6, alpha=1.0, seed=0, local_test_fraction=0.2)
    assert len(p) == 6 and isinstance(p[0], ClientData) and p[-1] is p.clients[5]
    assert [c.id for c in p[1:3]] == [1, 2]
    assert p.dataset is digits
    s = p.summary()
    json.dumps(s)
    assert s["n_clients"] == 6 and s["scheme"] == "dirichlet"
    assert s["n_train"] + s["n_local_test"] == digits.n_train
    for row, c in zip(s["clients"], p, strict=True):
        assert row["n_train"] == c.n and row["n_test"] == c.n_test
        assert sum(row["histogram"]) == c.n
        assert row["histogram"] == np.bincount(c.y, minlength=10).tolist()
    assert s["label_skew"] == label_skew(p)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: iid_split(d, 0),
        lambda d: iid_split(d, d.n_train + 1),
        lambda d: iid_split(d, 2.5),
        lambda d: iid_split(d, True),
        lambda d: iid_split(d, 3, seed=-1),
        lambda d: iid_split(d, 3, local_test_fraction=1.0),
        lambda d: iid_split(d, 3, local_test_fraction=-0.1),
        lambda d: iid_split("digits", 3),
        lambda d: dirichlet_split(d, 3, alpha=0.0),
        lambda d: dirichlet_split(d, 3, alpha=-1.0),
        lambda d: dirichlet_split(d, 3, alpha=float("nan")),
        lambda d: dirichlet_split(d, 3, alpha=float("inf")),
        lambda d: dirichlet_split(d, 3, alpha=1.0, min_size=0),
        lambda d: dirichlet_split(d, 3, alpha=1.0, min_size=d.n_train),
        lambda d: shard_split(d, 10, classes_per_client=0),
        lambda d: shard_split(d, 10, classes_per_client=11),
        lambda d: shard_split(d, 4, classes_per_client=2),  # 8 slots < 10 classes
    ],
    ids=["zero-clients", "too-many-clients", "float-clients", "bool-clients", "neg-seed",
         "fraction-1", "fraction-neg", "not-a-dataset", "alpha-0", "alpha-neg", "alpha-nan",
         "alpha-inf", "min-size-0", "min-size-huge", "cpc-0", "cpc-11", "too-few-slots"],
)
def test_argument_errors(digits: Dataset, call: Callable[[Dataset], object]) -> None:
    with pytest.raises(DataError) as e:
        call(digits)
    assert isinstance(e.value, ValueError)
    assert len(str(e.value)) > 20  # says what is wrong


def test_shard_split_not_enough_samples_in_class() -> None:
    x = np.zeros((6, 1), np.float32)
    y = np.array([0, 0, 0, 0, 0, 1])
    ds = Dataset("toy", x, y, x, y, n_classes=2, input_shape=(1,))
    with pytest.raises(DataError, match="class 1 has 1 training samples"):
        shard_split(ds, 4, classes_per_client=1, seed=0)
