"""Auditing DP-FTRL's tree-aggregated noise (``CentralDP(tree=True)``).

DP-FTRL (Kairouz et al., ICML 2021; :mod:`secagg.privacy.tree`) releases one noised sum per
round, with noise ``N(dec(t + 1)) - N(dec(t))``: every prefix of the releases carries the
node noises of its dyadic decomposition, and a client that contributes in round t enters
every node that contains leaf t (``tree_depth`` of them by the end of a tree of T leaves).
The layer calibrates z for that: one Gaussian event of multiplier z / sqrt(depth) per
participation, charged round by round as the worst client's node count grows.

:class:`TreeRelease` audits one whole tree of ``rounds`` releases at client adjacency: a
canary client at the bound in round ``canary_round`` (0 by default: the leaf that enters
the most nodes), different background clients (holding 0) in every round so that the tree
never restarts, and the observation all ``rounds`` noised sums. The test statistic is the
likelihood-ratio direction for that canary: the sum of the tree nodes that contain its leaf,
each the difference of two prefix sums (each such node's noise is independent and carries
the canary once, so together they are the sufficient statistic). The claim is what the
layer's ledger charges over the tree, from a real run of the rounds through
``layer.aggregate``.

As elsewhere, ``n`` trees are drawn at once as trees over fields of ``n`` entries, through
the layer's own ``release`` (tree state, node noise, ledger charges), with the noise std
checked against the real run's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from secagg.layers.registry import audited_kind
from threat_models.dp_audit import (
    DEFAULT_DELTA,
    AuditError,
    AuditResult,
    LayerClaim,
    Statistic,
    audit,
)

__all__ = ["TreeRelease", "audit_tree", "canary_nodes"]

FIELD = "x"


def canary_nodes(rounds: int, leaf: int) -> list[tuple[int, int]]:
    """The tree nodes a client of round ``leaf`` enters within ``rounds`` releases, as
    prefix bounds (start, end): the dyadic nodes [s, s + 2^j) that contain ``leaf``, end by
    ``rounds`` and appear in some prefix's decomposition (s a multiple of 2^(j+1)). Each
    node's noise is the difference of the prefix sums at its bounds."""
    out = []
    size = 1
    while size <= rounds:
        start = (leaf // size) * size
        if start % (2 * size) == 0 and start + size <= rounds:
            out.append((start, start + size))
        size *= 2
    return out


class TreeRelease(LayerClaim):
    """One DP-FTRL tree of ``rounds`` releases with a canary client (module docstring).

    Args:
        epsilon, delta: the layer's budget for the ``rounds`` releases.
        rounds: the releases of the tree (its leaves).
        canary_round: the round the canary client contributes in.
        bound: the clip (each client's L2 bound).
        seed: the layer's noise seed.
    """

    field_name = FIELD

    def __init__(self, *, epsilon: float, delta: float = DEFAULT_DELTA, rounds: int = 8,
                 canary_round: int = 0, bound: float = 1.0, seed: int | None = 0,
                 layer: Any = None) -> None:
        from secagg.layers.plaintext import Plaintext
        from secagg.messages import Bound, Field, UploadSpec
        from secagg.privacy.layers import CentralDP

        if not (isinstance(rounds, int) and rounds >= 1):
            raise AuditError(f"rounds must be a positive integer, got {rounds!r}")
        if not (isinstance(canary_round, int) and 0 <= canary_round < rounds):
            raise AuditError(f"canary_round must be in [0, {rounds}), got {canary_round!r}")
        if layer is None:
            layer = CentralDP(Plaintext(), tree=True, epsilon=epsilon, delta=delta,
                              rounds=rounds, adjacency="client", seed=seed)
        if audited_kind(layer) != "central" or not layer.tree:
            raise AuditError("TreeRelease audits CentralDP(tree=True)")
        self.layer = layer
        self.rounds = rounds
        self.canary_round = canary_round
        self.bound = float(bound)
        self._bound = Bound(l2=self.bound, adjacency="client")
        self._field, self._spec_cls = Field, UploadSpec
        self.spec = self._spec(1)
        self.nodes = canary_nodes(rounds, canary_round)
        self._trees = 0
        self._claim, self.sigma = self._real_run()

    def _spec(self, n: int) -> Any:
        return self._spec_cls((self._field(FIELD, (n,), bound=self._bound, additive=True),))

    def _contributors(self, t: int) -> tuple[int, ...]:
        # the canary is client 0 in its round; every round has its own background clients
        return (0, 1) if t == self.canary_round else (2 * t + 2, 2 * t + 3)

    def _run(self, values: list[np.ndarray], n: int, real: bool) -> tuple[list[np.ndarray],
                                                                           Any]:
        """One tree of ``rounds`` releases of fields of ``n`` entries, in a phase of its
        own (a fresh tree), on one fresh ledger; returns the releases and the ledger."""
        from secagg.layers.base import Aggregate, RoundContext
        from secagg.messages import Upload
        from secagg.privacy.accountant import PrivacyLedger

        self._trees += 1
        phase, ledger = f"dp-audit-tree-{self._trees}", PrivacyLedger()
        spec, out = self._spec(n), []
        for t in range(self.rounds):
            ctx = RoundContext(t, phase, t, privacy=ledger)
            who = self._contributors(t)
            if real:
                ups = {c: Upload.validate(spec, {FIELD: values[t] if c == who[0]
                                                 else np.zeros(n)}, c, 1) for c in who}
                agg = self.layer.aggregate(ups, spec, ctx)
            else:
                lg = self.layer.begin(spec, ctx)
                agg = self.layer.release(Aggregate(phase, t, {FIELD: values[t].copy()}, {},
                                                   who), spec, ctx, lg)
                self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"], self.sigma)
            out.append(np.asarray(agg.sums[FIELD], dtype=np.float64))
        return out, ledger

    def _real_run(self) -> tuple[float, float]:
        """A real canary-free tree through ``layer.aggregate``: the ledger's charge over
        the tree (the claim) and the node noise std."""
        _, ledger = self._run([np.zeros(1)] * self.rounds, 1, True)
        eps = float(ledger.epsilon(self.layer.delta))
        from secagg.privacy.sensitivity import field_l2

        sigma = self.layer.noise_multiplier * field_l2(self.spec, FIELD, "client")
        return eps, sigma

    def _reference_notes(self) -> dict[str, Any]:
        return {"fields": {FIELD: {"sigma": self.sigma}}}

    @property
    def epsilon(self) -> float:
        """What the layer's ledger charges for the tree."""
        return self._claim

    @property
    def mechanism(self) -> str:
        """``central-dp/tree (T rounds)``."""
        return f"central-dp/tree ({self.rounds} rounds)"

    @property
    def canary(self) -> str:
        """The canary, in words."""
        return (f"client at +{self.bound:g} in round {self.canary_round} (in "
                f"{len(self.nodes)} tree nodes)")

    @property
    def statistics(self) -> list[Statistic]:
        """The sum of the canary's nodes, each the difference of two prefix sums."""
        starts = np.asarray([s for s, _ in self.nodes])
        ends = np.asarray([e for _, e in self.nodes])

        def score(obs: np.ndarray) -> np.ndarray:
            x = np.asarray(obs, dtype=np.float64)
            prefix = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1)], axis=1)
            return (prefix[:, ends] - prefix[:, starts]).sum(axis=1)

        return [Statistic("tree-nodes", score, "the noised tree nodes holding the canary")]

    def details(self) -> dict[str, Any]:
        """Noise facts."""
        return {"rounds": self.rounds, "canary_round": self.canary_round,
                "canary_nodes": len(self.nodes), "node_sigma": self.sigma,
                "noise_multiplier": self.layer.noise_multiplier, "adjacency": "client",
                "planned_epsilon": float(self.layer.epsilon)}

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n trees, (n, rounds): each round's noised sum."""
        values = [np.full(n, self.bound if (with_canary and t == self.canary_round) else 0.0)
                  for t in range(self.rounds)]
        out, _ = self._run(values, n, False)
        return np.stack(out, axis=1)


def audit_tree(*, epsilon: float, delta: float = DEFAULT_DELTA, rounds: int = 8,
               canary_round: int = 0, trials: int = 1_000_000, seed: int | None = 0,
               confidence: float = 0.95, mode: str = "tight", progress: bool | None = None,
               layer: Any = None) -> AuditResult:
    """Audit DP-FTRL's tree noise (:class:`TreeRelease`) against its ledger's charge."""
    rel = TreeRelease(epsilon=epsilon, delta=delta, rounds=rounds, canary_round=canary_round,
                      seed=seed, layer=layer)
    if not math.isfinite(rel.epsilon) or rel.epsilon <= 0:
        raise AuditError(f"the tree's ledger charged {rel.epsilon!r}; nothing to audit")
    return audit(rel, epsilon=rel.epsilon, delta=rel.delta, trials=trials,
                 statistics=rel.statistics, confidence=confidence, seed=seed,
                 mechanism=rel.mechanism, canary=rel.canary, progress=progress,
                 details=rel.details(), mode=mode)
