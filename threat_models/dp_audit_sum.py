"""The DP layers (CentralDP, LocalDP, DistributedDP) audited on a bare bounded sum,
through their own noise paths and samplers: the layer under audit, the dropout pattern
of its secure sum, the fast composed-ring path with the checks that license it, and
:class:`SumRelease` / :func:`audit_sum`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from secagg.layers.registry import LayerOptions, audited_kind, get_layer, layer_names
from secagg.layers.registry import make_layer as build_layer
from threat_models.dp_audit_gdp import AuditError
from threat_models.dp_audit_release import DEFAULT_DELTA, AuditResult, audit
from threat_models.dp_audit_statistics import (
    Statistic,
    exact_statistic,
    parity_statistic,
    shift_statistic,
)

#: The DP layers the audit plays, as the layer registry declares them (its ``audit``).
LAYER_NAMES = layer_names(audited=True)
FIELD = "x"
PHASE = "dp-audit"


def audit_kind(name: str) -> str:
    """Which release the audit plays for the registered DP layer ``name`` (``central``,
    ``local`` or ``distributed``: the registry entry's ``audit``).

    Raises:
        AuditError: ``name`` is not an audited layer.
    """
    if name not in LAYER_NAMES:
        raise AuditError(f"unknown DP layer {name!r}; one of {', '.join(LAYER_NAMES)}")
    return str(get_layer(name).audit)


def layer_kind(layer: Any, audits: str) -> str:
    """Which release the audit plays for the layer instance ``layer`` (see
    :func:`audit_kind`; a subclass of an audited layer is audited as it).

    Raises:
        AuditError: the layer is not one the auditor ``audits`` (named in the message).
    """
    kind = audited_kind(layer)
    if kind is None:
        raise AuditError(f"{audits}, got {type(layer).__name__}")
    return kind


def make_layer(name: str, *, epsilon: float, delta: float = DEFAULT_DELTA,
               adjacency: Literal["record", "client"] = "record",
               mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
               threshold: float = 0.7, seed: int | None = 0) -> Any:
    """The DP layer ``name`` (``central-dp``, ``local-dp``, ``distributed-dp``) for one
    release at (epsilon, delta), as a user would build it from the layer registry:
    CentralDP(Plaintext()), LocalDP(Plaintext()), DistributedDP(SecureSum(threshold)).
    ``seed`` fixes its noise streams (reproducible, and marked not private); None draws
    them from OS entropy."""
    dp: dict[str, Any] = {"adjacency": adjacency, "seed": seed}
    if audit_kind(name) == "distributed":
        dp["mechanism"] = mechanism
    return build_layer(name, LayerOptions(threshold=threshold, epsilon=epsilon, delta=delta,
                                          rounds=1, dp=dp))


#: Cohort of the audited sums by default: large enough that DistributedDP's secure sum
#: accepts fewer survivors than clients (7 of 10 at threshold 0.7).
DEFAULT_CLIENTS = 10
#: Which survivors DistributedDP is audited with by default: the fewest the secure sum
#: accepts (the least noise) and all of them (the ledger's smallest charge).
SURVIVOR_PATTERNS = ("fewest", "all")


def dropout_pattern(clients: int, fewest: int, survivors: int | str,
                    seed: int | None) -> tuple[int, ...]:
    """The surviving clients of a cohort of ``clients`` (ids 0..clients-1): ``"fewest"``
    (``fewest``, the least the secure sum accepts), ``"all"``, or a count in between.
    Client 0 (the canary's) always survives; which others drop is drawn by ``seed``, so
    the audit exercises dropouts anywhere in the cohort, not only at its end."""
    if survivors == "fewest":
        k = fewest
    elif survivors == "all":
        k = clients
    elif isinstance(survivors, int) and not isinstance(survivors, bool):
        k = survivors
    else:
        raise AuditError(f"survivors must be 'fewest', 'all' or a count, got {survivors!r}")
    if not fewest <= k <= clients:
        raise AuditError(f"survivors must be between the fewest the secure sum accepts "
                         f"({fewest}) and the cohort ({clients}), got {k}")
    rng = np.random.default_rng([0 if seed is None else seed, 31, clients, k])
    others = rng.choice(np.arange(1, clients), size=k - 1, replace=False)
    return (0, *sorted(int(c) for c in others))


def composed_ring(layer: Any, rel: Any, encoded: Any, ids: Sequence[int], ctx: Any, n: int,
                  *, skellam_sum: bool = False) -> np.ndarray:
    """DistributedDP's ring sum over the survivors ``ids`` for ``n`` trials of a release
    whose survivors' encodings (one trial, the release plan's fixed point) sum to
    ``encoded`` (per summed field, a mapping from its name; an array for a single field):
    the encodings once, tiled ``n`` times, plus each survivor's noise shares drawn by the
    layer's own ``_draw`` at the release's share std of each noised field, in field order,
    from that survivor's stream (``noise_source``), reduced to the ring.

    This is bit for bit the per-client path (``encode_noised`` of each survivor, summed mod
    2^64, then the ring mask) when ``encode_noised`` is ``encode + _draw``, which
    :func:`composition_holds` checks on the layer itself: the encoding is elementwise and
    deterministic, each survivor's stream is consumed by the same ``_draw`` calls of the
    same sizes in the same order in both, and the sum mod 2^64 does not depend on the
    order of its terms.

    ``skellam_sum`` (Skellam only, :func:`skellam_sum_holds`): the k survivors' shares of
    each entry are drawn as one Skellam variable Sk(k lam, k lam), lam = std^2 / 2 the
    share's parameter (as the layer's ``_draw`` computes it), from one stream of its own.
    That is the same distribution: a share is Poisson(lam) - Poisson(lam), and k
    independent shares sum to Poisson(k lam) - Poisson(k lam) (a sum of independent
    Poissons is Poisson). The only difference: k lam is rounded to float64 once (relative
    error <= 2^-53). A sum of discrete Gaussians is not a discrete Gaussian, so their
    shares are always drawn one by one."""
    from secagg.privacy.layers import noise_source
    from secagg.privacy.samplers import skellam

    fields = tuple(rel.additive)
    enc = encoded if isinstance(encoded, Mapping) else {fields[0].name: encoded}
    ring = np.concatenate([np.tile(np.asarray(enc[f.name], dtype=np.uint64), n)
                           for f in fields])
    segs = rel.segments
    noised = [f for f in fields if f.name in rel.share_std]
    if skellam_sum:
        src = noise_source(layer.seed, ctx.round, ctx.phase, ("survivors",) + tuple(ids))
        for f in noised:
            std = float(rel.share_std[f.name])
            ring[segs[f.name]] += skellam(len(ids) * (std * std / 2.0), f.size,
                                          src.rng).view(np.uint64)
    else:
        for c in ids:
            src = noise_source(layer.seed, ctx.round, ctx.phase, c)
            for f in noised:  # wraps mod 2^64
                ring[segs[f.name]] += layer._draw(rel.share_std[f.name], f.size,
                                                  src.rng).view(np.uint64)
    if rel.ring_bits < 64:
        ring &= np.uint64((1 << rel.ring_bits) - 1)
    return ring


def encoded_sum(plan: Any, values: Sequence[Any], ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Per summed field of ``plan``, the ring sum of the clients ``ids``'s encodings of
    ``values[c]`` (one trial; a mapping from field name, or an array for a single field)."""
    out = {f.name: np.zeros(f.size, dtype=np.uint64) for f in plan.additive}
    for c in ids:
        one = values[c] if isinstance(values[c], Mapping) else {plan.additive[0].name:
                                                                 values[c]}
        for f in plan.additive:
            out[f.name] += plan.plans[f.name].encode(
                np.asarray(one[f.name], dtype=np.float64).ravel())
    return out


