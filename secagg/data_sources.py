"""Where a run's clients come from: a named data set split over clients, your own data
(an ``.npz`` file or a ``module:loader`` function), or the synthetic federated population
Synthetic(alpha, beta) of the FedProx paper (Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020, section 5.1).

:func:`load_partition` reads the command line's ``--dataset`` forms:

* ``digits``, ``fashion-mnist``, ``mnist`` -- :func:`secagg.data.load_dataset`, then the
  split (``--split``/``--alpha``);
* ``synthetic`` or ``synthetic:ALPHA,BETA`` (default 1,1) -- :func:`synthetic_partition`:
  naturally federated, so the split options do not apply;
* ``PATH.npz`` -- :func:`load_npz`: arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``
  (optional ``n_classes``), then the split;
* ``module:loader`` -- ``loader()`` returns a :class:`~secagg.data.Dataset` (then the
  split) or a ready :class:`~secagg.data.Partition`.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from secagg.data import DATASETS, ClientData, Dataset, Partition, load_dataset, make_split
from secagg.errors import DataError

__all__ = ["SYNTHETIC_DIM", "describe_source", "load_npz", "load_partition",
           "synthetic_partition"]

#: Synthetic(alpha, beta): feature dimension and classes, as in the paper.
SYNTHETIC_DIM, SYNTHETIC_CLASSES = 60, 10


def synthetic_partition(n_clients: int, alpha: float = 1.0, beta: float = 1.0, seed: int = 0,
                        local_test_fraction: float = 0.0, mean_log_size: float = 3.0,
                        sigma_log_size: float = 1.0, min_size: int = 10,
                        max_size: int = 1000) -> Partition:
    """Synthetic(alpha, beta) of Li et al. (2020), generated offline from ``seed``.

    Client k draws u_k ~ N(0, alpha) and B_k ~ N(0, beta); its model W_k (10 x 60) and
    b_k have entries ~ N(u_k, 1); its input mean v_k has entries ~ N(B_k, 1); a record is
    x ~ N(v_k, diag(j^-1.2)) and its label argmax(W_k x + b_k). So alpha sets how much the
    clients' models differ and beta how much their inputs do.

    Client sizes follow a power law: ``min_size + lognormal(mean_log_size,
    sigma_log_size)`` records, capped at ``max_size`` (the paper's generator draws
    lognormal(4, 2) + 50, about 450 records a client on average; these defaults keep
    10,000 clients near 430,000 records). A fifth of each client's records (at least one)
    forms the global test set; with ``local_test_fraction`` a stratified part of the rest
    is the client's local test set.
    """
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise DataError(f"synthetic: {name} must be a number >= 0, got {v!r}")
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise DataError(f"synthetic: n_clients must be a positive integer, got {n_clients!r}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E7]))
    d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES
    sizes = np.minimum(min_size + rng.lognormal(mean_log_size, sigma_log_size, n_clients)
                       .astype(np.int64), max_size)
    std = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    u = rng.normal(0.0, math.sqrt(alpha), n_clients)
    big_b = rng.normal(0.0, math.sqrt(beta), n_clients)
    xs, ys, owners = [], [], []
    for k in range(n_clients):
        w = rng.normal(u[k], 1.0, (c, d))
        b = rng.normal(u[k], 1.0, c)
        v = rng.normal(big_b[k], 1.0, d)
        x = v + std * rng.standard_normal((int(sizes[k]), d))
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w.T + b, axis=1).astype(np.int64))
        owners.append(np.full(int(sizes[k]), k, dtype=np.int64))
    x_all, y_all, owner = np.concatenate(xs), np.concatenate(ys), np.concatenate(owners)
    # a fifth of each client's records (at least one) to the global test set
    n_test = np.maximum(1, sizes // 5)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    is_test = np.zeros(len(y_all), dtype=bool)
    for k in range(n_clients):
        is_test[starts[k]:starts[k] + n_test[k]] = True
    train = np.flatnonzero(~is_test)
    ds = Dataset(name="synthetic", x_train=x_all[train], y_train=y_all[train],
                 x_test=x_all[is_test], y_test=y_all[is_test], n_classes=c, input_shape=(d,))
    own = owner[train]
    bounds = np.searchsorted(own, np.arange(n_clients + 1))
    local_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    clients = []
    for k in range(n_clients):
        idx = np.arange(bounds[k], bounds[k + 1], dtype=np.int64)
        if local_test_fraction > 0 and len(idx) > 1:
            perm = local_rng.permutation(len(idx))
            m = max(1, min(len(idx) - 1, int(round(local_test_fraction * len(idx)))))
            te, tr = np.sort(idx[perm[:m]]), np.sort(idx[perm[m:]])
            clients.append(ClientData(k, ds.x_train[tr], ds.y_train[tr], ds.x_train[te],
                                      ds.y_train[te], indices=tr, test_indices=te))
        else:
            clients.append(ClientData(k, ds.x_train[idx], ds.y_train[idx], indices=idx))
    return Partition(ds, clients, scheme="synthetic", params={
        "alpha": alpha, "beta": beta, "n_clients": n_clients, "seed": seed,
        "local_test_fraction": local_test_fraction, "sizes": "lognormal"})


def load_npz(path: str | os.PathLike[str]) -> Dataset:
    """A :class:`~secagg.data.Dataset` from an ``.npz`` file holding ``x_train``,
    ``y_train``, ``x_test``, ``y_test`` (and optionally ``n_classes``; default: the
    largest label + 1). Features are read as float32, labels as int64; a missing array
    or a bad shape raises :class:`~secagg.errors.DataError` naming it."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"no such data file: {p}")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{p}: not a readable .npz file: {exc}") from None
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in arrays]
    if missing:
        raise DataError(f"{p}: missing array(s) {', '.join(missing)} (an .npz data set holds "
                        "x_train, y_train, x_test, y_test and optionally n_classes)")
    y_tr, y_te = arrays["y_train"], arrays["y_test"]
    if not (np.issubdtype(y_tr.dtype, np.integer) and np.issubdtype(y_te.dtype, np.integer)):
        raise DataError(f"{p}: y_train and y_test must hold integer labels")
    n_classes = (int(arrays["n_classes"]) if "n_classes" in arrays
                 else int(max(y_tr.max(initial=0), y_te.max(initial=0))) + 1)
    x_tr = np.asarray(arrays["x_train"], dtype=np.float32)
    return Dataset(name=p.stem, x_train=x_tr, y_train=y_tr.astype(np.int64),
                   x_test=np.asarray(arrays["x_test"], dtype=np.float32),
                   y_test=y_te.astype(np.int64), n_classes=n_classes,
                   input_shape=tuple(x_tr.shape[1:]))


