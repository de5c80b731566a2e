"""One phase's DP release when the clients run elsewhere: each party's part where the
embedded layer runs it.

The embedded DP layers (:mod:`secagg.privacy.layers`) run a whole release in
``aggregate``. A remote runtime cannot: the clients' parts run on their nodes. A
:class:`Release` splits it: the aggregator begins it (:meth:`Release.begin`); under
``LocalDP`` the nodes noise their uploads (the inner layer carries the widened spec, the
release is spent first); under ``DistributedDP`` they add noise shares to their encoded
vectors before masking (the worst case is checked against the budget first, the noise
actually added is spent in :meth:`Release.finish_distributed`); under ``CentralDP`` the
aggregator noises the inner layer's sums (:meth:`Release.end`). Without a DP layer every
part is a no-op. The nodes rebuild their noise side from :attr:`Release.node_params`
(:func:`secagg.privacy.layers.node_layer`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError, PrivacyError, ProtocolError
from secagg.layers.base import Aggregate, RoundContext
from secagg.link import Reply, reply_field
from secagg.messages import Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.layers import (
    CentralDP,
    DistributedDP,
    DistributedRelease,
    LocalDP,
    node_layer,
    noise_source,
    relabel,
)

#: the DP wrappers whose release a remote runtime splits by party
DP_WRAPPERS: tuple[type, ...] = (CentralDP, LocalDP, DistributedDP)
DPWrapper = CentralDP | LocalDP | DistributedDP


@dataclass(kw_only=True)
class Release:
    """One phase's release of ``spec`` (see the module docstring).

    Attributes:
        dp: the DP layer, or None.
        spec: the phase's spec; ``carried``: the spec the inner layer carries.
        ctx: the context the inner layer records under (noised fields relabelled).
        ledger: the run's privacy ledger, from ``dp.begin``.
        node_params: JSON the nodes rebuild their noise side from (None: they add none).
        sigmas: LocalDP's noise per field; ``plan``: DistributedDP's release plan.
    """

    dp: DPWrapper | None
    spec: UploadSpec
    carried: UploadSpec
    ctx: RoundContext
    ledger: PrivacyLedger | None = None
    node_params: str | None = None
    sigmas: dict[str, float] = field(default_factory=dict)
    plan: DistributedRelease | None = None

    @classmethod
    def begin(cls, dp: DPWrapper | None, spec: UploadSpec,
              ctx: RoundContext, n: int) -> Release:
        """Begin the release of ``spec`` by a cohort of ``n`` under ``dp`` (or no DP)."""
        rel = cls(dp=dp, spec=spec, carried=spec, ctx=ctx)
        if dp is None:
            return rel
        rel.ledger = dp.begin(spec, ctx)
        noised: list[str] = []
        if isinstance(dp, LocalDP):
            rel.sigmas, rel.carried = dp.noise_plan(spec)
            noised = list(rel.sigmas)
            if noised:
                dp.spend(rel.ledger, rel.sigmas, ctx)
                rel.node_params = json.dumps(dp.node_params())
        elif isinstance(dp, DistributedDP):
            rel.plan = dp.release_plan(spec, n)
            rel.ledger.check(*rel.plan.planned)  # the worst case fits, before any noise
            noised = [f.name for f in rel.plan.noised]
            if noised:
                rel.node_params = json.dumps(dp.node_params(rel.plan.z))
        if noised:
            dp.mark_seeded(rel.ledger, noised)
            rel.ctx = relabel(ctx, noised)
        return rel

    def finish_distributed(self, ring_sum: np.ndarray, contributors: Sequence[int],
                           ctx: RoundContext) -> Aggregate:
        """DistributedDP: account the contributors' noise, decode the noised sums."""
        dp: Any = self.dp
        return dp.finish(self.plan, self.spec, ring_sum, contributors, ctx, self.ledger,
                         dp.seed is None)

    def end(self, agg: Aggregate, ctx: RoundContext) -> Aggregate:
        """The aggregator's side after the inner layer: CentralDP noises the sums; LocalDP
        notes the noise the sum carries."""
        if isinstance(self.dp, CentralDP):
            return self.dp.release(agg, self.spec, ctx, self.ledger)  # type: ignore[arg-type]
        if isinstance(self.dp, LocalDP) and self.sigmas:
            agg.notes["dp"] = self.dp.release_notes(self.spec, self.sigmas,
                                                    self.dp.seed is None,
                                                    len(agg.contributors))
        return agg


# ---------------------------------------------------------------- a node's part


def node_noiser(rec: Reply) -> LocalDP | DistributedDP:
    """The noise side of the run's DP layer on a node, rebuilt from an instruction's ``dp``
    parameters (:func:`~secagg.privacy.layers.node_layer`; DistributedDP around the
    session's SecureSum, whose threshold sizes each share); parameters the node cannot
    check are a ProtocolError (an error reply: the node drops, it never noises less)."""
    from secagg.layers.plaintext import Plaintext
    from secagg.secure_sum.layer import SecureSum

    try:
        params = json.loads(reply_field(rec, "dp", str))
        inner = (SecureSum(**json.loads(reply_field(rec, "layer", str))) if "layer" in rec
                 and params.get("layer") == DistributedDP.name else Plaintext())
        return node_layer(params, inner)
    except (PrivacyError, ConfigurationError, ValueError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"DP parameters refused: {exc}") from None


def noise_on_node(rec: Reply, spec: UploadSpec, up: Upload, client: int
                  ) -> tuple[LocalDP | DistributedDP, np.random.Generator, Upload, UploadSpec]:
    """A node's part of the release, after its client step: the noise side
    (:func:`node_noiser`), this node's own noise stream for the round and phase, and under
    LocalDP the upload noised before it leaves (with the widened spec the inner layer
    carries); DistributedDP's share is added when the upload is encoded."""
    noiser = node_noiser(rec)
    rng = noise_source(noiser.seed, reply_field(rec, "round", int), reply_field(rec, "phase", str),
                       int(client)).rng
    if isinstance(noiser, LocalDP):
        sigmas, wide = noiser.noise_plan(spec)
        if sigmas:
            up, spec = noiser.noise_upload(up, spec, sigmas, wide, rng), wide
    return noiser, rng, up, spec
