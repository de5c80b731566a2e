"""CentralDP: the aggregator adds Gaussian noise to the inner layer's sums (optionally
DP-FTRL's tree-aggregated noise).

Around a layer of two non-colluding aggregators that adds noise in shares
(:attr:`~secagg.layers.base.Layer.noises_in_shares`: :class:`~secagg.validated_sum.ValidatedSum`)
the noise is added by the aggregators instead: each adds N(0, sigma^2) to its own share of the
sum before the shares meet, so the sum either of them sees carries at least the other's
noise (sigma: the guarantee below holds against each aggregator alone, assuming they do not
collude), and the released sum carries both (sqrt(2) sigma). The event is spent before the
inner layer runs. DP-FTRL's tree is not available there.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER
from secagg.errors import PrivacyError
from secagg.layers.base import (
    Aggregate,
    Layer,
    RoundContext,
    ServerPart,
)
from secagg.messages import Field, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.dp_base import _DPLayer, _DPPart
from secagg.privacy.events import GaussianEvent
from secagg.privacy.samplers import gaussian
from secagg.privacy.tree import TreeAccount, TreeNoise, decomposition, tree_depth


class CentralDP(_DPLayer):
    """The aggregator adds Gaussian noise to the inner layer's sums (central DP).

    The aggregator sees the un-noised sums first; only what is released after this layer
    (the noised sums) is protected. Integer fields get rounded Gaussian noise (rounding is
    post-processing). Args: see the module docstring; ``inner`` is any layer.

    With ``tree=True`` the noise is DP-FTRL's tree-aggregated noise
    (:mod:`secagg.privacy.tree`, Kairouz et al., ICML 2021): every prefix sum of the
    releases carries O(log T) node noises, not T, and the ledger charges, round by round,
    what the rounds' real participation costs the worst client (no amplification by
    sampling is used). The run must release one phase (one tree) with a fixed bound, e.g.
    FedAvg with a fixed ``clip``. A tree restarts whenever a client would enter it twice.
    ``tree_participations`` is how many rounds the planning assumes one client contributes
    to over the run (1: the single-epoch setting); the noise is calibrated for it, and a
    run whose real participation costs more is stopped by the budget guard before the
    release that would exceed the budget.
    """

    name: ClassVar[str] = "central-dp"
    aggregator_noises: ClassVar[bool] = True
    holds_against: ClassVar[tuple[str, ...]] = (
        "observers of the released (noised) sums and the models built from them; NOT "
        "the aggregator, which adds the noise after seeing the un-noised sums",)

    def __init__(self, inner: Layer, *, tree: bool = False, tree_participations: int = 1,
                 **kwargs: Any) -> None:
        if not isinstance(tree, bool):
            raise PrivacyError(f"tree must be True or False, got {tree!r}")
        if isinstance(tree_participations, bool) or not isinstance(
                tree_participations, int) or tree_participations < 1:
            raise PrivacyError(f"tree_participations must be a positive integer, got "
                               f"{tree_participations!r}")
        super().__init__(inner, **kwargs)
        if tree and inner.noises_in_shares:
            raise PrivacyError(f"{self.name}: DP-FTRL's tree noise is added by one aggregator; "
                               f"around {inner.name!r} the aggregators noise their shares "
                               "(use tree=False)")
        if inner.noises_in_shares:  # each aggregator alone sees a sum noised by the other
            self.aggregator_noises = False  # type: ignore[misc]
            self.holds_against = (  # type: ignore[misc]
                "observers of the released (noised) sums and the models built from them",
                "each of the two aggregators alone (the server and aggregator-b): each adds "
                "its own noise to its share of the sum, so the sum either reconstructs "
                "carries the other's; NOT the two together (they are assumed not to collude)")
        self.tree = tree
        self.tree_participations = tree_participations
        self._trees: dict[str, dict[str, Any]] = {}

    def _planned_events(self) -> int:
        return 1 if self.tree else self._n_releases()

    def _event_factory(self) -> Any:
        if not self.tree:
            return super()._event_factory()
        # one Gaussian on the node vectors: a client enters each tree at most once (trees
        # restart), so k participations cost it at most k * depth nodes (S <= k depth)
        scale = math.sqrt(self.tree_participations * tree_depth(self._n_releases()))
        return lambda z: GaussianEvent(noise_multiplier=z / scale)

    def plan_phases(self, names: Sequence[str]) -> None:
        """Refuse a tree over releases of several phases (one tree, one field set)."""
        if self.tree and len(set(names)) > 1:
            raise PrivacyError(
                f"{self.name}: DP-FTRL's tree aggregates one phase's releases, but this run "
                f"releases from phases {sorted(set(names))}; use tree=False (independent "
                "noise per release) or an algorithm with one released phase")

    def describe(self) -> dict[str, Any]:
        """As the other DP layers, plus the tree settings."""
        out = super().describe()
        if self.tree:
            out.update(tree=True, tree_participations=self.tree_participations)
        return out

    def server_part(self, spec: UploadSpec, ctx: RoundContext, n: int) -> ServerPart:
        """Begin a release (:meth:`begin`); the inner layer carries the uploads as they are,
        and the part's end noises the sums (:meth:`release`), or, around an inner layer that
        noises in shares, the aggregators noise their shares (:class:`_SharesPart`)."""
        if self.inner.noises_in_shares:
            return _SharesPart(self, spec, ctx)
        return _CentralPart(self, spec, ctx)

    def release(self, agg: Aggregate, spec: UploadSpec, ctx: RoundContext,
                ledger: PrivacyLedger) -> Aggregate:
        """The aggregator's release of ``agg`` (the inner layer's sums; ``ledger`` from
        :meth:`begin`): spend one Gaussian event, noise every non-public sum in place."""
        noised = self._noised(spec)
        if not noised:
            return agg
        sigmas = self._sigmas(spec, noised)
        if self.tree:
            return self._tree_release(agg, spec, ctx, ledger, noised, sigmas)
        event = GaussianEvent(noise_multiplier=self.noise_multiplier, round=ctx.round,
                              phase=ctx.phase, fields=tuple(sigmas), label=self.name)
        ledger.spend(event)  # raises BudgetExceeded before anything is released
        src = self._source(ctx, SERVER, ledger, tuple(sigmas))
        for f in noised:
            noisy = agg.sums[f.name] + gaussian(sigmas[f.name], f.shape, src.rng)
            if f.is_integer:
                noisy = np.rint(noisy).astype(np.int64)
            agg.sums[f.name] = noisy
            ctx.observe(SERVER, SERVER, "dp-noise", f.name, "noised", noisy, what="sum")
        agg.notes["dp"] = self._notes(spec, sigmas, "gaussian", src.private,
                                      server_saw_unnoised_sum=True)
        return agg


    def _tree_release(self, agg: Aggregate, spec: UploadSpec, ctx: RoundContext,
                      ledger: PrivacyLedger, noised: Sequence[Field],
                      sigmas: Mapping[str, float]) -> Aggregate:
        """DP-FTRL's release: charge the worst client's increase, then add
        N(dec(t + 1)) - N(dec(t)) of each field's tree to the round's sums."""
        tree = self._trees.setdefault(ctx.phase, {
            "account": TreeAccount(), "noise": {f.name: TreeNoise() for f in noised},
            "sigmas": dict(sigmas), "t": 0})
        if any(not math.isclose(sigmas[n], tree["sigmas"].get(n, math.nan), rel_tol=1e-12)
               for n in sigmas):
            raise PrivacyError(
                f"{self.name}: DP-FTRL's tree needs the same bound in every round, but "
                f"phase {ctx.phase!r} changed its noise scale from {tree['sigmas']} to "
                f"{dict(sigmas)} (adaptive clipping?); use a fixed clip with tree=True")
        account = copy.deepcopy(tree["account"])
        if account.restarts(agg.contributors):  # a client would enter this tree twice
            tree["noise"], tree["t"] = {f.name: TreeNoise() for f in noised}, 0
        inc = account.add_leaf(agg.contributors)
        z = self.noise_multiplier
        if inc > 0:  # raises BudgetExceeded before anything is released
            ledger.spend(GaussianEvent(noise_multiplier=z / math.sqrt(inc), round=ctx.round,
                                       phase=ctx.phase, fields=tuple(sigmas),
                                       label=f"{self.name} tree"))
        tree["account"] = account
        src = self._source(ctx, SERVER, ledger, tuple(sigmas))
        t = tree["t"]
        for f in noised:
            noise = tree["noise"][f.name].release(
                t, lambda f=f: gaussian(sigmas[f.name], f.shape, src.rng))
            noisy = agg.sums[f.name] + noise
            if f.is_integer:
                noisy = np.rint(noisy).astype(np.int64)
            agg.sums[f.name] = noisy
            ctx.observe(SERVER, SERVER, "dp-noise", f.name, "noised", noisy, what="sum")
        tree["t"] = t + 1
        agg.notes["dp"] = self._notes(
            spec, sigmas, "gaussian-tree", src.private, server_saw_unnoised_sum=True,
            tree=account.trees, tree_leaf=t, prefix_nodes=len(decomposition(t + 1)),
            worst_client_nodes=account.worst, charged=inc)
        return agg


class _CentralPart(_DPPart):
    """CentralDP's server part: the aggregator noises the inner layer's sums at the end."""

    def end(self, agg: Aggregate, ctx: RoundContext) -> Aggregate:
        """Noise the sums and spend the release (:meth:`CentralDP.release`)."""
        return self.layer.release(agg, self.spec, ctx, self.ledger)


class _SharesPart(_DPPart):
    """CentralDP around two aggregators that noise their shares: the event spent and the
    noise handed to the inner layer when the release begins, the notes at its end."""

    def __init__(self, layer: CentralDP, spec: UploadSpec, ctx: RoundContext) -> None:
        super().__init__(layer, spec, ctx)
        noised = layer._noised(spec)
        self.sigmas = layer._sigmas(spec, noised) if noised else {}
        if self.sigmas:  # raises BudgetExceeded before any client's share is read
            self.ledger.spend(GaussianEvent(
                noise_multiplier=layer.noise_multiplier, round=ctx.round, phase=ctx.phase,
                fields=tuple(self.sigmas), label=f"{layer.name} in shares"))
        fields = tuple(self.sigmas)
        self.sources = {party: layer._source(ctx, party, self.ledger, fields)
                        for party in layer.inner.share_parties}
        layer.inner.noise_in_shares(self.sigmas, self.sources)

    def end(self, agg: Aggregate, ctx: RoundContext) -> Aggregate:
        """The release's notes (the noise is in the sums already)."""
        if self.sigmas:
            private = all(src.private for src in self.sources.values())
            agg.notes["dp"] = self.layer._notes(
                self.spec, self.sigmas, "gaussian", private, server_saw_unnoised_sum=False,
                noise_in_shares=True, released_sigma_factor=math.sqrt(2.0))
        return agg
