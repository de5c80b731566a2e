"""Data sets and federated partitions.

Three data sets are known to :func:`load_dataset`:

* ``"digits"`` -- scikit-learn's 8x8 handwritten digits (bundled with scikit-learn, so it
  works offline; the embedded default). Features are scaled to [0, 1]; a fixed, stratified
  80/20 train/test split.
* ``"fashion-mnist"`` and ``"mnist"`` -- read from a directory holding the four standard IDX
  files (``train-images-idx3-ubyte.gz`` and friends, gzip-compressed or not). Fashion-MNIST
  defaults to ``/usr/share/datasets/fashion-mnist/``, where Debian's ``dataset-fashion-mnist``
  package installs it. ``SECAGG_DATA_DIR`` overrides the default; ``data_dir=`` overrides both.

A :class:`Partition` hands each simulated client its own :class:`ClientData`. The
partitioners (:func:`iid_split`, :func:`dirichlet_split`, :func:`shard_split`,
:func:`label_shards_split`) are
deterministic by seed, assign every training sample to exactly one client, give every client
at least one sample (or raise :class:`~secagg.errors.DataError`), and can carve a local test
set out of each client's own samples, stratified by label so that it follows that client's
label distribution.
"""

from __future__ import annotations

import gzip
import heapq
import importlib.util
import math
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any, overload

import numpy as np

from secagg.errors import DataError

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIRS",
    "IDX_FILES",
    "SPLITS",
    "ClientData",
    "Dataset",
    "Partition",
    "dirichlet_split",
    "iid_split",
    "label_shards_split",
    "label_skew",
    "load_dataset",
    "make_split",
    "read_idx",
    "shard_split",
]

#: Names accepted by :func:`load_dataset`.
DATASETS: tuple[str, ...] = ("digits", "fashion-mnist", "mnist")

#: Environment variable naming a directory of IDX files (or of per-data-set subdirectories).
DATA_DIR_ENV = "SECAGG_DATA_DIR"

#: Default directories per data set (Debian's ``dataset-fashion-mnist`` installs here).
DEFAULT_DATA_DIRS: dict[str, Path] = {
    "fashion-mnist": Path("/usr/share/datasets/fashion-mnist"),
}

#: The four standard IDX file names (without ``.gz``), by role.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# IDX type byte -> big-endian numpy dtype (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE
# FORMAT"): 0x08 unsigned byte, 0x09 signed byte, 0x0B short, 0x0C int, 0x0D float, 0x0E double.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_PRETTY = {"digits": "digits", "fashion-mnist": "Fashion-MNIST", "mnist": "MNIST"}


# --------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


@dataclass(frozen=True)
class Dataset:
    """A labelled data set with a fixed train/test split.

    ``x_train``/``x_test`` have shape ``(n, *input_shape)`` (float32, scaled to [0, 1]);
    ``y_train``/``y_test`` are int64 labels in ``0..n_classes-1``. The arrays are made
    read-only so that partitions and algorithms cannot alter the shared copy by accident.
    Inconsistent shapes or labels raise :class:`~secagg.errors.DataError`.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.input_shape)
        object.__setattr__(self, "input_shape", shape)
        if not isinstance(self.n_classes, Integral) or self.n_classes < 1:
            raise DataError(f"data set {self.name!r}: n_classes must be a positive integer, "
                            f"got {self.n_classes!r}")
        for part in ("train", "test"):
            x = np.asarray(getattr(self, f"x_{part}"))
            y = np.asarray(getattr(self, f"y_{part}"))
            if x.shape[1:] != shape:
                raise DataError(f"data set {self.name!r}: x_{part} has shape {x.shape}, "
                                f"expected (n, {', '.join(map(str, shape))})")
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise DataError(f"data set {self.name!r}: y_{part} has shape {y.shape}, "
                                f"expected ({x.shape[0]},) to match x_{part}")
            if not np.issubdtype(y.dtype, np.integer):
                raise DataError(f"data set {self.name!r}: y_{part} must hold integer labels, "
                                f"got dtype {y.dtype}")
            if y.size and (y.min() < 0 or y.max() >= self.n_classes):
                raise DataError(f"data set {self.name!r}: y_{part} has labels outside "
                                f"0..{self.n_classes - 1}")
            object.__setattr__(self, f"x_{part}", _readonly(x))
            object.__setattr__(self, f"y_{part}", _readonly(y.astype(np.int64, copy=False)))

    @property
    def n_train(self) -> int:
        """Number of training samples."""
        return int(self.y_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of (global) test samples."""
        return int(self.y_test.shape[0])

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, n_train={self.n_train}, n_test={self.n_test}, "
                f"n_classes={self.n_classes}, input_shape={self.input_shape})")