def composition_holds(layer: Any, plan: Any, worlds: Sequence[Sequence[Any]],
                      ids: Sequence[int], ctx: Any, probe: int = 3) -> bool:
    """Whether :func:`composed_ring` (shares drawn one by one) equals the layer's own
    per-client path -- ``encode_noised`` of every survivor in ``ids``, summed in the ring
    -- bit for bit, on a probe batch of ``probe`` trials of each world in ``worlds`` (per
    client, one trial's values as :func:`encoded_sum` takes them), with the same streams.
    A layer whose ``encode_noised`` does anything else (a subclass, an injected bug) fails
    and must be audited on the per-client path."""
    from secagg.privacy.layers import noise_source

    wide = tuple(dataclasses.replace(f, shape=(probe * f.size,)) for f in plan.additive)
    names = {f.name for f in plan.noised}
    rel = dataclasses.replace(plan, additive=wide,
                              noised=tuple(f for f in wide if f.name in names))
    for values in worlds:
        ring = np.zeros(sum(f.size for f in wide), dtype=np.uint64)
        for c in ids:
            src = noise_source(layer.seed, ctx.round, ctx.phase, c)
            one = values[c] if isinstance(values[c], Mapping) else {plan.additive[0].name:
                                                                     values[c]}
            tiled = {f.name: np.tile(np.asarray(one[f.name], dtype=np.float64).ravel(), probe)
                     for f in plan.additive}
            ring += layer.encode_noised(rel, tiled, src.rng)
        if rel.ring_bits < 64:
            ring &= np.uint64((1 << rel.ring_bits) - 1)
        mine = composed_ring(layer, rel, encoded_sum(plan, values, ids), ids, ctx, probe)
        if not np.array_equal(ring, mine):
            return False
    return True


