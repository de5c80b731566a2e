"""The data containers: a :class:`Dataset` (train and test arrays, read-only), one
client's :class:`ClientData`, and a :class:`Partition` that hands each simulated client
its own; :func:`label_skew` measures how far its clients' labels are from the whole."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any, overload

import numpy as np

from secagg.errors import DataError


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