@dataclass
class ClientData:
    """One client's private data.

    ``x``/``y`` are the client's training samples; ``x_test``/``y_test`` its local test set
    (``None`` when the partition was made without ``local_test_fraction``). ``indices`` and
    ``test_indices`` give the positions of these samples in ``Dataset.x_train`` (both sets are
    carved from the global training set), so coverage can be audited.
    """

    id: int
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    indices: np.ndarray | None = None
    test_indices: np.ndarray | None = None

    @property
    def n(self) -> int:
        """Number of local training samples."""
        return int(self.y.shape[0])

    @property
    def n_test(self) -> int:
        """Number of local test samples (0 when there is no local test set)."""
        return 0 if self.y_test is None else int(self.y_test.shape[0])

    def __repr__(self) -> str:
        return f"ClientData(id={self.id}, n={self.n}, n_test={self.n_test})"


class Partition(Sequence[ClientData]):
    """A data set split across clients: a read-only sequence of :class:`ClientData`.

    ``scheme`` and ``params`` record how the split was made (for results and transcripts).
    """

    def __init__(self, dataset: Dataset, clients: Sequence[ClientData], scheme: str = "custom",
                 params: dict[str, Any] | None = None) -> None:
        if len(clients) == 0:
            raise DataError("a partition needs at least one client")
        self.dataset = dataset
        self.clients: list[ClientData] = list(clients)
        self.scheme = scheme
        self.params: dict[str, Any] = dict(params or {})

    @overload
    def __getitem__(self, i: int) -> ClientData: ...

    @overload
    def __getitem__(self, i: slice) -> list[ClientData]: ...

    def __getitem__(self, i: int | slice) -> ClientData | list[ClientData]:
        return self.clients[i]

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[ClientData]:
        return iter(self.clients)

    def sizes(self) -> np.ndarray:
        """Local training-set size of each client, as an int64 array."""
        return np.array([c.n for c in self.clients], dtype=np.int64)

    def histograms(self, include_test: bool = False) -> np.ndarray:
        """Per-client label counts, shape ``(n_clients, n_classes)``.

        With ``include_test`` the local test labels are counted too.
        """
        k = self.dataset.n_classes
        rows = []
        for c in self.clients:
            h = np.bincount(c.y, minlength=k)
            if include_test and c.y_test is not None:
                h = h + np.bincount(c.y_test, minlength=k)
            rows.append(h)
        return np.asarray(rows, dtype=np.int64)

    def summary(self) -> dict[str, Any]:
        """A JSON-able description: scheme, parameters, label skew and, per client, the
        training/local-test sizes and the training-label histogram."""
        hist = self.histograms()
        sizes = self.sizes()
        return {
            "dataset": self.dataset.name,
            "scheme": self.scheme,
            "params": dict(self.params),
            "n_clients": len(self),
            "n_train": int(sizes.sum()),
            "n_local_test": int(sum(c.n_test for c in self.clients)),
            "min_size": int(sizes.min()),
            "max_size": int(sizes.max()),
            "label_skew": label_skew(self),
            "clients": [
                {"id": int(c.id), "n_train": c.n, "n_test": c.n_test,
                 "histogram": [int(v) for v in h]}
                for c, h in zip(self.clients, hist, strict=True)
            ],
        }

    def __repr__(self) -> str:
        return (f"Partition(dataset={self.dataset.name!r}, scheme={self.scheme!r}, "
                f"n_clients={len(self)}, params={self.params})")


# --------------------------------------------------------------------------------------------
# IDX files
# --------------------------------------------------------------------------------------------