def skellam_sum_holds(layer: Any, std: float = 1234.5, probe: int = 64) -> bool:
    """Whether the layer's share sampler is the Skellam sampler at lam = std^2 / 2 (same
    output from the same stream), so that :func:`composed_ring` may draw the survivors'
    summed shares as one Skellam variable."""
    from secagg.privacy.samplers import skellam

    if getattr(layer, "mechanism", None) != "skellam":
        return False
    mine = layer._draw(std, probe, np.random.default_rng(probe))
    return bool(np.array_equal(mine, skellam(std * std / 2.0, probe,
                                             np.random.default_rng(probe))))


class LayerClaim:
    """The (epsilon, delta) a release's DP layer (``self.layer``) claims for its one
    release: what an audit of that release tests."""

    layer: Any
    #: the released field whose noise the audit checks
    field_name: ClassVar[str] = FIELD

    @property
    def epsilon(self) -> float:
        """The claimed epsilon (the layer's, for its one release)."""
        return float(self.layer.epsilon)

    @property
    def delta(self) -> float:
        """The claimed delta."""
        return float(self.layer.delta)

    def _reference_notes(self) -> dict[str, Any]:
        """The ``notes["dp"]`` of one real release of the layer (set by the subclass)."""
        raise NotImplementedError

    def _same_sigma(self, got: float, want: float | None = None) -> None:
        """Refuse a batched draw whose noise std differs from a real release's (default:
        the reference release's own sigma), so that the audit tests the real mechanism."""
        if want is None:
            want = self._reference_notes()["fields"][self.field_name]["sigma"]
        if not math.isclose(float(got), float(want), rel_tol=1e-9):
            raise AuditError(f"{getattr(self, 'mechanism', '?')}: the batched release has "
                             f"noise std {got!r} but a real release {want!r}; it would not "
                             "audit the same mechanism")


