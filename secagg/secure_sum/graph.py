"""Who pairs with whom: the complete graph (SecAgg) or a k-regular Harary graph (SecAgg+).

In SecAgg+ (Bell et al., CCS 2020) each client masks with, and secret-shares among, only its
k neighbours on a random k-regular graph, so its work grows with k = O(log n) instead of n.
We build the Harary graph H_{k,n} (a circulant: each node joins the k/2 nearest positions on
each side of a ring, plus the antipodal position when k is odd) on a random relabelling of the
cohort. The threshold then applies per neighbourhood: a client's secrets are t_k-out-of-(k+1)
shared among its closed neighbourhood (itself and its k neighbours).
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from secagg.errors import ConfigurationError

GraphKind = Literal["complete", "harary", "auto"]


def auto_degree(n: int) -> int:
    """The degree SecAgg+ uses here for a cohort of n: the even number 2 * ceil(2 log2 n),
    capped at n - 1 (k = O(log n), as Bell et al. prescribe; e.g. 28 at n = 100, 40 at 1000)."""
    if n <= 2:
        return max(n - 1, 0)
    return min(n - 1, 2 * math.ceil(2 * math.log2(n)))


def share_threshold_for(k: int, threshold: float | int, n: int) -> int:
    """t_k on a k-regular graph over n clients: the cohort threshold's fraction of the k + 1
    holders of a client's shares, more than half of them and at least 2 (see :func:`build`)."""
    t = resolve_threshold(threshold, n)
    frac = float(threshold) if isinstance(threshold, float) else t / n
    return min(k + 1, max(2, (k + 1) // 2 + 1, math.ceil(frac * (k + 1) - 1e-9)))


def abort_probability(n: int, k: int, share_threshold: int, dropout: float) -> float:
    """The chance that a SecAgg+ session over n clients on a random k-regular graph aborts
    because some live client keeps fewer than ``share_threshold`` live members in its closed
    neighbourhood, when round(n * dropout) clients drop before their masked input.

    Each neighbourhood is a uniform k-subset of the other n - 1 clients (the graph is a
    Harary graph on a uniformly random relabelling), so its dropped count is hypergeometric;
    the events of the live clients are combined as if independent. They are positively
    correlated (neighbourhoods on the ring overlap), so this overstates the chance: by 2-3x
    against 2,000 simulated sessions at n = 200-300 (tests/test_secure_sum_protocol.py), a
    safe side for choosing k."""
    from scipy.stats import hypergeom

    d = round(n * dropout)
    if d == 0 or k >= n - 1:
        return 0.0
    afford = k + 1 - share_threshold  # dropped neighbours a live client can lose
    p = float(hypergeom.sf(afford, n - 1, d, k))
    return float(-math.expm1((n - d) * math.log1p(-p))) if p < 1 else 1.0


def degree_for(n: int, threshold: float | int, dropout: float,
               failure: float = 1e-6) -> int:
    """The SecAgg+ degree for n clients that survives an expected ``dropout`` fraction: the
    smallest even k >= :func:`auto_degree` whose :func:`abort_probability` is at most
    ``failure`` (capped at n - 1, the complete graph)."""
    if not 0.0 <= dropout < 1.0:
        raise ConfigurationError(f"dropout must be in [0, 1), got {dropout!r}")
    k = auto_degree(n)
    while k < n - 1 and abort_probability(
            n, k, share_threshold_for(k, threshold, n), dropout) > failure:
        k += 2
    return min(k, max(n - 1, 0))


@dataclass(frozen=True)
class SecAggPlusSizing:
    """A degree k and share threshold t_k sized by :func:`secagg_plus_sizing`.

    Attributes:
        k, share_threshold: the degree and t_k (shares that rebuild a secret, of k + 1).
        n, dropout, corrupt: the cohort, its dropout fraction and its corrupt fraction.
        failure_correct, failure_secure: union bounds on the chance that some client keeps
            too few live holders (the session aborts), and that some honest client has so
            many corrupt holders that a malicious server with them unmasks its input.
    """

    k: int
    share_threshold: int
    n: int
    dropout: float
    corrupt: float
    failure_correct: float
    failure_secure: float


def secagg_plus_sizing(n: int, dropout: float, corrupt: float, *, sigma: int = 40,
                       eta: int = 20) -> SecAggPlusSizing:
    """Size k and t_k for n clients, a dropout fraction and a corrupt fraction, in the manner
    of Bell et al. (CCS 2020, SecAgg+): the smallest even k with a t_k meeting, for every
    client, both conditions below with a union bound over the n clients. A client's k
    neighbours are a uniform k-subset of the other n - 1 clients (the Harary graph on a
    uniformly random relabelling), so each count is hypergeometric.

    * Correctness (failure <= 2^-eta): a client keeps at least t_k live holders (itself and
      its neighbours) when round(n (dropout + corrupt)) clients drop -- corrupt clients are
      counted as dropping, since they may walk away at the worst moment.
    * Security against a malicious server with the corrupt clients (failure <= 2^-sigma):
      with C corrupt holders among an honest client's k + 1, the server could rebuild both
      its self-mask seed and its mask key from two disjoint groups of honest holders unless
      2 t_k > k + 1 + C; this bound also gives t_k > C (the corrupt alone hold too few).

    Assumptions named: the conditions are per neighbourhood (Bell et al.'s further condition,
    that the honest survivors' graph stays connected so that only the whole sum is revealed,
    is not checked here); the corrupt set does not depend on the graph (the relabelling is
    drawn after the cohort is fixed).

    Raises:
        ConfigurationError: the fractions are out of range, or no k <= n - 1 meets both
            bounds (then use the complete graph, or a larger cohort).
    """
    from scipy.stats import hypergeom

    if not (0.0 <= dropout < 1.0 and 0.0 <= corrupt < 1.0 and dropout + corrupt < 1.0):
        raise ConfigurationError(
            f"dropout ({dropout!r}) and corrupt ({corrupt!r}) fractions must be in [0, 1) "
            "and sum to below 1")
    if n < 3:
        raise ConfigurationError(f"SecAgg+ sizing needs at least 3 clients, got {n}")
    gone = round(n * (dropout + corrupt))
    bad = round(n * corrupt)
    for k in range(2, n, 2):
        lost = hypergeom(n - 1, gone, k)
        seen = hypergeom(n - 1, bad, k)
        for t in range(k // 2 + 1, k + 2):  # 2 t > k + 1 at least
            # correctness: more than k + 1 - t of the k neighbours gone, for some client
            p_abort = min(1.0, n * float(lost.sf(k + 1 - t))) if gone else 0.0
            if p_abort > 2.0 ** -eta:
                break  # a larger t only makes it worse
            # security: C >= 2 t - k - 1 corrupt neighbours, for some honest client
            p_leak = min(1.0, n * float(seen.sf(2 * t - k - 2))) if bad else 0.0
            if p_leak <= 2.0 ** -sigma:
                return SecAggPlusSizing(k, t, n, dropout, corrupt, p_abort, p_leak)
    raise ConfigurationError(
        f"no SecAgg+ degree below n - 1 = {n - 1} meets 2^-{sigma} security and 2^-{eta} "
        f"correctness at {dropout:.0%} dropout and {corrupt:.0%} corrupt; use the complete "
        "graph"
    )


def check_threshold(threshold: float | int) -> None:
    """Validate a threshold's type and range without a cohort: a fraction in (1/2, 1] or an
    integer count >= 2.

    A threshold of at most half is refused: with t <= n/2 a malicious server can ask one
    half of a client's share holders for its self-mask shares and the other half for its
    mask-key shares, and unmask that client's input.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ConfigurationError("threshold must be a fraction in (1/2, 1] or an integer count")
    if isinstance(threshold, int):
        if threshold < 2:
            raise ConfigurationError(f"threshold count must be >= 2, got {threshold}")
        return
    if not 0.5 < float(threshold) <= 1.0:
        raise ConfigurationError(
            f"threshold fraction must be in (1/2, 1], got {threshold}: at most half lets a "
            "malicious server split a client's share holders into two groups and unmask it; "
            "use e.g. 0.7"
        )


def resolve_threshold(threshold: float | int, n: int) -> int:
    """A threshold given as a fraction of n (float in (1/2, 1]) or a count (int), as a count.

    The result is at least 2 (one share alone must never reveal a secret), more than n/2
    (see :func:`check_threshold`; a count of at most n/2 is refused) and, for a fraction, at
    most n.
    """
    check_threshold(threshold)
    if isinstance(threshold, int):
        if 2 * threshold <= n:
            raise ConfigurationError(
                f"threshold count {threshold} is at most half the cohort of {n}: a malicious "
                f"server could unmask a client; use a count above {n // 2}"
            )
        return threshold
    return min(max(2, n // 2 + 1, math.ceil(float(threshold) * n - 1e-9)), max(n, 2))


@dataclass(frozen=True)
class Graph:
    """The neighbour structure of one protocol run.

    Attributes:
        kind: "complete" or "harary".
        k: degree (n - 1 for the complete graph).
        threshold: t, the minimum number of live clients at every stage.
        share_threshold: t_k, shares needed to rebuild one client's secret (t for complete).
        neighbours: client -> its neighbours (without itself).
    """

    kind: str
    k: int
    threshold: int
    share_threshold: int
    neighbours: dict[int, frozenset[int]]

    def closed(self, u: int) -> frozenset[int]:
        """u's closed neighbourhood: its neighbours and itself (the holders of its shares)."""
        return self.neighbours[u] | {u}

    def live_ok(self, live: set[int]) -> tuple[bool, int, int]:
        """Check a live set: (ok, survivors, needed). Fails when fewer than t are live, or
        (sparse graph) a live client keeps fewer than t_k live members in its closed
        neighbourhood; survivors/needed then describe the failing count."""
        if len(live) < self.threshold:
            return False, len(live), self.threshold
        if self.kind != "complete":
            for u in sorted(live):
                c = len(self.closed(u) & live)
                if c < self.share_threshold:
                    return False, c, self.share_threshold
        return True, len(live), self.threshold


def harary(
    ids: Sequence[int], k: int, rng: random.Random | None = None
) -> dict[int, frozenset[int]]:
    """The Harary graph H_{k,n} on a random relabelling of ``ids``.

    Args:
        ids: the clients (distinct).
        k: degree, 1 <= k <= n - 1 (raised by one when both k and n are odd).
        rng: source of the relabelling; None uses the OS CSPRNG.
    """
    order = list(ids)
    n = len(order)
    if len(set(order)) != n:
        raise ConfigurationError("client ids must be distinct")
    if n < 2:
        return {u: frozenset() for u in order}
    if not 1 <= k <= n - 1:
        raise ConfigurationError(f"graph degree k must be in 1..{n - 1}, got {k}")
    (rng or secrets.SystemRandom()).shuffle(order)
    if k % 2 and n % 2:
        k = min(k + 1, n - 1)
    half = k // 2
    out: dict[int, set[int]] = {u: set() for u in order}
    for i, u in enumerate(order):
        for off in range(1, half + 1):
            out[u].add(order[(i + off) % n])
            out[u].add(order[(i - off) % n])
        if k % 2:
            out[u].add(order[(i + n // 2) % n])
    return {u: frozenset(v) for u, v in out.items()}


def build(
    ids: Sequence[int],
    threshold: float | int,
    kind: GraphKind = "complete",
    k: int | None = None,
    seed: int | None = None,
) -> Graph:
    """Choose the graph and thresholds for a cohort.

    Args:
        ids: the cohort.
        threshold: fraction of the cohort (float) or count (int) that must stay live.
        kind: "complete" (every pair), "harary" (k-regular SecAgg+ graph), or "auto"
            (harary when the automatic degree is below n - 1, else complete).
        k: degree for "harary" (None: :func:`auto_degree`).
        seed: seeds the relabelling (experiments); None draws it from the OS CSPRNG.
    """
    n = len(ids)
    t = resolve_threshold(threshold, n)
    if kind not in ("complete", "harary", "auto"):
        raise ConfigurationError(f"graph must be 'complete', 'harary' or 'auto', got {kind!r}")
    deg = auto_degree(n) if k is None else int(k)
    if kind == "auto" and k is None and deg >= n - 1:
        kind = "complete"
    if kind == "auto":
        kind = "harary" if deg < n - 1 else "complete"
    if kind == "complete" or n < 2:
        nb = {u: frozenset(v for v in ids if v != u) for u in ids}
        return Graph("complete", max(n - 1, 0), t, t, nb)
    nb = harary(ids, deg, random.Random(seed) if seed is not None else None)
    real_k = len(next(iter(nb.values())))
    return Graph("harary", real_k, t, share_threshold_for(real_k, threshold, n), nb)