def _how_to_get(name: str | None = None) -> str:
    files = ", ".join(f"{f}.gz" for f in IDX_FILES.values())
    apt = ("install Debian's package (`sudo apt-get install dataset-fashion-mnist`, which puts "
           "Fashion-MNIST in /usr/share/datasets/fashion-mnist/), or ")
    if name == "mnist":
        apt = ""
    return (f"To get the data: {apt}pass data_dir= (CLI: --data-dir) or set {DATA_DIR_ENV} to a "
            f"directory holding the four standard IDX files ({files}; uncompressed copies "
            f"without .gz also work)")


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (gzip-compressed or not) into a native-endian numpy array.

    The header is checked: two zero bytes, a known type byte (0x08 unsigned byte ... 0x0E
    double), a non-zero dimension count, and a payload whose size matches the dimensions
    exactly. Any problem (missing, unreadable, truncated, trailing bytes, bad magic, corrupt
    gzip) raises :class:`~secagg.errors.DataError` naming the file.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise DataError(f"IDX file {p} does not exist. {_how_to_get()}") from None
    except OSError as e:
        raise DataError(f"IDX file {p} cannot be read ({e.strerror or e}). "
                        f"{_how_to_get()}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise DataError(f"IDX file {p} is truncated: the gzip stream ends early "
                            f"(incomplete download?). {_how_to_get()}") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as e:
            raise DataError(f"IDX file {p} is not a valid gzip file ({e}). "
                            f"{_how_to_get()}") from None
    if len(raw) < 4:
        raise DataError(f"IDX file {p} is truncated: {len(raw)} bytes, shorter than the 4-byte "
                        f"magic number. {_how_to_get()}")
    magic = int.from_bytes(raw[:4], "big")
    dtype = _IDX_DTYPES.get(raw[2])
    ndim = raw[3]
    if raw[0] != 0 or raw[1] != 0 or dtype is None or ndim == 0:
        raise DataError(f"IDX file {p} has a bad magic number 0x{magic:08X}: expected "
                        f"0x000008NN (0x00000801 for labels, 0x00000803 for images); it is not "
                        f"an IDX file. {_how_to_get()}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {p} is truncated: the header needs {header} bytes for "
                        f"{ndim} dimensions, the file has {len(raw)}. {_how_to_get()}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = math.prod(dims) * dtype.itemsize
    got = len(raw) - header
    if got < expected:
        raise DataError(f"IDX file {p} is truncated: its header declares dimensions {dims} "
                        f"({expected} bytes of data), but only {got} bytes follow. "
                        f"{_how_to_get()}")
    if got > expected:
        raise DataError(f"IDX file {p} is corrupt: its header declares dimensions {dims} "
                        f"({expected} bytes of data), but {got - expected} extra bytes follow. "
                        f"{_how_to_get()}")
    arr = np.frombuffer(raw, dtype=dtype, count=math.prod(dims), offset=header)
    return arr.reshape(dims).astype(dtype.newbyteorder("="), copy=True)


def _find_idx(directory: Path, stem: str, name: str) -> Path:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    raise DataError(f"{_PRETTY[name]}: file {stem}.gz (or {stem}) not found in {directory}. "
                    f"{_how_to_get(name)}")


def _resolve_dir(name: str, data_dir: str | os.PathLike[str] | None) -> Path:
    if data_dir is not None:
        base, origin = Path(data_dir), "data_dir"
    elif os.environ.get(DATA_DIR_ENV):
        base, origin = Path(os.environ[DATA_DIR_ENV]), DATA_DIR_ENV
    elif name in DEFAULT_DATA_DIRS:
        base, origin = DEFAULT_DATA_DIRS[name], "the default location"
    else:
        raise DataError(f"{_PRETTY[name]} has no default location: pass data_dir= (CLI: "
                        f"--data-dir) or set {DATA_DIR_ENV}. {_how_to_get(name)}")
    # A directory with one subdirectory per data set is accepted too.
    sub = base / name
    stem = IDX_FILES["train_images"]
    if (sub / f"{stem}.gz").is_file() or (sub / stem).is_file():
        return sub
    if not base.is_dir():
        raise DataError(f"{_PRETTY[name]}: directory {base} ({origin}) does not exist or is not "
                        f"a directory. {_how_to_get(name)}")
    return base


def _load_idx_dataset(name: str, data_dir: str | os.PathLike[str] | None) -> Dataset:
    d = _resolve_dir(name, data_dir)
    paths = {role: _find_idx(d, stem, name) for role, stem in IDX_FILES.items()}
    arrays = {role: read_idx(p) for role, p in paths.items()}
    out: dict[str, np.ndarray] = {}
    for part in ("train", "test"):
        xi, yi = f"{part}_images", f"{part}_labels"
        x, y = arrays[xi], arrays[yi]
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
            raise DataError(f"{_PRETTY[name]}: {paths[xi]} should hold unsigned-byte 28x28 "
                            f"images (magic 0x00000803), found dtype {x.dtype} and shape "
                            f"{x.shape}. {_how_to_get(name)}")
        if y.dtype != np.uint8 or y.ndim != 1:
            raise DataError(f"{_PRETTY[name]}: {paths[yi]} should hold unsigned-byte labels "
                            f"(magic 0x00000801), found dtype {y.dtype} and shape {y.shape}. "
                            f"{_how_to_get(name)}")
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{_PRETTY[name]}: {paths[xi]} has {x.shape[0]} images but "
                            f"{paths[yi]} has {y.shape[0]} labels; the files do not belong "
                            f"together. {_how_to_get(name)}")
        if x.shape[0] == 0:
            raise DataError(f"{_PRETTY[name]}: {paths[xi]} holds no images. {_how_to_get(name)}")
        if y.max() > 9:
            bad = int(np.flatnonzero(y > 9)[0])
            raise DataError(f"{_PRETTY[name]}: {paths[yi]} has label {int(y[bad])} at position "
                            f"{bad}, outside 0..9. {_how_to_get(name)}")
        xf = x.astype(np.float32)
        xf *= np.float32(1.0 / 255.0)
        out[f"x_{part}"] = xf.reshape(-1, 1, 28, 28)
        out[f"y_{part}"] = y.astype(np.int64)
    return Dataset(name=name, n_classes=10, input_shape=(1, 28, 28), **out)


