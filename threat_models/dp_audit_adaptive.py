"""Auditing DP-FedAvg with adaptive clipping: the update and the count released together.

Under adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021;
:mod:`secagg.privacy.clipping`) every client uploads, beside its clipped update, the
centred bit ``unclipped`` = 1[norm <= C] - 1/2, and the DP layer noises both sums in one
release, the count with its ``count_weight`` share of the budget
(:func:`secagg.privacy.sensitivity.noise_split`). A client therefore moves the release
along two fields, and the claim covers both.

:class:`AdaptiveRelease` audits that joint release: the canary client's local model sits
``canary_norm`` x C away from the broadcast (so its upload, through the real
``FedAvg.clipped_update`` of a ``FedAvg(clip="adaptive")``, is C u and the bit -1/2); in the
canary-free world the canary client adds nothing to either sum (what an absent client
adds), the background clients are real clipped uploads, and both worlds keep the cohort.
The observation is what the layer releases -- both noised sums (CentralDP, DistributedDP)
or the canary client's noised upload (LocalDP) -- projected on the canary's direction for
the update. The test statistic is the likelihood-ratio direction of the two fields,
``x_update C / sigma_update^2 - x_count (1/2) / sigma_count^2``, with the sigmas of a real
release through ``layer.aggregate`` (fixed before any draw: a wrong weight costs power,
never validity). The server's step and the next clip are post-processing of this release.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import numpy as np

from threat_models.dp_audit import (
    DEFAULT_CLIENTS,
    DEFAULT_DELTA,
    AuditError,
    AuditResult,
    LayerClaim,
    Statistic,
    audit,
    composed_ring,
    composition_holds,
    dropout_pattern,
    encoded_sum,
    skellam_sum_holds,
)
from threat_models.dp_audit_fedavg import _client_layer, _kind, _mechanism_name

__all__ = ["AdaptiveRelease", "audit_adaptive"]

PHASE = "dp-audit-adaptive"
FIELDS = ("update", "unclipped")


class AdaptiveRelease(LayerClaim):
    """One round of DP-FedAvg with adaptive clipping as a batched release (module
    docstring). Arguments as :class:`threat_models.dp_audit_fedavg.FedAvgRelease`."""

    field_name = "update"

    def __init__(self, layer: Any = "central-dp", *, epsilon: float | None = None,
                 delta: float = DEFAULT_DELTA, clip: float = 1.0, dim: int = 8,
                 clients: int = DEFAULT_CLIENTS, canary_norm: float = 10.0,
                 background_norm: float = 2.0, survivors: int | str = "fewest",
                 mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
                 threshold: float = 0.7, seed: int | None = 0) -> None:
        from algorithms.fedavg import FedAvg
        from secagg.messages import Upload

        if not (isinstance(clients, int) and clients >= 2):
            raise AuditError(f"clients must be an integer >= 2, got {clients!r}")
        if not (isinstance(dim, int) and dim >= 1):
            raise AuditError(f"dim must be a positive integer, got {dim!r}")
        self.layer = _client_layer(layer, epsilon, delta, mechanism, threshold, seed)
        self.kind = _kind(self.layer)
        self.clients, self.dim, self.clip = clients, dim, float(clip)
        self.algo = FedAvg(clip="adaptive")
        self.algo.clip_value = self.clip
        self.spec = self.algo.update_spec(dim)
        if self.spec.names != FIELDS:
            raise AuditError(f"adaptive clipping's upload is {self.spec.names}, expected "
                             f"{FIELDS}")
        rng = np.random.default_rng([0 if seed is None else seed, 41])
        u = rng.normal(size=dim)
        self.direction = u / np.linalg.norm(u)
        broadcast = (0.1 * rng.normal(size=dim)).astype(np.float32).astype(np.float64)
        canary = self.algo.clipped_update(broadcast + canary_norm * self.clip * self.direction,
                                          broadcast, self.clip)
        others = []
        for _ in range(clients - 1):
            raw = rng.normal(size=dim)
            raw *= background_norm * self.clip / float(np.linalg.norm(raw))
            others.append(self.algo.clipped_update(broadcast + raw, broadcast, self.clip))
        absent = {"update": np.zeros(dim), "unclipped": np.zeros(1)}
        self.uploads = {False: [absent, *others], True: [canary, *others]}
        for world, ups in self.uploads.items():
            self.uploads[world] = [
                {k: np.asarray(Upload.validate(self.spec, up, c, 1)[k], np.float64)
                 for k in FIELDS}
                for c, up in enumerate(ups)]
        self.canary_update = float(self.uploads[True][0]["update"] @ self.direction)
        self.canary_bit = float(self.uploads[True][0]["unclipped"][0])
        self._round = 0
        self.survivors: tuple[int, ...] = tuple(range(clients))
        self._claim: float | None = None
        self._composed = self._skellam_sum = False  # checked below for DistributedDP
        self._encoded: dict[bool, dict[str, np.ndarray]] = {}
        if self.kind == "distributed":
            self._plan = self.layer.release_plan(self.spec, clients)
            self.survivors = dropout_pattern(clients, self._plan.worst, survivors,
                                             self.layer.seed)
        self.notes = self._real_release()
        self.sigmas = self._sigmas_of(self.notes, len(self.survivors))
        if self.kind == "distributed":
            ctx = self._ctx()
            zero = np.zeros(sum(f.size for f in self._plan.additive), dtype=np.uint64)
            self.layer.finish(self._plan, self.spec, zero, self.survivors, ctx, ctx.privacy,
                              True)
            self._claim = float(ctx.privacy.epsilon(self.layer.delta))
            self._composed = composition_holds(
                self.layer, self._plan, [self.uploads[False], self.uploads[True]],
                self.survivors, self._ctx())
            self._skellam_sum = self._composed and skellam_sum_holds(self.layer)

    # -- facts ----------------------------------------------------------------------------

    def _sigmas_of(self, notes: dict[str, Any], survivors: int) -> dict[str, float]:
        if self.kind == "distributed":
            return {f: notes["target_sigma"][f] * math.sqrt(survivors / self._plan.worst)
                    for f in FIELDS}
        return {f: notes["fields"][f]["sigma"] for f in FIELDS}

    @property
    def epsilon(self) -> float:
        """The layer's claim (for DistributedDP: the ledger's charge for the survivors)."""
        return float(self.layer.epsilon) if self._claim is None else self._claim

    @property
    def mechanism(self) -> str:
        """``dp-fedavg-adaptive/<layer>``."""
        name = _mechanism_name(self.layer).replace("dp-fedavg", "dp-fedavg-adaptive")
        if self.kind == "distributed":
            name += f" ({len(self.survivors)} of {self.clients})"
        return name

    @property
    def canary(self) -> str:
        """The canary, in words."""
        return (f"client update at the clip {self.clip:g} and count bit "
                f"{self.canary_bit:+g}, {self.clients - 1} background clients")

    @property
    def statistics(self) -> list[Statistic]:
        """The likelihood-ratio direction of the two fields (real release's sigmas)."""
        w = np.array([self.canary_update / self.sigmas["update"] ** 2,
                      self.canary_bit / self.sigmas["unclipped"] ** 2])

        def score(obs: np.ndarray) -> np.ndarray:
            return np.asarray(obs, dtype=np.float64) @ w

        return [Statistic("update+count", score, "the update along the canary and the "
                          "clip count, weighted by their noise")]

    def details(self) -> dict[str, Any]:
        """Noise facts of the real release."""
        return {"sigma": dict(self.sigmas), "clip": self.clip, "dim": self.dim,
                "clients": self.clients, "survivors": len(self.survivors),
                "count_weight": self.algo.clip_policy.count_weight, "adjacency": "client",
                "noise_multiplier": self.notes.get("noise_multiplier", self.notes.get("z"))}

    # -- the release ----------------------------------------------------------------------

    def _ctx(self) -> Any:
        from secagg.layers.base import RoundContext
        from secagg.privacy.accountant import PrivacyLedger

        self._round += 1
        return RoundContext(self._round, PHASE, self._round, privacy=PrivacyLedger())

    def _real_release(self) -> dict[str, Any]:
        from secagg.messages import Upload

        ups = {c: Upload.validate(self.spec, v, c, 1)
               for c, v in enumerate(self.uploads[False])}
        return dict(self.layer.aggregate(ups, self.spec, self._ctx()).notes["dp"])

    def _wide(self, n: int) -> Any:
        from secagg.messages import UploadSpec

        return UploadSpec(tuple(dataclasses.replace(f, shape=(n * f.size,))
                                for f in self.spec.fields))

    def _check(self, sigmas: dict[str, float]) -> None:
        for f in FIELDS:
            self._same_sigma(sigmas[f], self.sigmas[f])

    def _observe(self, out: Any, n: int) -> np.ndarray:
        upd = np.asarray(out["update"], dtype=np.float64).reshape(n, self.dim) @ self.direction
        return np.stack([upd, np.asarray(out["unclipped"], dtype=np.float64)], axis=1)

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n releases, (n, 2): the update sum along the canary and the count sum (the
        canary client's noised upload under LocalDP); the noise from the layer's streams."""
        from secagg.layers.base import Aggregate
        from secagg.messages import Upload
        from secagg.privacy.layers import noise_source

        spec, ctx = self._wide(n), self._ctx()
        vals = [{k: np.tile(v, n) for k, v in up.items()} for up in self.uploads[with_canary]]
        if self.kind == "central":
            ledger = self.layer.begin(spec, ctx)
            sums = {k: np.sum([v[k] for v in vals], axis=0) for k in FIELDS}
            agg = self.layer.release(Aggregate(PHASE, ctx.round, sums, {},
                                               tuple(range(self.clients))), spec, ctx, ledger)
            self._check({k: v["sigma"] for k, v in agg.notes["dp"]["fields"].items()})
            return self._observe(agg.sums, n)
        if self.kind == "local":
            sigmas, wide = self.layer.noise_plan(spec)
            self._check(sigmas)
            src = noise_source(self.layer.seed, ctx.round, PHASE, 0)
            noised = self.layer.noise_upload(Upload(vals[0], spec, 0, 1), spec, sigmas, wide,
                                             src.rng)
            return self._observe(noised, n)
        plan = self._plan
        widened = tuple(dataclasses.replace(f, shape=(n * f.size,)) for f in plan.additive)
        rel = dataclasses.replace(plan, additive=widened,
                                  noised=tuple(f for f in widened
                                               if f.name in {g.name for g in plan.noised}))
        if self._composed:  # the same ring sum (composed_ring), each encoding done once
            if with_canary not in self._encoded:
                self._encoded[with_canary] = encoded_sum(plan, self.uploads[with_canary],
                                                         self.survivors)
            ring = composed_ring(self.layer, rel, self._encoded[with_canary], self.survivors,
                                 ctx, n, skellam_sum=self._skellam_sum)
            agg = self.layer.finish(rel, spec, ring, self.survivors, ctx, ctx.privacy, True)
            self._check(self._sigmas_of(agg.notes["dp"], len(self.survivors)))
            return self._observe(agg.sums, n)
        ring = None
        for c in self.survivors:
            src = noise_source(self.layer.seed, ctx.round, ctx.phase, c)
            enc = self.layer.encode_noised(rel, vals[c], src.rng)
            ring = enc if ring is None else ring + enc  # wraps mod 2^64
        assert ring is not None
        if rel.ring_bits < 64:
            ring &= np.uint64((1 << rel.ring_bits) - 1)
        agg = self.layer.finish(rel, spec, ring, self.survivors, ctx, ctx.privacy, True)
        self._check(self._sigmas_of(agg.notes["dp"], len(self.survivors)))
        return self._observe(agg.sums, n)

    def _reference_notes(self) -> dict[str, Any]:
        return {"fields": {f: {"sigma": s} for f, s in self.sigmas.items()}}


def audit_adaptive(layer: Any = "central-dp", *, epsilon: float | None = None,
                   delta: float = DEFAULT_DELTA, trials: int = 100_000, seed: int | None = 0,
                   confidence: float = 0.95, mode: str = "tight", progress: bool | None = None,
                   **release_kwargs: Any) -> AuditResult:
    """Audit one round of DP-FedAvg with adaptive clipping (:class:`AdaptiveRelease`)."""
    rel = AdaptiveRelease(layer, epsilon=epsilon, delta=delta, seed=seed, **release_kwargs)
    return audit(rel, epsilon=rel.epsilon, delta=rel.delta, trials=trials,
                 statistics=rel.statistics, confidence=confidence, seed=seed,
                 mechanism=rel.mechanism, canary=rel.canary, progress=progress,
                 batch=1 << 15, details=rel.details(), mode=mode)
