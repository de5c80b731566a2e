"""Empirical audit of client-level DP-FedAvg: a crafted canary *update*.

DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018; :mod:`secagg.privacy.clipping`)
promises client-level (epsilon, delta)-DP: each client uploads its model update clipped to
L2 <= C, a DP layer at ``adjacency="client"`` noises the sum with standard deviation z C,
and the server divides by the sampled cohort's size and steps its optimizer. The audit
tests that promise with the canary that helps the test most (Andrew, Kairouz, Oh, Oprea,
McMahan, Suriyakumar, "One-shot empirical privacy estimation for federated learning",
ICLR 2024, audit with crafted canary clients in this way):

* the **canary client**'s local model sits ``canary_norm`` x C away from the broadcast in a
  fixed unit direction u, so its update is clipped to exactly C u (well outside the ball
  before the clip, so a clip that is not applied shows at once);
* the **background clients** hold synthetic updates (random directions, norm
  ``background_norm`` x C before the clip), clipped like every client's;
* the canary-free world has the canary client upload the zero update (what an absent
  client adds to the sum), so both worlds have the same cohort, the same denominator and
  the same noise shares;
* the test statistic is the release projected on u.

Every client's upload goes through the real code: :meth:`algorithms.fedavg.FedAvg.
clipped_update` (hence :func:`~secagg.privacy.clipping.clip_l2`), the upload check
(:meth:`secagg.messages.Upload.validate`, which refuses an update above its bound), the
layer's own noise path and samplers, and, for CentralDP and DistributedDP, the server's
:meth:`~algorithms.fedavg.FedAvg.apply_update` (mean over the cohort, one server-SGD step):
the observation is the new global model. For LocalDP the observation is what the server
reads of the canary client: its noised upload.

Clipping and the upload check are deterministic, so they run once per audit; the noise is
what varies, and ``n`` releases of the ``dim``-coordinate update are drawn as one release of
an ``n x dim``-coordinate field with the ``dim``-coordinate release's noise plan (the same
approach and checks as :class:`threat_models.dp_audit.SumRelease`): the noise std is
compared with a real release through ``layer.aggregate``.

Two audits:

* :func:`audit_fedavg` (multi-run): ``trials`` releases per world, Clopper-Pearson bound
  (:func:`threat_models.dp_audit.audit`).
* :func:`audit_fedavg_one_run` (Steinke, Nasr, Jagielski, NeurIPS 2023): one round with
  ``canaries`` canary clients, canary i along its own coordinate e_i and present (its
  clipped update) or absent (zero update) by a fair coin; the auditor ranks the canaries by
  the released sum's coordinate i and guesses the top and the bottom
  (:func:`threat_models.dp_audit.one_run_epsilon`). Background clients live in ``dim``
  further coordinates. For DistributedDP every client of the one-run cohort contributes
  (the noise shares are sized for the fewest survivors the secure sum accepts, so the sum
  carries more noise than the worst case: a sound, looser audit); the secure sum itself is
  replaced by the ring sum it computes exactly (tests of :mod:`secagg.secure_sum` check
  that bit for bit).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from threat_models.dp_audit import (
    DEFAULT_CLIENTS,
    DEFAULT_DELTA,
    AuditError,
    AuditResult,
    LayerClaim,
    TestOutcome,
    audit,
    composed_ring,
    composition_holds,
    dropout_pattern,
    encoded_sum,
    make_layer,
    one_run_epsilon,
    shift_statistic,
    skellam_sum_holds,
)
from threat_models.dp_audit_bounds import one_run_guess, one_run_half
from threat_models.dp_audit_sum import layer_kind

__all__ = ["FedAvgRelease", "audit_fedavg", "audit_fedavg_one_run", "canary_upload"]

FIELD = "update"
PHASE = "dp-audit-fedavg"


def _algo(clip: float, upload_dtype: str) -> Any:
    from algorithms.fedavg import FedAvg

    return FedAvg(clip=clip, upload_dtype=upload_dtype)


def canary_upload(algo: Any, broadcast: np.ndarray, direction: np.ndarray, clip: float,
                  canary_norm: float) -> np.ndarray:
    """The canary client's DP-FedAvg upload: its local model is ``broadcast + canary_norm
    * clip * direction`` and its update goes through ``algo.clipped_update`` (the real
    clip), so it is ``clip * direction`` when the clip works."""
    local = np.asarray(broadcast, np.float64) + canary_norm * clip * np.asarray(direction)
    return np.asarray(algo.clipped_update(local, broadcast, clip)[FIELD], dtype=np.float64)


def _background(algo: Any, broadcast: np.ndarray, count: int, clip: float, norm: float,
                rng: np.random.Generator, coords: slice | None = None) -> list[np.ndarray]:
    """``count`` synthetic client updates (random directions, norm ``norm * clip`` before
    the clip, in ``coords`` only when given), clipped by ``algo.clipped_update``."""
    out = []
    for _ in range(count):
        raw = np.zeros(broadcast.size)
        part = rng.normal(size=broadcast.size if coords is None else
                          coords.stop - coords.start)
        part *= norm * clip / float(np.linalg.norm(part))
        if coords is None:
            raw = part
        else:
            raw[coords] = part
        out.append(np.asarray(algo.clipped_update(broadcast + raw, broadcast, clip)[FIELD],
                              dtype=np.float64))
    return out


def _client_layer(layer: Any, epsilon: float | None, delta: float,
                  mechanism: str, threshold: float, seed: int | None) -> Any:
    if isinstance(layer, str):
        if epsilon is None:
            raise AuditError(f"the DP-FedAvg audit of {layer!r} needs epsilon")
        layer = make_layer(layer, epsilon=epsilon, delta=delta, adjacency="client",
                           mechanism=mechanism, threshold=threshold,  # type: ignore[arg-type]
                           seed=seed)
    layer_kind(layer, "DP-FedAvg is audited under CentralDP, LocalDP or DistributedDP")
    if layer.adjacency != "client":
        raise AuditError("DP-FedAvg's guarantee is client-level: build the layer with "
                         "adjacency='client'")
    return layer


def _kind(layer: Any) -> str:
    """The release the audit plays for ``layer`` (the layer registry's ``audit``)."""
    return layer_kind(layer, "DP-FedAvg is audited under CentralDP, LocalDP or DistributedDP")


def _mechanism_name(layer: Any) -> str:
    name = f"dp-fedavg/{layer.name}"
    return f"{name}/{layer.mechanism}" if _kind(layer) == "distributed" else name


class FedAvgRelease(LayerClaim):
    """One round of client-level DP-FedAvg as a batched release (module docstring).

    Args:
        layer: a CentralDP, LocalDP or DistributedDP layer with ``adjacency="client"``
            planned for one release, or its name (then ``epsilon``, ``delta``,
            ``mechanism``, ``threshold`` and ``seed`` build it with :func:`make_layer`).
        clip: the clip bound C.
        dim: the model size (entries of the update).
        clients: the sampled cohort (the canary client and ``clients - 1`` background
            clients); DistributedDP's sum has ``survivors`` of them
            (:func:`~threat_models.dp_audit.dropout_pattern`: by default the fewest the
            secure sum accepts; the claim is then what ``finish`` charges for them),
            the canary among them.
        canary_norm: the canary's update norm before the clip, over C (> 1).
        background_norm: the background updates' norm before the clip, over C.
        upload_dtype: FedAvg's ``upload_dtype``.
        seed: seeds the direction, the broadcast model, the background and the layer.
    """

    field_name: ClassVar[str] = FIELD

    def __init__(self, layer: Any = "central-dp", *, epsilon: float | None = None,
                 delta: float = DEFAULT_DELTA, clip: float = 1.0, dim: int = 8,
                 clients: int = DEFAULT_CLIENTS, canary_norm: float = 10.0,
                 background_norm: float = 2.0, survivors: int | str = "fewest",
                 upload_dtype: str = "float32",
                 mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
                 threshold: float = 0.7, seed: int | None = 0) -> None:
        from secagg.messages import Upload

        if not (isinstance(dim, int) and dim >= 1):
            raise AuditError(f"dim must be a positive integer, got {dim!r}")
        if not (isinstance(clients, int) and clients >= 2):
            raise AuditError(f"clients must be an integer >= 2, got {clients!r}")
        if not (math.isfinite(canary_norm) and canary_norm > 0):
            raise AuditError(f"canary_norm must be a positive number, got {canary_norm!r}")
        self.layer = _client_layer(layer, epsilon, delta, mechanism, threshold, seed)
        self.kind = _kind(self.layer)
        self.clip = float(clip)
        self.dim = dim
        self.clients = clients
        self.canary_norm = float(canary_norm)
        self.algo = _algo(self.clip, upload_dtype)
        self.spec = self.algo.update_spec(dim)
        rng = np.random.default_rng([0 if seed is None else seed, 22])
        u = rng.normal(size=dim)
        self.direction = u / np.linalg.norm(u)
        self.broadcast = (0.1 * rng.normal(size=dim)).astype(np.float32).astype(np.float64)
        canary = canary_upload(self.algo, self.broadcast, self.direction, self.clip,
                               self.canary_norm)
        others = _background(self.algo, self.broadcast, clients - 1, self.clip,
                             background_norm, rng)
        # the upload check every engine applies (raises when an update is above its bound)
        self.uploads = {False: [np.zeros(dim)] + others, True: [canary] + others}
        for world, vals in self.uploads.items():
            for c, v in enumerate(vals):
                self.uploads[world][c] = np.asarray(
                    Upload.validate(self.spec, {FIELD: v}, c, 1)[FIELD], dtype=np.float64)
        self.canary_value = self.uploads[True][0]
        self._round = 0
        self.survivors: tuple[int, ...] = tuple(range(clients))
        self._claim: float | None = None
        self._composed = False  # the per-client path unless the composition is checked
        self._skellam_sum = False
        self._encoded: dict[bool, dict[str, np.ndarray]] = {}
        if self.kind == "distributed":
            self._plan = self.layer.release_plan(self.spec, clients)
            self.survivors = dropout_pattern(clients, self._plan.worst, survivors,
                                             self.layer.seed)
        elif self.kind == "local":
            self._sigmas, _ = self.layer.noise_plan(self.spec)
        self.notes = self._real_release()
        if self.kind == "distributed":
            ctx = self._ctx()
            self.layer.finish(self._plan, self.spec, np.zeros(dim, dtype=np.uint64),
                              self.survivors, ctx, ctx.privacy, True)
            self._claim = float(ctx.privacy.epsilon(self.layer.delta))
            self._composed = composition_holds(
                self.layer, self._plan, [self.uploads[False], self.uploads[True]],
                self.survivors, self._ctx())
            self._skellam_sum = self._composed and skellam_sum_holds(self.layer)

    @property
    def epsilon(self) -> float:
        """The claimed epsilon: the layer's; for DistributedDP what its ledger charges for
        the round with these survivors."""
        return float(self.layer.epsilon) if self._claim is None else self._claim

    # -- facts ----------------------------------------------------------------------------

    @property
    def mechanism(self) -> str:
        """``dp-fedavg/<layer>`` (with the integer mechanism and the survivors for
        DistributedDP)."""
        name = _mechanism_name(self.layer)
        if self.kind != "distributed":
            return name
        return f"{name} ({len(self.survivors)} of {self.clients})"

    @property
    def canary(self) -> str:
        """The canary, in words."""
        return (f"client update at norm {float(np.linalg.norm(self.canary_value)):.4g} "
                f"(clip {self.clip:g}; {self.canary_norm:g}x before the clip), "
                f"{self.clients - 1} background clients")

    def details(self) -> dict[str, Any]:
        """Noise facts of the release (from the real release's notes)."""
        out: dict[str, Any] = {
            "noise_multiplier": self.notes.get("noise_multiplier", self.notes.get("z")),
            "sigma": self.notes["fields"][FIELD]["sigma"], "clip": self.clip,
            "dim": self.dim, "clients": self.clients, "survivors": len(self.survivors),
            "adjacency": "client"}
        if self.kind == "distributed":  # the noise the audited survivors add
            out.update(sigma=self.notes["target_sigma"][FIELD]
                       * math.sqrt(len(self.survivors) / self._plan.worst),
                       survivor_ids=list(self.survivors), min_survivors=self._plan.worst,
                       ring_bits=self.notes.get("ring_bits"),
                       scale_bits=self.notes.get("scale_bits", {}).get(FIELD))
        return out

    # -- the release ----------------------------------------------------------------------

    def _ctx(self) -> Any:
        from secagg.layers.base import RoundContext
        from secagg.privacy.accountant import PrivacyLedger

        self._round += 1
        return RoundContext(self._round, PHASE, self._round, privacy=PrivacyLedger())

    def _real_release(self) -> dict[str, Any]:
        """One release of the canary-free cohort through ``layer.aggregate`` (validation,
        secure sum with masking for DistributedDP, noise, decoding): its notes are what
        the batched release is checked against."""
        from secagg.messages import Upload

        ups = {c: Upload.validate(self.spec, {FIELD: v}, c, 1)
               for c, v in enumerate(self.uploads[False])}
        agg = self.layer.aggregate(ups, self.spec, self._ctx())
        return dict(agg.notes["dp"])

    def _wide(self, n: int) -> Any:
        from secagg.messages import UploadSpec

        f = dataclasses.replace(self.spec[FIELD], shape=(n * self.dim,))
        return UploadSpec((f,))

    def _server(self, agg: Any, n: int) -> np.ndarray:
        """The server's step (mean over the sampled cohort, server SGD from the broadcast):
        the new global models, (n, dim)."""
        from algorithms.server_opt import OptimizerState

        self.algo.opt_state = OptimizerState()
        agg.cohort = self.clients
        new = self.algo.apply_update(np.tile(self.broadcast, n).astype(np.float32), agg)
        return np.asarray(new, dtype=np.float64).reshape(n, self.dim)

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n releases, (n, dim): the new global model (CentralDP, DistributedDP) or the
        canary client's noised upload (LocalDP). The noise comes from the layer's own
        streams; ``rng`` is unused."""
        from secagg.layers.base import Aggregate
        from secagg.messages import Upload
        from secagg.privacy.layers import noise_source

        spec, ctx = self._wide(n), self._ctx()
        if self.kind == "distributed":
            return self._distributed(self.uploads[with_canary], spec, ctx, n, with_canary)
        vals = [np.tile(v, n) for v in self.uploads[with_canary]]
        if self.kind == "central":
            ledger = self.layer.begin(spec, ctx)
            agg = Aggregate(PHASE, ctx.round, {FIELD: np.sum(vals, axis=0)}, {},
                            tuple(range(self.clients)))
            agg = self.layer.release(agg, spec, ctx, ledger)
            self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"])
            return self._server(agg, n)
        if self.kind == "local":
            sigmas, wide = self.layer.noise_plan(spec)
            self._same_sigma(sigmas[FIELD], self._sigmas[FIELD])
            src = noise_source(self.layer.seed, ctx.round, PHASE, 0)
            up = Upload({FIELD: vals[0]}, spec, 0, 1)
            noised = self.layer.noise_upload(up, spec, sigmas, wide, src.rng)
            return np.asarray(noised[FIELD], dtype=np.float64).reshape(n, self.dim)
        raise AssertionError(self.kind)  # pragma: no cover (distributed returned above)

    def _encoded_sum(self, with_canary: bool, plan: Any) -> dict[str, np.ndarray]:
        """The survivors' encoded updates (the release plan's fixed point, one trial),
        summed in the ring: the same in every trial, so computed once per world."""
        if with_canary not in self._encoded:
            self._encoded[with_canary] = encoded_sum(plan, self.uploads[with_canary],
                                                     self.survivors)
        return self._encoded[with_canary]

    def _distributed(self, vals: list[np.ndarray], spec: Any, ctx: Any, n: int,
                     with_canary: bool) -> np.ndarray:
        plan = self._plan
        wide = dataclasses.replace(plan.additive[0], shape=(n * self.dim,))
        rel = dataclasses.replace(plan, additive=(wide,), noised=(wide,))
        if self._composed:
            ring = composed_ring(self.layer, rel, self._encoded_sum(with_canary, plan),
                                 self.survivors, ctx, n, skellam_sum=self._skellam_sum)
            agg = self.layer.finish(rel, spec, ring, self.survivors, ctx, ctx.privacy, True)
        else:  # a layer whose encode_noised is not encode + _draw: every client, as it is
            agg = _ring_release(self.layer, rel, spec, ctx,
                                [np.tile(vals[c], n) for c in self.survivors], self.survivors)
        self._same_sigma(agg.notes["dp"]["target_sigma"][FIELD],
                         self.notes["target_sigma"][FIELD])
        self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"],
                         self.notes["target_sigma"][FIELD]
                         * math.sqrt(len(self.survivors) / plan.worst))
        return self._server(agg, n)

    def _reference_notes(self) -> dict[str, Any]:
        return self.notes


def _ring_release(layer: Any, rel: Any, spec: Any, ctx: Any,
                  values: list[np.ndarray], ids: Sequence[int] | None = None) -> Any:
    """DistributedDP's release of ``values`` (one array per surviving client, whose ids are
    ``ids``, default 0, 1, ...): each client's ``encode_noised`` (its noise share from its
    own stream), the ring sum the secure sum computes, and the aggregator's ``finish``."""
    from secagg.privacy.layers import noise_source

    ids = tuple(range(len(values))) if ids is None else tuple(ids)
    ring = np.zeros(values[0].size, dtype=np.uint64)
    for c, v in zip(ids, values, strict=True):
        src = noise_source(layer.seed, ctx.round, ctx.phase, c)
        ring += layer.encode_noised(rel, {FIELD: v}, src.rng)  # wraps mod 2^64
    if rel.ring_bits < 64:
        ring &= np.uint64((1 << rel.ring_bits) - 1)
    return layer.finish(rel, spec, ring, ids, ctx, ctx.privacy, True)