def _digits_file() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing scikit-learn
    (its import costs ~1.7 CPU-seconds, paid again by every process that loads the digits:
    each Flower ClientApp message is one); None if this installation lays it out elsewhere."""
    spec = importlib.util.find_spec("sklearn")
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(base, "datasets", "data", "digits.csv.gz")
        if path.is_file():
            return path
    return None


def _load_digits() -> Dataset:
    path = _digits_file()
    raw = None
    if path is not None:
        # the file scikit-learn's load_digits reads, parsed as it parses it (np.loadtxt):
        # 1797 rows of 64 pixel counts in 0..16 and the label
        with gzip.open(path, "rt", encoding="utf-8") as f:
            raw = np.loadtxt(f, delimiter=",")
        if raw.shape != (1797, 65):
            raw = None
    if raw is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        data, target = bunch.data, bunch.target
    else:
        data, target = raw[:, :-1], raw[:, -1]
    x = (np.asarray(data, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(target, dtype=np.int64)
    train, test = _stratified_split(y, 0.2, np.random.default_rng(0))
    return Dataset(name="digits", x_train=x[train], y_train=y[train], x_test=x[test],
                   y_test=y[test], n_classes=10, input_shape=(64,))


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Load a data set by name: ``"digits"``, ``"fashion-mnist"`` or ``"mnist"``.

    ``digits`` is scikit-learn's (offline; read from the file it ships without importing
    it; ``data_dir`` is ignored): 64 features in [0, 1], a stratified 80/20 split with a
    fixed seed (1438 train / 359 test). The MNIST-style
    sets are read from ``data_dir``, else ``$SECAGG_DATA_DIR``, else (Fashion-MNIST only)
    ``/usr/share/datasets/fashion-mnist/``; a directory holding a ``fashion-mnist/`` or
    ``mnist/`` subdirectory works too. Images are float32 in [0, 1] with shape
    ``(n, 1, 28, 28)``; labels int64. Unknown names, missing or corrupt files raise
    :class:`~secagg.errors.DataError` saying what is wrong and how to get the data.
    """
    if not isinstance(name, str):
        raise DataError(f"data set name must be a string, got {name!r}; valid names: "
                        f"{', '.join(DATASETS)}")
    key = name.strip().lower().replace("_", "-")
    if key == "fashionmnist":
        key = "fashion-mnist"
    if key not in DATASETS:
        raise DataError(f"unknown data set {name!r}; valid names: {', '.join(DATASETS)}")
    if key == "digits":
        return _load_digits()
    return _load_idx_dataset(key, data_dir)


