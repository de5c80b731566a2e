"""Loading a data set by name: scikit-learn's digits (offline), and Fashion-MNIST and
MNIST from the standard IDX files (:func:`read_idx`), with errors that say how to get
the data."""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
import zlib
from pathlib import Path

import numpy as np

from secagg.data.containers import Dataset
from secagg.data.splits import _stratified_split
from secagg.errors import DataError

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