def audit_fedavg(layer: Any = "central-dp", *, epsilon: float | None = None,
                 delta: float = DEFAULT_DELTA, trials: int = 100_000, seed: int | None = 0,
                 confidence: float = 0.95, progress: bool | None = None,
                 mode: str = "tight", **release_kwargs: Any) -> AuditResult:
    """Multi-run audit of client-level DP-FedAvg (:class:`FedAvgRelease`, options as
    there) against the layer's claim: the shift test along the canary's direction.
    Example: ``audit_fedavg("central-dp", epsilon=2.0).epsilon_lower``."""
    rel = FedAvgRelease(layer, epsilon=epsilon, delta=delta, seed=seed, **release_kwargs)
    return audit(rel, epsilon=rel.epsilon, delta=rel.delta, trials=trials,
                 statistics=[shift_statistic(rel.direction)], confidence=confidence,
                 seed=seed, mechanism=rel.mechanism, canary=rel.canary, progress=progress,
                 batch=1 << 15, details=rel.details(), mode=mode)


def audit_fedavg_one_run(layer: Any = "central-dp", *, epsilon: float | None = None,
                         delta: float = DEFAULT_DELTA, canaries: int = 1000,
                         guesses: int | None = None, background: int = 8, dim: int = 8,
                         clip: float = 1.0, canary_norm: float = 10.0,
                         background_norm: float = 2.0, upload_dtype: str = "float32",
                         mechanism: Literal["discrete_gaussian", "skellam"] =
                         "discrete_gaussian", threshold: float = 0.7, seed: int = 0,
                         confidence: float = 0.95) -> AuditResult:
    """One-run audit of client-level DP-FedAvg (module docstring; Steinke, Nasr, Jagielski,
    NeurIPS 2023): one round of ``canaries`` canary clients (each present with
    probability 1/2) and ``background`` background clients, model size ``canaries +
    dim``. The auditor says "present" for the ``guesses // 2`` canaries whose coordinate of
    the release is largest and "absent" for the ``guesses // 2`` smallest (default
    guesses: canaries / 5) and reports the largest epsilon :func:`one_run_epsilon` rejects.
    The release is the new global model (CentralDP, DistributedDP) or each canary client's
    noised upload (LocalDP, what the server reads)."""
    from secagg.layers.base import RoundContext
    from secagg.messages import Upload
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.layers import noise_source

    k = one_run_half(canaries, guesses)
    t0 = time.perf_counter()
    lay = _client_layer(layer, epsilon, delta, mechanism, threshold, seed)
    kind = _kind(lay)
    algo = _algo(clip, upload_dtype)
    size = canaries + dim
    spec = algo.update_spec(size)
    rng = np.random.default_rng([seed, 23])
    included = rng.random(canaries) < 0.5
    broadcast = (0.1 * rng.normal(size=size)).astype(np.float32).astype(np.float64)
    values: list[np.ndarray] = []
    for i in range(canaries):
        if included[i]:
            values.append(canary_upload(algo, broadcast, np.eye(1, size, i).ravel(), clip,
                                        canary_norm))
        else:
            values.append(np.zeros(size))
    values += _background(algo, broadcast, background, clip, background_norm, rng,
                          slice(canaries, size))
    ups = {c: Upload.validate(spec, {FIELD: v}, c, 1) for c, v in enumerate(values)}
    n_clients = len(ups)
    ctx = RoundContext(1, PHASE, 1, privacy=PrivacyLedger())
    if kind == "local":
        sigmas, wide = lay.noise_plan(spec)
        lay.spend(lay.begin(spec, ctx), sigmas, ctx)
        score = np.empty(canaries)
        for i in range(canaries):
            src = noise_source(lay.seed, ctx.round, PHASE, i)
            score[i] = lay.noise_upload(ups[i], spec, sigmas, wide, src.rng)[FIELD][i]
        sigma = float(sigmas[FIELD])
    else:
        if kind == "central":
            agg = lay.aggregate(ups, spec, ctx)  # the real layer, end to end
        else:
            lay.begin(spec, ctx)
            rel = lay.release_plan(spec, n_clients)
            agg = _ring_release(lay, rel, spec, ctx,
                                [np.asarray(ups[c][FIELD]) for c in range(n_clients)])
        sigma = float(agg.notes["dp"]["fields"][FIELD]["sigma"])
        agg.cohort = n_clients
        new = algo.apply_update(broadcast.astype(np.float32), agg)
        score = np.asarray(new, dtype=np.float64)[:canaries] - broadcast[:canaries]
    r, v = one_run_guess(score, included, k)
    lower = one_run_epsilon(canaries, r, v, float(lay.delta), 1.0 - confidence)
    test = TestOutcome("one-run", lower, float("nan"), "top/bottom", r - v, r, 0, canaries)
    name = _mechanism_name(lay) + " (one run)"
    return AuditResult(name, float(lay.epsilon), lower, float(lay.delta), float(confidence),
                       1, f"{canaries} canary clients (update at the clip {clip:g}), "
                       f"{r} guesses, {v} correct", [test], time.perf_counter() - t0,
                       {"canaries": canaries, "guesses": r, "correct": v,
                        "background": background, "clip": clip, "sigma": sigma,
                        "adjacency": "client"})