def _parse_synthetic(spec: str) -> tuple[float, float]:
    _, sep, rest = spec.partition(":")
    if not sep:
        return 1.0, 1.0
    parts = rest.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise DataError(f"--dataset {spec!r}: expected synthetic or synthetic:ALPHA,BETA, "
                        "e.g. synthetic:0.5,0.5") from None


def describe_source(spec: str) -> str:
    """Which kind of source ``spec`` names: ``"named"``, ``"synthetic"``, ``"npz"`` or
    ``"module"`` (refused with the accepted forms when it is none of them)."""
    key = spec.strip().lower()
    if key in DATASETS or key.replace("_", "-") in DATASETS or key == "fashionmnist":
        return "named"
    if key == "synthetic" or key.startswith("synthetic:"):
        return "synthetic"
    if key.endswith(".npz"):
        return "npz"
    mod, sep, attr = spec.partition(":")
    if sep and mod and attr and all(p.isidentifier() for p in mod.split(".") + attr.split(".")):
        return "module"
    raise DataError(f"--dataset {spec!r}: expected one of {', '.join(DATASETS)}, "
                    "synthetic[:ALPHA,BETA], PATH.npz or module:loader")


def load_partition(spec: str, n_clients: int, *, split: str = "dirichlet", alpha: float = 0.5,
                   shards_per_client: int = 2, seed: int = 0, local_test_fraction: float = 0.0,
                   data_dir: str | os.PathLike[str] | None = None) -> Partition:
    """The clients a ``--dataset`` value names (see the module docstring); the split
    arguments apply to data sets that are not already federated."""
    kind = describe_source(spec)
    if kind == "synthetic":
        a, b = _parse_synthetic(spec)
        return synthetic_partition(n_clients, a, b, seed=seed,
                                   local_test_fraction=local_test_fraction)
    data: Any
    if kind == "named":
        data = load_dataset(spec, data_dir)
    elif kind == "npz":
        data = load_npz(spec)
    else:
        mod, _, attr = spec.partition(":")
        try:
            fn: Any = importlib.import_module(mod)
            for part in attr.split("."):
                fn = getattr(fn, part)
        except (ImportError, AttributeError) as exc:
            raise DataError(f"--dataset {spec}: cannot import the loader: {exc}") from None
        data = fn()
        if isinstance(data, Partition):
            return data
        if not isinstance(data, Dataset):
            raise DataError(f"--dataset {spec}: the loader returned {type(data).__name__}; "
                            "it must return a secagg.data.Dataset or Partition")
    return make_split(data, split, n_clients, alpha=alpha, shards_per_client=shards_per_client,
                      seed=seed, local_test_fraction=local_test_fraction)
