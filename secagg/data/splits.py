"""The partitioners: a data set split over simulated clients (IID, Dirichlet label skew,
classes per client, McMahan et al.'s label shards), deterministic by seed, every
training sample to exactly one client, an optional stratified local test set per
client; :func:`make_split` by name."""

from __future__ import annotations

import heapq
import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from secagg.data.containers import ClientData, Dataset, Partition
from secagg.errors import DataError


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