class SumRelease(LayerClaim):
    """A DP layer releasing a bare bounded sum of one scalar field, as a batched release.

    The field ``x`` has shape (1,) and ``Bound(l2=bound)`` at the layer's adjacency, so one
    record (record adjacency) or one client (client adjacency) moves the sum by at most
    ``bound``. The canary is that record or client at ``+canary_scale * bound``, clipped
    by the real upload validation (``Upload.validate(..., on_violation="clip")``); the
    other ``clients - 1`` clients hold 0 (known to the adversary). For an integer
    mechanism the canary is moved one quantisation step inside the bound when that makes
    its integer shift odd (so the parity test can see a biased low bit).

    What is observed is what the layer's threat model protects: CentralDP's and
    DistributedDP's released sum, LocalDP's noised upload of the canary client. n releases
    are drawn at once as one release of an n-coordinate field whose noise plan is the
    scalar release's: CentralDP through ``release`` (its sigma depends on the L2 bound, not
    the size; checked), LocalDP through ``noise_plan``/``noise_upload``, DistributedDP
    through ``release_plan`` (of the scalar spec: scales, z, share std, ring) and then
    ``encode_noised`` per surviving client, the ring sum, and ``finish`` -- with only the
    ``survivors`` (by default the fewest the secure sum accepts: the least noise)
    contributing and the others dropped.

    Args:
        layer: a CentralDP, LocalDP or DistributedDP layer planned for one release (or a
            name for :func:`make_layer` with ``layer_kwargs``).
        bound: the L2 bound of one contribution.
        clients: the cohort size (DistributedDP sizes each share for the fewest survivors
            its secure sum accepts); default :data:`DEFAULT_CLIENTS`.
        canary_scale: the canary's raw value over the bound (> 1: a value the clip must
            bring back to the bound).
        survivors: DistributedDP only: who contributes to the sum (:func:`dropout_pattern`:
            ``"fewest"``, ``"all"`` or a count; the canary's client always survives). The
            claim is then what the layer's ``finish`` charges for those survivors.
    """

    def __init__(self, layer: Any, *, bound: float = 1.0, clients: int | None = None,
                 canary_scale: float = 1.0, survivors: int | str = "fewest",
                 **layer_kwargs: Any) -> None:
        from secagg.messages import Bound, Field, Upload, UploadSpec

        if isinstance(layer, str):
            layer = make_layer(layer, **layer_kwargs)
        elif layer_kwargs:
            raise AuditError("layer options are for a layer given by name only")
        kind = layer_kind(layer, "SumRelease audits CentralDP, LocalDP or DistributedDP")
        if not (math.isfinite(bound) and bound > 0):
            raise AuditError(f"bound must be a positive number, got {bound!r}")
        if clients is None:
            clients = DEFAULT_CLIENTS
        if not (isinstance(clients, int) and clients >= 1):
            raise AuditError(f"clients must be a positive integer, got {clients!r}")
        if not (math.isfinite(canary_scale) and canary_scale > 0):
            raise AuditError(f"canary_scale must be a positive number, got {canary_scale!r}")
        self.layer = layer
        self.bound = float(bound)
        self.clients = clients
        self.kind = kind
        self._bound = Bound(l2=self.bound, adjacency=layer.adjacency)
        self.spec = UploadSpec((Field(FIELD, (1,), bound=self._bound, additive=True),),
                               max_records=1)
        raw = np.array([canary_scale * self.bound])
        clipped = Upload.validate(self.spec, {FIELD: raw}, 0, 1, on_violation="clip")
        self.canary_value = float(clipped[FIELD][0])
        self._round = 0
        self.step = 0.0
        self.survivors: tuple[int, ...] = tuple(range(clients))
        self._claim: float | None = None
        if self.kind == "distributed":
            self._plan = layer.release_plan(self.spec, clients)
            self.survivors = dropout_pattern(clients, self._plan.worst, survivors,
                                             layer.seed)
            scale = self._plan.scales[FIELD]
            self.step = math.ldexp(1.0, -scale)
            # on the encoding's grid (what the sum carries), with an odd integer shift
            q = round(self.canary_value / self.step)
            if q % 2 == 0:
                q = q - 1 if q > 0 else q + 1
            self.canary_value = q * self.step
        elif self.kind == "local":
            self._sigmas, _ = layer.noise_plan(self.spec)
        self.scalar_notes = self._scalar_release()
        self._composed = self._skellam_sum = False
        if self.kind == "distributed":
            self._claim = self._survivors_claim()
            one = [np.zeros(1)] * self.clients
            self._composed = composition_holds(
                layer, self._plan, [one, [np.array([self.canary_value])] + one[1:]],
                self.survivors, self._ctx())
            self._skellam_sum = self._composed and skellam_sum_holds(layer)

    # -- facts --------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The claimed epsilon: the layer's; for DistributedDP what its ledger charges for
        the release with these survivors (more survivors, more noise, a smaller charge)."""
        return float(self.layer.epsilon) if self._claim is None else self._claim

    @property
    def mechanism(self) -> str:
        """The layer's name (with the integer mechanism and the survivors for
        DistributedDP)."""
        name = self.layer.name
        if self.kind != "distributed":
            return name
        return f"{name}/{self.layer.mechanism} ({len(self.survivors)} of {self.clients})"

    @property
    def canary(self) -> str:
        """The canary, in words."""
        who = "record" if self.layer.adjacency == "record" else "client"
        return f"{who} at +{self.canary_value:.6g} (L2 bound {self.bound:g})"

    @property
    def statistics(self) -> list[Statistic]:
        """The tests that apply: shift; for an integer mechanism also parity and exact."""
        out = [shift_statistic()]
        if self.kind == "distributed":
            out += [parity_statistic(self.step), exact_statistic(0.0, self.canary_value)]
        return out

    def details(self) -> dict[str, Any]:
        """Noise facts of the release (from a scalar release's notes)."""
        notes = self.scalar_notes
        out: dict[str, Any] = {"noise_multiplier": notes.get("noise_multiplier"),
                               "sigma": notes["fields"][FIELD]["sigma"],
                               "adjacency": self.layer.adjacency, "clients": self.clients}
        if self.kind == "distributed":
            out.update(ring_bits=notes.get("ring_bits"), survivors=len(self.survivors),
                       survivor_ids=list(self.survivors), min_survivors=self._plan.worst,
                       share_std=self._plan.share_std.get(FIELD),
                       sigma=notes["target_sigma"][FIELD]
                       * math.sqrt(len(self.survivors) / self._plan.worst),
                       scale_bits=notes.get("scale_bits", {}).get(FIELD))
        return out

    def _survivors_claim(self) -> float:
        """What the layer's own ``finish`` charges the ledger for a release with these
        survivors (the events of the noise they actually added), as epsilon at delta."""
        ctx = self._ctx()
        self.layer.finish(self._plan, self.spec, np.zeros(1, dtype=np.uint64),
                          self.survivors, ctx, ctx.privacy, True)
        return float(ctx.privacy.epsilon(self.delta))

    # -- the release --------------------------------------------------------------------

    def _values(self, with_canary: bool, n: int) -> np.ndarray:
        return np.full(n, self.canary_value if with_canary else 0.0)

    def _ctx(self) -> Any:
        from secagg.layers.base import RoundContext
        from secagg.privacy.accountant import PrivacyLedger

        self._round += 1
        return RoundContext(self._round, PHASE, self._round, privacy=PrivacyLedger())

    def _wide(self, n: int) -> Any:
        from secagg.messages import Field, UploadSpec

        return UploadSpec((Field(FIELD, (n,), bound=self._bound, additive=True),),
                          max_records=1)

    def _scalar_release(self) -> dict[str, Any]:
        """One real release of the scalar sum through ``aggregate`` (the canary-free
        cohort), for the notes the batched release is checked against."""
        from secagg.messages import Upload

        ups = {c: Upload.validate(self.spec, {FIELD: np.zeros(1)}, c, 1)
               for c in range(self.clients)}
        agg = self.layer.aggregate(ups, self.spec, self._ctx())
        return dict(agg.notes["dp"])

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n releases (float64), the canary in the sum when ``with_canary``. The noise
        comes from the layer's own streams (``noise_source``); ``rng`` is unused."""
        from secagg.layers.base import Aggregate
        from secagg.messages import Upload
        from secagg.privacy.layers import noise_source

        spec = self._wide(n)
        ctx = self._ctx()
        values = self._values(with_canary, n)
        if self.kind == "central":
            ledger = self.layer.begin(spec, ctx)
            agg = Aggregate(PHASE, ctx.round, {FIELD: values}, {}, tuple(range(self.clients)))
            agg = self.layer.release(agg, spec, ctx, ledger)
            self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"])
            return np.asarray(agg.sums[FIELD], dtype=np.float64)
        if self.kind == "local":
            sigmas, wide = self.layer.noise_plan(spec)
            self._same_sigma(sigmas[FIELD], self._sigmas[FIELD])
            up = Upload({FIELD: values}, spec, 0, 1)
            src = noise_source(self.layer.seed, ctx.round, PHASE, 0)
            noised = self.layer.noise_upload(up, spec, sigmas, wide, src.rng)
            return np.asarray(noised[FIELD], dtype=np.float64)
        return self._distributed(values, spec, ctx)

    def _distributed(self, values: np.ndarray, spec: Any, ctx: Any) -> np.ndarray:
        from secagg.privacy.layers import noise_source

        plan = self._plan
        wide_field = dataclasses.replace(plan.additive[0], shape=(values.size,))
        rel = dataclasses.replace(plan, additive=(wide_field,), noised=(wide_field,))
        survivors = self.survivors
        if self._composed:  # the same ring sum (composed_ring), the encoding done once
            ring = composed_ring(self.layer, rel, plan.plans[FIELD].encode(values[:1]),
                                 survivors, ctx, values.size, skellam_sum=self._skellam_sum)
        else:
            mask = (1 << plan.ring_bits) - 1
            ring = np.zeros(values.size, dtype=np.uint64)
            for c in survivors:  # client 0 holds the canary, the others 0; the rest dropped
                mine = values if c == 0 else np.zeros_like(values)
                src = noise_source(self.layer.seed, ctx.round, PHASE, c)
                ring += self.layer.encode_noised(rel, {FIELD: mine}, src.rng)  # mod 2^64
            if plan.ring_bits < 64:
                ring &= np.uint64(mask)
        agg = self.layer.finish(rel, spec, ring, survivors, ctx, ctx.privacy, True)
        # the scalar release had every client contribute; compare the noise each share
        # was sized for (the fewest survivors' total), and what these survivors add
        self._same_sigma(agg.notes["dp"]["target_sigma"][FIELD],
                         self.scalar_notes["target_sigma"][FIELD])
        self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"],
                         self.scalar_notes["target_sigma"][FIELD]
                         * math.sqrt(len(survivors) / plan.worst))
        return np.asarray(agg.sums[FIELD], dtype=np.float64)

    def _reference_notes(self) -> dict[str, Any]:
        return self.scalar_notes