# --------------------------------------------------------------------------------------------
# Partitions
# --------------------------------------------------------------------------------------------


def _stratified_split(y: np.ndarray, fraction: float,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(y)-1`` into (train, test), stratified by label.

    The test set gets ``round(fraction * n)`` samples (at least one when ``fraction > 0`` and
    possible), allocated to classes in proportion to their counts by largest remainders, and
    never the last sample of a class, so every test label also occurs in the training part.
    Both returned arrays are sorted.
    """
    n = y.shape[0]
    if fraction <= 0 or n == 0:
        return np.arange(n, dtype=np.int64), np.empty(0, dtype=np.int64)
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    capacity = counts - 1
    target = min(math.floor(fraction * n + 0.5), int(capacity.sum()))
    if target == 0 and capacity.sum() > 0:
        target = 1
    quota = counts * (target / n)  # proportional shares; they sum to target
    take = np.minimum(np.floor(quota).astype(np.int64), capacity)
    short = target - int(take.sum())
    while short > 0:  # at most a few passes: hand out the rest by largest remainder
        room = take < capacity
        rem = np.where(room, quota - take, -np.inf)
        tiebreak = rng.random(rem.shape[0])
        order = np.lexsort((tiebreak, -rem))
        give = order[: min(short, int(room.sum()))]
        take[give] += 1
        short -= give.shape[0]
    # Random choice within each class, all classes at once: rank positions by a random key.
    keys = rng.random(n)
    order = np.lexsort((keys, inverse))  # grouped by class, random within the class
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, counts)
    is_test = rank < take[inverse]
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def _check_int(name: str, value: Any, lo: int, hi: int | None = None, why: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise DataError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise DataError(f"{name} must be {rng}{why}, got {v}")
    return v


def _check_common(ds: Dataset, n_clients: Any, seed: Any,
                  local_test_fraction: Any) -> tuple[int, int, float]:
    if not isinstance(ds, Dataset):
        raise DataError(f"expected a secagg.data.Dataset, got {type(ds).__name__}")
    k = _check_int("n_clients", n_clients, 1, ds.n_train,
                   f" (the training set of {ds.name!r} has {ds.n_train} samples)")
    s = _check_int("seed", seed, 0)
    if isinstance(local_test_fraction, bool) or not isinstance(local_test_fraction, Real):
        raise DataError(f"local_test_fraction must be a number in [0, 1), "
                        f"got {local_test_fraction!r}")
    f = float(local_test_fraction)
    if not (0.0 <= f < 1.0):
        raise DataError(f"local_test_fraction must be in [0, 1), got {f}")
    return k, s, f


def _build(ds: Dataset, owner: np.ndarray, n_clients: int, seed: int, fraction: float,
           scheme: str, params: dict[str, Any]) -> Partition:
    """Turn an owner array (client of each training sample) into a :class:`Partition`."""
    counts = np.bincount(owner, minlength=n_clients)
    order = np.argsort(owner, kind="stable")  # positions grouped by client, ascending within
    groups = np.split(order, np.cumsum(counts)[:-1])
    rng_local = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    clients = []
    for cid, idx in enumerate(groups):
        idx = idx.astype(np.int64, copy=False)
        if fraction > 0:
            tr, te = _stratified_split(ds.y_train[idx], fraction, rng_local)
            tr_idx, te_idx = idx[tr], idx[te]
            clients.append(ClientData(cid, ds.x_train[tr_idx], ds.y_train[tr_idx],
                                      ds.x_train[te_idx], ds.y_train[te_idx],
                                      indices=tr_idx, test_indices=te_idx))
        else:
            clients.append(ClientData(cid, ds.x_train[idx], ds.y_train[idx], indices=idx))
    params = {**params, "n_clients": n_clients, "seed": seed, "local_test_fraction": fraction}
    return Partition(ds, clients, scheme=scheme, params=params)


def _assign_rng(seed: int) -> np.random.Generator:
    # The assignment and the local test split use independent streams, so the set of samples
    # a client holds does not depend on local_test_fraction.
    return np.random.default_rng(np.random.SeedSequence([seed, 0]))


def iid_split(ds: Dataset, n_clients: int, seed: int = 0,
              local_test_fraction: float = 0.0) -> Partition:
    """Shuffle the training set and deal it into ``n_clients`` parts whose sizes differ by at
    most one. ``local_test_fraction`` carves a stratified local test set from each part."""
    k, s, f = _check_common(ds, n_clients, seed, local_test_fraction)
    perm = _assign_rng(s).permutation(ds.n_train)
    owner = np.empty(ds.n_train, dtype=np.int64)
    owner[perm] = np.repeat(np.arange(k), [len(a) for a in np.array_split(perm, k)])
    return _build(ds, owner, k, s, f, "iid", {})


def dirichlet_split(ds: Dataset, n_clients: int, alpha: float, seed: int = 0,
                    local_test_fraction: float = 0.0, min_size: int = 1,
                    max_attempts: int = 100, rebalance: bool = True) -> Partition:
    """Label-skewed split: for each class, the share of each client is drawn from a symmetric
    Dirichlet(alpha) over clients, and the class's shuffled samples are cut accordingly.

    Small ``alpha`` (e.g. 0.1) gives clients few dominant classes; large ``alpha`` approaches
    an iid split. Draws are repeated (same seed stream) until every client holds at least
    ``min_size`` samples. With many clients no draw may succeed (10,000 clients on
    Fashion-MNIST's 60,000 records at alpha 0.5: a client's expected share is 6 records, and
    hundreds of clients draw none). Then, with ``rebalance`` (the default), the draw with
    the smallest total shortfall is repaired: one record at a time goes from the client that
    holds the most records at that moment (ties: lower id) to the clients below
    ``min_size``, until each has ``min_size``; each donor gives records drawn at random from
    its own, and the pooled records are dealt at random to the clients short of records, in
    id order. Donors never fall below ``min_size`` (the most-loaded client gives first), so
    this succeeds whenever ``n_clients * min_size <= n_train``; it moves the fewest records
    that can lift every client to ``min_size``, and leaves every client that neither gives
    nor receives as drawn.
    The partition's ``params`` record ``attempts`` and ``moved`` (records moved; 0 when a
    draw succeeded). Without ``rebalance``, ``max_attempts`` failures raise a
    :class:`~secagg.errors.DataError` suggesting a larger alpha, fewer clients or a smaller
    min_size. Everything is deterministic by ``seed``.
    """
    k, s, f = _check_common(ds, n_clients, seed, local_test_fraction)
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) \
            or alpha <= 0:
        raise DataError(f"alpha must be a finite number > 0, got {alpha!r}")
    m = _check_int("min_size", min_size, 1, ds.n_train // k,
                   f" ({ds.n_train} samples for {k} clients)")
    tries = _check_int("max_attempts", max_attempts, 1)
    rng = _assign_rng(s)
    y = ds.y_train
    classes = [np.flatnonzero(y == c) for c in range(ds.n_classes)]
    classes = [idx for idx in classes if idx.size]
    owner = np.empty(ds.n_train, dtype=np.int64)
    smallest = 0
    best, best_short = owner, -1
    for attempt in range(1, tries + 1):
        for idx in classes:
            p = rng.dirichlet(np.full(k, float(alpha)))
            if not np.all(np.isfinite(p)):  # pragma: no cover - numpy guards tiny alphas
                p = np.full(k, 1.0 / k)
            cuts = np.rint(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            counts = np.diff(np.concatenate(([0], np.clip(cuts, 0, idx.size), [idx.size])))
            owner[rng.permutation(idx)] = np.repeat(np.arange(k), counts)
        sizes = np.bincount(owner, minlength=k)
        smallest = int(sizes.min())
        if smallest >= m:
            return _build(ds, owner, k, s, f, "dirichlet",
                          {"alpha": float(alpha), "min_size": m, "attempts": attempt,
                           "moved": 0})
        short = int(np.maximum(m - sizes, 0).sum())
        if rebalance and (best_short < 0 or short < best_short):
            best, best_short = owner.copy(), short
    if rebalance:
        moved = _rebalance(best, k, m, rng)
        return _build(ds, best, k, s, f, "dirichlet",
                      {"alpha": float(alpha), "min_size": m, "attempts": tries,
                       "moved": moved})
    raise DataError(f"dirichlet_split(alpha={alpha}, n_clients={k}) could not give every client "
                    f"at least {m} sample(s) in {tries} attempts (smallest client in the last "
                    f"draw: {smallest}); use a larger alpha, fewer clients or a smaller "
                    f"min_size, or rebalance=True")


def _rebalance(owner: np.ndarray, k: int, m: int, rng: np.random.Generator) -> int:
    """Lift every client of ``owner`` to at least ``m`` records (in place), moving records
    one at a time from the client holding the most; returns the number moved."""
    sizes = np.bincount(owner, minlength=k)
    need = np.maximum(m - sizes, 0)
    total = int(need.sum())
    if total == 0:
        return 0
    # the donors' counts: repeatedly take one from the currently largest (lower id on ties)
    heap = [(-int(n), int(c)) for c, n in enumerate(sizes) if n > m]
    heapq.heapify(heap)
    give = np.zeros(k, dtype=np.int64)
    for _ in range(total):
        n, c = heapq.heappop(heap)
        give[c] += 1
        if -n - 1 > m:
            heapq.heappush(heap, (n + 1, c))
    order = np.argsort(owner, kind="stable")
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    pool = np.concatenate([rng.choice(order[starts[c]:starts[c] + sizes[c]], int(give[c]),
                                      replace=False) for c in np.flatnonzero(give)])
    pool = rng.permutation(pool)
    owner[pool] = np.repeat(np.arange(k), need)
    return total


def shard_split(ds: Dataset, n_clients: int, classes_per_client: int, seed: int = 0,
                local_test_fraction: float = 0.0) -> Partition:
    """Pathological non-iid split: every client holds samples of exactly
    ``classes_per_client`` distinct classes.

    Class sets are drawn at random while keeping class usage balanced (each class is held by
    ``floor`` or ``ceil`` of ``n_clients * classes_per_client / n_classes`` clients, so every
    class is covered); each class's shuffled samples are dealt evenly among its holders. Needs
    ``n_clients * classes_per_client >= n_classes`` and enough samples per class.
    """
    k, s, f = _check_common(ds, n_clients, seed, local_test_fraction)
    present = np.flatnonzero(np.bincount(ds.y_train, minlength=ds.n_classes))
    c = present.size
    cpc = _check_int("classes_per_client", classes_per_client, 1, c,
                     f" ({ds.name!r} has {c} classes with training samples)")
    if k * cpc < c:
        raise DataError(f"shard_split: {k} clients x {cpc} classes per client cover at most "
                        f"{k * cpc} of the {c} classes, so some samples would be left out; use "
                        f"more clients or more classes per client")
    rng = _assign_rng(s)
    usage = np.zeros(c, dtype=np.int64)
    holders: list[list[int]] = [[] for _ in range(c)]
    for cid in range(k):
        # least-used classes first, ties broken at random (the random key is < 1)
        pick = np.argsort(usage + rng.random(c), kind="stable")[:cpc]
        usage[pick] += 1
        for j in pick:
            holders[int(j)].append(cid)
    owner = np.empty(ds.n_train, dtype=np.int64)
    for j, cls in enumerate(present):
        idx = np.flatnonzero(ds.y_train == cls)
        h = holders[j]
        if idx.size < len(h):
            raise DataError(f"shard_split: class {int(cls)} has {idx.size} training samples but "
                            f"{len(h)} clients should hold it; use fewer clients or fewer "
                            f"classes per client")
        sizes = [len(a) for a in np.array_split(np.arange(idx.size), len(h))]
        owner[rng.permutation(idx)] = np.repeat(np.asarray(h, dtype=np.int64), sizes)
    return _build(ds, owner, k, s, f, "shard", {"classes_per_client": cpc})


def label_shards_split(ds: Dataset, n_clients: int, shards_per_client: int = 2, seed: int = 0,
                       local_test_fraction: float = 0.0) -> Partition:
    """McMahan et al. (AISTATS 2017)'s pathological non-iid split: the training set sorted by
    label is cut into ``n_clients * shards_per_client`` shards, and each client gets
    ``shards_per_client`` of them at random (their MNIST setting: 200 shards of 300 for 100
    clients, 2 each).

    Here the shards are cut within each class, so a shard never straddles two labels and a
    client holds at most ``shards_per_client`` labels: the shards go to the classes in
    proportion to their sizes (largest remainders, ties to the lower label; every class with
    samples gets at least one), and each class's shuffled samples are cut into its shards,
    whose sizes differ by at most one. On a balanced set whose class size is a multiple of
    its shard count (Fashion-MNIST: 6,000 per class, e.g. 10,000 clients x 2 shards = 3
    records a shard), every shard and so every client has the same size. Every sample goes
    to exactly one client; deterministic by ``seed``. Needs at least one shard per class
    with samples and at least one sample per shard.
    """
    k, s, f = _check_common(ds, n_clients, seed, local_test_fraction)
    spc = _check_int("shards_per_client", shards_per_client, 1)
    counts = np.bincount(ds.y_train, minlength=ds.n_classes)
    present = np.flatnonzero(counts)
    total = k * spc
    if total < present.size or total > ds.n_train:
        raise DataError(f"label_shards_split: {k} clients x {spc} shards = {total} shards, but "
                        f"{ds.name!r} needs between {present.size} (one per class) and "
                        f"{ds.n_train} (one sample each); change n_clients or "
                        f"shards_per_client")
    quota = counts[present] * (total / ds.n_train)
    per_class = np.floor(quota).astype(np.int64)
    rest = total - int(per_class.sum())
    per_class[np.argsort(-(quota - per_class), kind="stable")[:rest]] += 1
    while (per_class == 0).any():  # a tiny class: take a shard from the class with most
        per_class[int(np.argmax(per_class))] -= 1
        per_class[int(np.argmin(per_class))] += 1
    rng = _assign_rng(s)
    shard_of = np.empty(ds.n_train, dtype=np.int64)
    first = 0
    for cls, nshards in zip(present, per_class, strict=True):
        idx = rng.permutation(np.flatnonzero(ds.y_train == cls))
        sizes = [len(a) for a in np.array_split(np.arange(idx.size), int(nshards))]
        shard_of[idx] = first + np.repeat(np.arange(int(nshards)), sizes)
        first += int(nshards)
    client_of_shard = np.empty(total, dtype=np.int64)
    client_of_shard[rng.permutation(total)] = np.repeat(np.arange(k), spc)
    return _build(ds, client_of_shard[shard_of], k, s, f, "shards",
                  {"shards_per_client": spc})


#: The split schemes :func:`make_split` knows (the CLI's ``--split``, a sweep's ``data.split``).
SPLITS: tuple[str, ...] = ("dirichlet", "iid", "shards")


def make_split(ds: Dataset, split: str, n_clients: int, *, alpha: float = 0.5,
               shards_per_client: int = 2, seed: int = 0,
               local_test_fraction: float = 0.0) -> Partition:
    """The partition a scheme name selects: ``"dirichlet"`` (:func:`dirichlet_split` with
    ``alpha``; alpha 0 means IID, as the CLI's ``--alpha 0`` always did), ``"iid"``
    (:func:`iid_split`) or ``"shards"`` (:func:`label_shards_split` with
    ``shards_per_client``). An unknown name raises :class:`~secagg.errors.DataError`."""
    if split == "iid" or (split == "dirichlet" and alpha == 0):
        return iid_split(ds, n_clients, seed=seed, local_test_fraction=local_test_fraction)
    if split == "dirichlet":
        return dirichlet_split(ds, n_clients, alpha, seed=seed,
                               local_test_fraction=local_test_fraction)
    if split == "shards":
        return label_shards_split(ds, n_clients, shards_per_client, seed=seed,
                                  local_test_fraction=local_test_fraction)
    raise DataError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")


def label_skew(partition: Partition) -> float:
    """Mean total-variation distance between each client's label distribution (its training
    and local test samples together) and the global training label distribution.

    0 means every client looks like the whole data set; values near 1 mean clients hold
    nearly disjoint label sets.
    """
    hist = partition.histograms(include_test=True).astype(np.float64)
    glob = np.bincount(partition.dataset.y_train, minlength=partition.dataset.n_classes)
    glob = glob / glob.sum()
    local = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1.0)
    return float(0.5 * np.abs(local - glob).sum(axis=1).mean())

