"""Tree aggregation for DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, ICML 2021,
"Practical and private (deep) learning without sampling or shuffling").

The server releases, after each round t (0-based), a noised *prefix sum* of the clients'
clipped updates instead of a freshly noised per-round sum. Over the leaves 0..T-1 (one per
round) sit the dyadic nodes ``[a, a + 2^l)``; each node gets one Gaussian noise vector, drawn
once. The prefix ``[0, k)`` is the sum of the nodes of the binary decomposition of k (at most
log2(k) + 1 of them), so the noise in any prefix has variance ``|decomposition(k)| sigma^2``
instead of ``k sigma^2``. The per-round release is the difference of two noised prefixes:
``g_t + N(dec(t + 1)) - N(dec(t))``, which the algorithm adds up as usual (server SGD on
these releases *is* FTRL on the noised prefix sums).

Privacy. Everything released is a function of the noised values of the nodes that enter
some decomposition; round t adds exactly one new such node, ``[t + 1 - lowbit(t + 1), t +
1)``. A client that contributed to c of that node's leaves moves it by at most c * C (C the
clip), so the whole run is one Gaussian mechanism on the node vector with, for client i,
squared sensitivity ``S_i = sum over nodes of c_i(node)^2`` (times C^2). The tracker below
keeps S_i for every client from the rounds' public participation (who contributed, known
to the server), and charges, at each round, the increase of ``max_i S_i`` as a Gaussian
event of multiplier ``z / sqrt(increase)``: Gaussian mechanisms compose exactly
(1/z^2 adds up), so the ledger's total equals the worst client's true guarantee. A new
tree starts whenever a round's contributor already contributed to the current one (the
paper's restarts), so no client enters a tree twice. When every
client takes part at most once (the paper's single-epoch setting) the total is that of
``dp_accounting``'s ``SingleEpochTreeAggregationDpEvent`` (at most depth ceil(log2(T + 1))
nodes per client); when clients return often, S_i grows with their participations and the
ledger says so: the guarantee uses no amplification by sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

__all__ = ["TreeAccount", "TreeNoise", "decomposition", "tree_depth"]

Node = tuple[int, int]  # (start, size): the leaves [start, start + size)


def decomposition(k: int) -> list[Node]:
    """The dyadic nodes whose union is the prefix ``[0, k)``: one per set bit of k, largest
    first (``decomposition(6) == [(0, 4), (4, 2)]``)."""
    if k < 0:
        raise ValueError(f"prefix length must be >= 0, got {k}")
    out, start = [], 0
    for level in range(k.bit_length() - 1, -1, -1):
        if k >> level & 1:
            out.append((start, 1 << level))
            start += 1 << level
    return out


def tree_depth(leaves: int) -> int:
    """``ceil(log2(leaves + 1))``: the most nodes one leaf enters (dp_accounting's depth)."""
    return max(1, math.ceil(math.log2(leaves + 1)))


class TreeNoise:
    """The node noise of one tree (one field), each node drawn once, when first needed."""

    def __init__(self) -> None:
        self._nodes: dict[Node, np.ndarray] = {}

    def prefix(self, k: int, draw: Callable[[], np.ndarray]) -> np.ndarray | float:
        """The noise in the prefix ``[0, k)`` (0.0 for the empty prefix); a node not drawn
        yet is drawn with ``draw()``."""
        total: np.ndarray | float = 0.0
        for node in decomposition(k):
            if node not in self._nodes:
                self._nodes[node] = draw()
            total = total + self._nodes[node]
        return total

    def release(self, t: int, draw: Callable[[], np.ndarray]) -> np.ndarray | float:
        """The noise to add to round t's sum so that every prefix carries tree noise:
        ``N(dec(t + 1)) - N(dec(t))`` (the one new node drawn with ``draw()``). Nodes no
        later prefix needs are forgotten."""
        before = self.prefix(t, draw)
        after = self.prefix(t + 1, draw)
        keep = set(decomposition(t + 1))
        self._nodes = {n: v for n, v in self._nodes.items() if n in keep}
        return after - before


class TreeAccount:
    """Per-client squared sensitivities ``S_i`` (in units of C^2) over a sequence of trees.

    A new tree starts (its leaves and node noise fresh) whenever a round's contributor
    already contributed to the current tree, as in the paper's restarts: each client then
    enters every tree at most once, so a tree costs it at most ``tree_depth`` nodes. ``S_i``
    runs over all trees (their releases compose)."""

    def __init__(self) -> None:
        self.leaves: list[frozenset[int]] = []
        self.s: dict[int, int] = {}
        self.worst = 0
        self.trees = 0

    def restarts(self, contributors: Iterable[int]) -> bool:
        """True when a tree must start for these contributors (one of them is already in
        the current tree, or there is none yet)."""
        if not self.leaves:
            return True
        seen = frozenset().union(*self.leaves)
        return any(int(c) in seen for c in contributors)

    def add_leaf(self, contributors: Iterable[int]) -> int:
        """Record round t's contributors (starting a new tree first when
        :meth:`restarts`); returns the increase of ``max_i S_i`` that the round's new node
        causes (the Gaussian event to charge has multiplier z / sqrt of it; 0: no charge)."""
        contributors = frozenset(int(c) for c in contributors)
        if self.restarts(contributors):
            self.leaves = []
            self.trees += 1
        self.leaves.append(contributors)
        k = len(self.leaves)
        size = k & -k  # the new node [k - size, k)
        counts: dict[int, int] = {}
        for leaf in self.leaves[k - size:]:
            for c in leaf:
                counts[c] = counts.get(c, 0) + 1
        for c, n in counts.items():
            self.s[c] = self.s.get(c, 0) + n * n
        worst = max(self.s.values(), default=0)
        inc, self.worst = worst - self.worst, max(worst, self.worst)
        return max(inc, 0)