def audit_sum(layer: Any = "central-dp", *, epsilon: float | None = None,
              delta: float = DEFAULT_DELTA, adjacency: Literal["record", "client"] = "record",
              mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
              trials: int = 1_000_000, seed: int | None = 0, clients: int | None = None,
              bound: float = 1.0, canary_scale: float = 1.0, confidence: float = 0.95,
              threshold: float = 0.7, progress: bool | None = None,
              survivors: int | str = "fewest", mode: str = "tight") -> AuditResult:
    """Audit a DP layer on a bare bounded sum (:class:`SumRelease`) against its claim.

    ``layer``: a layer name (built by :func:`make_layer` with ``epsilon``, ``delta``,
    ``adjacency``, ``mechanism``, ``threshold`` and ``seed``) or a DP layer planned for one
    release. The statistics are :attr:`SumRelease.statistics`; ``seed`` also seeds the
    auditor. Example: ``audit_sum("central-dp", epsilon=2.0).epsilon_lower``.
    """
    if isinstance(layer, str):
        if epsilon is None:
            raise AuditError(f"audit_sum({layer!r}) needs epsilon")
        release = SumRelease(layer, bound=bound, clients=clients, canary_scale=canary_scale,
                             survivors=survivors, epsilon=epsilon, delta=delta,
                             adjacency=adjacency, mechanism=mechanism, threshold=threshold,
                             seed=seed)
    else:
        release = SumRelease(layer, bound=bound, clients=clients, canary_scale=canary_scale,
                             survivors=survivors)
    return audit(release, epsilon=release.epsilon, delta=release.delta, trials=trials,
                 statistics=release.statistics, confidence=confidence, seed=seed,
                 mechanism=release.mechanism, canary=release.canary, progress=progress,
                 details=release.details(), mode=mode)
