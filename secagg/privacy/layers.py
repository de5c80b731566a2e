"""Differential-privacy layers: wrappers that add calibrated noise around an inner layer.

* :class:`CentralDP` — the aggregator adds Gaussian noise to the sums the inner layer
  produced. The aggregator therefore sees the un-noised sum first (under ``SecureSum`` the
  sum, under ``Plaintext`` every upload); the aggregate's notes and the transcript say so.
* :class:`LocalDP` — each client adds Gaussian noise to its own upload before it leaves;
  the inner layer carries noised uploads (transcripted as ``"noised"``).
* :class:`DistributedDP` — around ``SecureSum``: each client adds a share of integer noise
  (discrete Gaussian or Skellam) to its fixed-point-encoded vector before masking, sized so
  that the survivors' total reaches the target even when as many clients drop as the
  secure sum's threshold allows. The ring is planned with room for the noise (a 2^-40
  tail bound, see :func:`noise_tail`), and the noise actually achieved by the contributors
  is what the ledger records.

Noise level: the user gives two of (epsilon, delta, noise multiplier z); the third follows
for ``rounds * releases_per_round`` releases (:meth:`_DPLayer.plan_releases` overrides the
count). A release noises every non-public field f with sigma_f = z * sqrt(k) * Delta_f,
k the number of noised fields and Delta_f the field's L2 sensitivity (from its Bound and the
adjacency): the release is then exactly a Gaussian mechanism with multiplier z on the
joint sensitivity, whatever k. Fields with unequal :attr:`~secagg.messages.Field.dp_weight`
get sqrt(W / w_f) in place of sqrt(k) (W the weights' sum), with the same guarantee.
Fields listed in ``public`` are not noised: the transcript
says so, and the run's ledger marks each of them as released without DP noise (the run is
then not private; :meth:`_DPLayer.unnoised_fields` names them, with the reason). Every
other field needs a Bound (else :class:`InadmissibleField`). A user ``seed`` makes the noise
reproducible and marks the fields it noised as not private.

Before every release the layer asks the run's :class:`PrivacyLedger` (``ctx.privacy``, or
the layer's own) to :meth:`~PrivacyLedger.spend` the event; a release that would exceed
the budget raises :class:`BudgetExceeded` and nothing is released.

Each layer's work is split by party, so that a runtime whose clients run elsewhere (the
Flower runtime, :mod:`secagg.flower`) runs each part where it belongs and gets the embedded
engine's numbers: :meth:`_DPLayer.begin` (the aggregator, before a release),
:meth:`CentralDP.release` (the aggregator, after the inner layer),
:meth:`LocalDP.noise_plan` / :meth:`LocalDP.noise_upload` (a client, before its upload
leaves), :meth:`DistributedDP.release_plan` / :meth:`DistributedDP.encode_noised` (a
client, before masking) and :meth:`DistributedDP.finish` (the aggregator, on the ring sum).
:meth:`_DPLayer.node_params` is what a client needs to rebuild the noise side
(:func:`node_layer`); :func:`noise_source` gives every party its own noise stream.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from secagg.costs import SERVER
from secagg.encoding import FixedPoint, plan, plan_ring_bits
from secagg.errors import InadmissibleField, PrivacyError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import calibrate, delta_for, epsilon_for
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    PrivacyEvent,
    SkellamEvent,
)
from secagg.privacy.samplers import (
    NoiseSource,
    discrete_gaussian,
    gaussian,
    noise_generator,
    skellam,
)
from secagg.privacy.sensitivity import field_l1, field_l2, noise_split
from secagg.privacy.tree import TreeAccount, TreeNoise, decomposition, tree_depth
from secagg.stream import Booked, Lazy

__all__ = ["CentralDP", "DistributedDP", "DistributedRelease", "LocalDP", "node_layer",
           "noise_source", "noise_tail"]

DEFAULT_DELTA = 1e-5
#: Probability that the noise of one release exceeds the headroom planned for it.
TAIL_PROBABILITY = 2.0 ** -40


def noise_tail(std: float, entries: int, mechanism: str = "gaussian",
               failure: float = TAIL_PROBABILITY) -> float:
    """A bound B with P[max over ``entries`` entries of |noise| > B] <= ``failure``.

    Gaussian and discrete Gaussian (sub-Gaussian with variance proxy std^2, Canonne-Kamath-
    Steinke 2020; sums of independent shares add their proxies): B = std sqrt(2 ln(2 n/p)).
    Skellam of variance v = std^2 (Chernoff: P[X >= a] <= exp(-(a asinh(a/v) - sqrt(v^2 + a^2)
    + v))): B solves that bound = p / (2 n) by bisection.
    """
    if entries < 1 or std <= 0:
        return 0.0
    per = failure / (2.0 * entries)
    if mechanism != "skellam":
        return std * math.sqrt(2.0 * math.log(1.0 / per))
    v = std * std

    def log_tail(a: float) -> float:
        return -(a * math.asinh(a / v) - math.sqrt(v * v + a * a) + v)

    lo, hi = 0.0, std * math.sqrt(2.0 * math.log(1.0 / per)) + 1.0
    while log_tail(hi) > math.log(per):
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if log_tail(mid) > math.log(per):
            lo = mid
        else:
            hi = mid
    return hi


def _derived_seed(seed: int, *parts: Any) -> int:
    words = [seed] + [zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint64).view(np.uint64)[0])


def noise_source(seed: int | None, round: int, phase: str, party: Any) -> NoiseSource:
    """The noise stream of ``party`` (a client id, or the aggregator) for one release:
    secret (a fresh OS-keyed AES-CTR generator) when ``seed`` is None; with a user seed, a
    reproducible stream derived from (seed, round, phase, party) -- the same wherever the
    party runs, and not private."""
    if seed is None:
        return noise_generator()
    return noise_generator(_derived_seed(seed, round, phase, party))


class _RelabelContext(RoundContext):
    """A RoundContext whose observations of noised fields are recorded as ``"noised"``."""

    _noised: frozenset[str] = frozenset()

    def observe(self, party: str, sender: Any, stage: str, field: str, form: str,
                value: Any, what: str = "upload", nbytes: int | None = None,
                value_digest: str | None = None) -> None:
        """Record an observation; ``"clear"`` becomes ``"noised"`` for noised fields."""
        if form == "clear" and field in self._noised:
            form = "noised"
        super().observe(party, sender, stage, field, form, value, what, nbytes, value_digest)


def relabel(ctx: RoundContext, noised: Sequence[str]) -> RoundContext:
    """``ctx``, with what any party observes in the clear of the ``noised`` fields recorded
    as ``"noised"`` (the inner layer of a DP layer carries noised values)."""
    new = _RelabelContext(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)})
    new._noised = frozenset(noised)
    return new


class _DPLayer(Layer):
    """Common machinery of the DP wrappers (parameters, calibration, ledger, noise)."""

    name: ClassVar[str] = "dp"
    allow_non_additive: ClassVar[bool] = False

    def __init__(
        self,
        inner: Layer,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        noise_multiplier: float | None = None,
        rounds: int | None = None,
        releases_per_round: int = 1,
        adjacency: Literal["record", "client"] = "record",
        public: Sequence[str] = (),
        seed: int | None = None,
    ) -> None:
        if not isinstance(inner, Layer):
            raise PrivacyError(f"{self.name}: inner must be a secagg Layer, got {inner!r}")
        if adjacency not in ("record", "client"):
            raise PrivacyError(f"adjacency must be 'record' or 'client', got {adjacency!r}")
        given = sum(v is not None for v in (epsilon, delta, noise_multiplier))
        if given == 3:
            raise PrivacyError("give two of (epsilon, delta, noise_multiplier); the third follows")
        if epsilon is None and noise_multiplier is None:
            raise PrivacyError(f"{self.name} needs epsilon (with delta) or a noise_multiplier")
        for nm, v in (("epsilon", epsilon), ("noise_multiplier", noise_multiplier)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise PrivacyError(f"{nm} must be a positive number, got {v!r}")
        if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        if rounds is not None and (not isinstance(rounds, int) or rounds < 1):
            raise PrivacyError(f"rounds must be a positive integer, got {rounds!r}")
        if not isinstance(releases_per_round, int) or releases_per_round < 1:
            raise PrivacyError(f"releases_per_round must be a positive integer, got "
                               f"{releases_per_round!r}")
        self.inner = inner
        self._epsilon = None if epsilon is None else float(epsilon)
        self._delta = None if delta is None else float(delta)
        self._z = None if noise_multiplier is None else float(noise_multiplier)
        self._z_given = noise_multiplier is not None
        self.adjacency = adjacency
        if isinstance(public, str):
            public = (public,)
        if not all(isinstance(p, str) for p in public):
            raise PrivacyError(f"public must be field names, got {public!r}")
        self.public = tuple(public)
        self.seed = seed
        self.releases = None if rounds is None else rounds * releases_per_round
        self._own_ledger: PrivacyLedger | None = None
        #: events spent outside this layer in every round (e.g. DP-SGD's), and rounds
        self._prior_round: tuple[PrivacyEvent, ...] = ()
        self._prior_rounds = 0
        if seed is not None:
            noise_generator(seed)  # validates the seed

    # -- parameters --------------------------------------------------------------------

    @property
    def delta(self) -> float:
        """The delta of the guarantee (given, derived from epsilon and z, or 1e-5)."""
        if self._delta is not None:
            return self._delta
        if self._epsilon is not None and self._z_given:
            self._delta = delta_for(self._z, self._epsilon, rounds=self._planned_events(),
                                    event=self._event_factory(), prior=self.prior())
            return self._delta
        return DEFAULT_DELTA

    @property
    def epsilon(self) -> float:
        """The planned total epsilon (given, or derived from the noise multiplier)."""
        if self._epsilon is None:
            assert self._z is not None
            self._epsilon = epsilon_for(self._z, self.delta, rounds=self._planned_events(),
                                        event=self._event_factory(), prior=self.prior())
        return self._epsilon

    @property
    def noise_multiplier(self) -> float:
        """z: per release, the noise standard deviation over the joint L2 sensitivity."""
        if self._z is None:
            self._z = calibrate(self.epsilon, self.delta, rounds=self._planned_events(),
                                event=self._event_factory(), prior=self.prior())
        return self._z

    def plan_prior(self, per_round: Sequence[PrivacyEvent], rounds: int) -> None:
        """Share the budget with events spent outside this layer: ``per_round`` in each of
        ``rounds`` rounds (e.g. DP-SGD's planned round event, which the engine spends on the
        run's ledger before each release). The layer's noise is then calibrated so that
        those events and its own releases, composed, meet its epsilon: it gets what the
        prior leaves. ``per_round=()`` removes the prior.

        Raises:
            PrivacyError: a bad argument, or (when the noise is calibrated) the prior
                alone spends the whole epsilon.
        """
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise PrivacyError(f"rounds must be a non-negative integer, got {rounds!r}")
        events = tuple(per_round)
        if not all(isinstance(e, PrivacyEvent) for e in events):
            raise PrivacyError(f"per_round must be privacy events, got {per_round!r}")
        self._prior_round, self._prior_rounds = events, rounds
        if not self._z_given:
            self._z = None
        if hasattr(self, "_cal"):
            self._cal.clear()

    def prior(self, rounds: int | None = None) -> PrivacyLedger | None:
        """A ledger holding the prior events of the first ``rounds`` rounds (default: all
        planned ones; see :meth:`plan_prior`), or None when there are none."""
        n = self._prior_rounds if rounds is None else min(rounds, self._prior_rounds)
        if not self._prior_round or n < 1:
            return None
        led = PrivacyLedger()
        led.extend(list(self._prior_round) * n)
        return led

    def plan_releases(self, releases: int) -> None:
        """Set how many releases the run makes through this layer (rounds x phases using
        it); the noise is (re)calibrated for that count."""
        if not isinstance(releases, int) or releases < 1:
            raise PrivacyError(f"releases must be a positive integer, got {releases!r}")
        self.releases = releases
        if not self._z_given:
            self._z = None

    @property
    def streams(self) -> bool:
        """As the inner layer: the noise is added to each upload (or to the sum) as it
        passes, without holding the cohort."""
        return self.inner.streams

    def _n_releases(self) -> int:
        if self.releases is None:
            raise PrivacyError(
                f"{self.name}: the number of releases is unknown; pass rounds= (and "
                "releases_per_round=) or call plan_releases(n) before the run"
            )
        return self.releases

    def _planned_events(self) -> int:
        """How many times the planning event composes over the run (one per release)."""
        return self._n_releases()

    def _event_factory(self) -> Any:
        return lambda z: GaussianEvent(noise_multiplier=z)

    #: Whom this layer's guarantee holds against (:attr:`PrivacyLedger.holds_against`).
    holds_against: ClassVar[tuple[str, ...]] = ("everyone who sees the releases",)

    def make_privacy_ledger(self) -> PrivacyLedger:
        """A ledger for the run, with this layer's (epsilon, delta) as its budget and whom
        its guarantee holds against."""
        eps = self._epsilon if not self._z_given or self._epsilon is not None else None
        return PrivacyLedger(epsilon_budget=eps, delta=self.delta,
                             holds_against=self.holds_against)

    def describe(self) -> dict[str, Any]:
        """Name, inner layer and DP parameters."""
        out: dict[str, Any] = {
            "name": self.name, "inner": self.inner.describe(), "delta": self.delta,
            "adjacency": self.adjacency, "public": list(self.public),
            "seeded": self.seed is not None, "releases": self.releases,
        }
        if self.releases is not None:
            out["epsilon"] = self.epsilon
            out["noise_multiplier"] = self.noise_multiplier
        return out

    # -- checks and helpers ------------------------------------------------------------

    def dropout_stages(self) -> tuple[str, ...]:
        """The inner layer's stages (noise adds none)."""
        return self.inner.dropout_stages()

    def check(self, spec: UploadSpec) -> None:
        """Refuse fields that cannot get DP noise: unbounded ones (unless public) and, for
        sum-only layers, non-additive ones (unless public)."""
        unknown = set(self.public) - set(spec.names)
        if unknown:
            raise PrivacyError(f"{self.name}: public names unknown fields {sorted(unknown)}")
        for f in spec.fields:
            if f.name in self.public:
                continue
            if not f.additive and not self.allow_non_additive:
                raise InadmissibleField(
                    self.name, f.name,
                    "it is not additive, so the server would read it per client; a DP layer "
                    "noises sums only (declare it public to release it without DP)",
                )
            field_l2(spec, f.name, self.adjacency, self.name)  # raises if unbounded
        self._check_inner(spec)

    def _check_inner(self, spec: UploadSpec) -> None:
        self.inner.check(spec)

    def unnoised_fields(self, spec: UploadSpec) -> dict[str, str]:
        """The fields released without DP noise: those declared ``public`` (unless the
        inner layer noises them itself), with the reason."""
        noised = {f.name for f in self._noised(spec)}
        rest = [f.name for f in spec.fields if f.name not in noised]
        if not rest:
            return {}
        inner = self.inner.unnoised_fields(spec.subset(rest))
        return {n: f"declared public (public={list(self.public)}) in layer {self.name!r}"
                for n in rest if n in inner}

    def _noised(self, spec: UploadSpec) -> list[Field]:
        return [f for f in spec.fields if f.name not in self.public
                and (f.additive or self.allow_non_additive)]

    def _sigmas(self, spec: UploadSpec, noised: Sequence[Field]) -> dict[str, float]:
        """sigma_f = z sqrt(W / w_f) Delta_f (real units; sqrt(k) for k equal weights,
        :func:`~secagg.privacy.sensitivity.noise_split`)."""
        z, split = self.noise_multiplier, noise_split(noised)
        return {f.name: z * split[f.name] * field_l2(spec, f.name, self.adjacency, self.name)
                for f in noised}

    #: How the noise on a released sum grows with the cohort: "central" (added once),
    #: "local" (each client's: std grows with sqrt(cohort)).
    noise_scaling: ClassVar[str] = "central"

    def planned_sum_sigmas(self, spec: UploadSpec, cohort: int) -> dict[str, float]:
        """Per noised field, the standard deviation (real units, per entry) of the noise a
        release over ``cohort`` contributing clients adds to the sum: what the run's
        aggregate notes will report (the plan before round 0, ``secagg run --dry-run``)."""
        return self._sigmas(spec, self._noised(spec))

    def ledger(self, ctx: RoundContext) -> PrivacyLedger:
        """The ledger events go to: the run's (``ctx.privacy``) or the layer's own."""
        if ctx.privacy is not None:
            if not isinstance(ctx.privacy, PrivacyLedger):
                raise PrivacyError(f"ctx.privacy must be a PrivacyLedger, got {ctx.privacy!r}")
            return ctx.privacy
        if self._own_ledger is None:
            self._own_ledger = self.make_privacy_ledger()
        return self._own_ledger

    def mark_seeded(self, ledger: PrivacyLedger, fields: Sequence[str]) -> None:
        """With a user seed, mark ``fields`` as not private in ``ledger`` (their noise is
        reproducible by anyone who knows the seed); nothing otherwise."""
        if self.seed is not None:
            ledger.mark_not_private(
                f"{self.name}: noise seed fixed by the user (seed={self.seed})",
                fields=tuple(fields))

    def _source(self, ctx: RoundContext, party: Any, ledger: PrivacyLedger,
                fields: Sequence[str] = ()) -> NoiseSource:
        """The noise generator for ``party``'s noise on ``fields`` (:func:`noise_source`);
        with a user seed those fields are marked not private."""
        self.mark_seeded(ledger, fields)
        return noise_source(self.seed, ctx.round, ctx.phase, party)

    def node_params(self, noise_multiplier: float | None = None) -> dict[str, Any]:
        """What a client needs to add this layer's noise itself (JSON-able; see
        :func:`node_layer`): the noise multiplier (``noise_multiplier``, e.g. one calibrated
        for a phase, or the layer's), delta, adjacency, public fields and user seed."""
        z = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        return {"layer": self.name, "noise_multiplier": z, "delta": self.delta,
                "adjacency": self.adjacency, "public": list(self.public), "seed": self.seed}

    def begin(self, spec: UploadSpec, ctx: RoundContext) -> PrivacyLedger:
        """What every release starts with (the aggregator's side): check the spec, record
        the public fields in the transcript, and return the ledger the release is spent on.
        On the layer's own ledger (no run ledger) the public fields are marked as released
        without noise; in a federation the engine marks them (it knows which fields DP-SGD
        covers)."""
        self.check(spec)
        self._record_public(spec, ctx)
        ledger = self.ledger(ctx)
        if ctx.privacy is None:
            for name, why in self.unnoised_fields(spec).items():
                ledger.mark_unnoised(name, ctx.phase, why)
        return ledger

    def _record_public(self, spec: UploadSpec, ctx: RoundContext) -> None:
        """Say in the transcript which fields were released without DP noise."""
        for name in self.public:
            if name in spec.names:
                ctx.transcript.privacy(field=name, public=True, round=ctx.round,
                                       phase=ctx.phase, layer=self.name, private=False,
                                       reason=f"declared public in layer {self.name!r}",
                                       note="declared public: released without DP noise")

    def _notes(self, spec: UploadSpec, sigmas: Mapping[str, float], mechanism: str,
               private: bool, z: float | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "layer": self.name, "mechanism": mechanism, "adjacency": self.adjacency,
            "noise_multiplier": self.noise_multiplier if z is None else z,
            "private": private,
            "fields": {f: {"sigma": s, "noised": True} for f, s in sigmas.items()},
            "public": [f for f in self.public if f in spec.names],
            **extra,
        }


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

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """Run the inner layer, spend one Gaussian event, noise every non-public sum."""
        ledger = self.begin(spec, ctx)
        return self.release(self.inner.aggregate(uploads, spec, ctx), spec, ctx, ledger)

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


class LocalDP(_DPLayer):
    """Each client adds Gaussian noise to its own upload before it leaves (local DP).

    Every client's upload is by itself a Gaussian mechanism with multiplier z, so the
    guarantee holds even against a server that reads uploads individually; the sum carries
    n times the variance of :class:`CentralDP`. Non-additive fields may be noised too. The
    inner layer sees a spec whose bounds include the noise (a 2^-40 tail bound).
    """

    name: ClassVar[str] = "local-dp"
    holds_against: ClassVar[tuple[str, ...]] = (
        "observers of the releases", "a server that follows the protocol, which sees "
        "only noised uploads (it knows the cohort; no amplification is claimed); against "
        "a server that lies about the noise terms only where each client holds its own "
        "floor (a Flower node's NodePolicy; in one process the clients are this library's "
        "code)")
    allow_non_additive: ClassVar[bool] = True

    def _wide_spec(self, spec: UploadSpec, sigmas: Mapping[str, float]) -> UploadSpec:
        fields = []
        for f in spec.fields:
            if f.name in sigmas:
                base = spec.client_linf(f.name)
                tail = noise_tail(sigmas[f.name], f.size) + (0.5 if f.is_integer else 0.0)
                f = dataclasses.replace(f, bound=Bound(linf=base + tail, adjacency="client"))
            fields.append(f)
        return UploadSpec(tuple(fields), spec.max_records)

    def _check_inner(self, spec: UploadSpec) -> None:
        noised = self._noised(spec)
        if self.releases is None or not noised:
            self.inner.check(spec)
            return
        self.inner.check(self._wide_spec(spec, self._sigmas(spec, noised)))

    noise_scaling: ClassVar[str] = "local"

    def planned_sum_sigmas(self, spec: UploadSpec, cohort: int) -> dict[str, float]:
        """Each client's noise, summed over ``cohort`` clients: sigma sqrt(cohort)."""
        sigmas, _ = self.noise_plan(spec)
        return {f: s * math.sqrt(cohort) for f, s in sigmas.items()}

    def noise_plan(self, spec: UploadSpec) -> tuple[dict[str, float], UploadSpec]:
        """(sigma per noised field, the spec the inner layer carries: bounds widened by the
        noise's tail). Both sides compute it: a client to noise its upload, the aggregator
        to run the inner layer. No noised field: ({}, ``spec``)."""
        noised = self._noised(spec)
        if not noised:
            return {}, spec
        sigmas = self._sigmas(spec, noised)
        return sigmas, self._wide_spec(spec, sigmas)

    def noise_upload(self, up: Upload, spec: UploadSpec, sigmas: Mapping[str, float],
                     wide: UploadSpec, rng: np.random.Generator) -> Upload:
        """One client's noised upload (its side, before the upload leaves): Gaussian noise
        of ``sigmas`` on each noised field (rounded for integer fields), checked against
        the widened spec ``wide``."""
        values: dict[str, np.ndarray] = {}
        for f in spec.fields:
            v = np.asarray(up[f.name])
            if f.name in sigmas:
                v = v + gaussian(sigmas[f.name], f.shape, rng)
                v = np.rint(v).astype(np.int64) if f.is_integer else v.astype(f.dtype)
            values[f.name] = v
        nu = up.derive(values, wide)
        nu.cpu_s, nu.flops = up.cpu_s, up.flops
        return nu

    def spend(self, ledger: PrivacyLedger, sigmas: Mapping[str, float],
              ctx: RoundContext) -> None:
        """The aggregator's accounting of one release: one Gaussian event (every client's
        upload is by itself a Gaussian mechanism of multiplier z)."""
        ledger.spend(GaussianEvent(noise_multiplier=self.noise_multiplier, round=ctx.round,
                                   phase=ctx.phase, fields=tuple(sigmas), label=self.name))

    def release_notes(self, spec: UploadSpec, sigmas: Mapping[str, float], private: bool,
                      contributors: int) -> dict[str, Any]:
        """The aggregate's ``notes["dp"]`` for a release summed over ``contributors``."""
        return self._notes(spec, sigmas, "gaussian", private,
                           sum_sigma={f: s * math.sqrt(contributors) for f, s in sigmas.items()})

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """Spend one Gaussian event, noise each client's upload, run the inner layer."""
        ledger = self.begin(spec, ctx)
        sigmas, wide = self.noise_plan(spec)
        if not sigmas:
            return self.inner.aggregate(uploads, spec, ctx)
        self.spend(ledger, sigmas, ctx)
        private = [True]

        def noised(c: int, up: Upload) -> Upload:  # each upload noised as it is read
            src = self._source(ctx, c, ledger, tuple(sigmas))
            private[0] = private[0] and src.private
            return self.noise_upload(up, spec, sigmas, wide, src.rng)

        agg = self.inner.aggregate(Lazy(uploads, noised), wide, relabel(ctx, list(sigmas)))
        agg.notes["dp"] = self.release_notes(spec, sigmas, private[0], len(agg.contributors))
        return agg


@dataclasses.dataclass(frozen=True)
class DistributedRelease:
    """How one distributed-DP release is encoded and noised (:meth:`DistributedDP.release_plan`).

    Attributes:
        additive: the summed fields, in vector order (noised integer fields as float64).
        integer: names of the fields that are integers in the spec (rounded back).
        noised: the summed fields that get noise (the non-public ones).
        worst: the fewest survivors the secure sum accepts; each share is sized for them.
        scales: fixed-point scale bits per field, before the noise's headroom.
        z: the noise multiplier (calibrated for the integer mechanism at ``worst``).
        share_std: per noised field, one client's noise standard deviation (integer units).
        plans: per field, the fixed-point plan with room for the noise.
        ring_bits: the ring Z_2^k the vectors are summed in (whole bytes).
        planned: the privacy events of the worst case (checked before any noise is added).
    """

    additive: tuple[Field, ...]
    integer: frozenset[str]
    noised: tuple[Field, ...]
    worst: int
    scales: dict[str, int]
    z: float
    share_std: dict[str, float]
    plans: dict[str, FixedPoint]
    ring_bits: int
    planned: tuple[PrivacyEvent, ...]

    @property
    def label(self) -> str:
        """The name the concatenated vector is transcripted under."""
        return "+".join(f.name for f in self.additive) + " (dp-noised)"

    @property
    def segments(self) -> dict[str, slice]:
        """Each summed field's slice of the vector."""
        out, off = {}, 0
        for f in self.additive:
            out[f.name] = slice(off, off + f.size)
            off += f.size
        return out


class DistributedDP(_DPLayer):
    """Distributed DP under secure summation: integer noise shares added before masking.

    Args (besides those of the module docstring):
        inner: a ``SecureSum`` layer (anything with ``sum_encoded(vectors, ring_bits, ctx,
            label) -> (ring_sum, contributors)`` and a ``threshold``).
        mechanism: ``"discrete_gaussian"`` (default) or ``"skellam"``.
        precision: fixed-point quantisation step for float fields.

    Each of the n clients adds noise of standard deviation sigma_f / sqrt(t) (integer units)
    where t is the fewest contributors the secure sum accepts, so any t' >= t survivors
    carry total noise sigma_f sqrt(t'/t) >= sigma_f. The integer sensitivity accounts for
    rounding: Delta_int = Delta 2^s + sqrt(d) for float fields. The ledger records the
    noise of the actual contributors (discrete Gaussian: Kairouz-Liu-Steinke bound for a sum
    of t' shares; Skellam: total variance t' v).
    """

    name: ClassVar[str] = "distributed-dp"
    holds_against: ClassVar[tuple[str, ...]] = (
        "observers of the releases", "a server that follows the protocol, which sees "
        "only the noised sum (it knows the cohort; no amplification is claimed), as long "
        "as no more clients collude with it than the secure sum's threshold tolerates; "
        "against a server that lies about the cohort only where the nodes pin identities "
        "or add their whole noise alone (docs/PRIVACY.md)")

    def __init__(self, inner: Layer, *, mechanism: Literal["discrete_gaussian", "skellam"] =
                 "discrete_gaussian", precision: float = 1e-6, **kwargs: Any) -> None:
        if mechanism not in ("discrete_gaussian", "skellam"):
            raise PrivacyError(f"mechanism must be 'discrete_gaussian' or 'skellam', got "
                               f"{mechanism!r}")
        if not callable(getattr(inner, "sum_encoded", None)):
            raise PrivacyError(
                "DistributedDP needs a SecureSum inner layer (with sum_encoded); got "
                f"{type(inner).__name__}"
            )
        if not (isinstance(precision, (int, float)) and 0 < precision < 1):
            raise PrivacyError(f"precision must be in (0, 1), got {precision!r}")
        self.mechanism = mechanism
        self.precision = float(precision)
        super().__init__(inner, **kwargs)
        self._cal: dict[tuple[Any, ...], float] = {}

    def describe(self) -> dict[str, Any]:
        """Parameters, including the integer mechanism."""
        out = super().describe()
        out.update(mechanism=self.mechanism, precision=self.precision)
        return out

    def _event_factory(self) -> Any:
        # Planning-level accounting (used for epsilon <-> z before the spec is known): the
        # release is one Gaussian of multiplier z; the integer mechanisms are accounted
        # exactly in aggregate() (they converge to it for the large noise used here).
        return lambda z: GaussianEvent(noise_multiplier=z)

    def _check_inner(self, spec: UploadSpec) -> None:
        self.inner.check(spec)

    def min_survivors(self, n: int) -> int:
        """Fewest contributors the inner secure sum returns a result for."""
        fn = getattr(self.inner, "min_survivors", None)
        if callable(fn):
            return int(fn(n))
        from secagg.secure_sum.graph import resolve_threshold

        return int(resolve_threshold(self.inner.threshold, n))  # type: ignore[attr-defined]

    def _events(self, z: float, spec: UploadSpec, noised: Sequence[Field],
                scales: Mapping[str, int], shares: int, worst: int,
                ctx: RoundContext | None = None) -> list[PrivacyEvent]:
        """The release's events when ``shares`` clients each added the shares sized for
        ``worst`` survivors at multiplier z."""
        out: list[PrivacyEvent] = []
        where = {} if ctx is None else {"round": ctx.round, "phase": ctx.phase}
        stds = self._share_stds(z, spec, noised, scales, worst)
        for f in noised:
            d2 = self._int_l2(spec, f, scales[f.name])
            sigma_share = stds[f.name]
            if self.mechanism == "discrete_gaussian":
                out.append(DiscreteGaussianEvent(
                    l2_sensitivity=d2, sigma_share=sigma_share, n_shares=shares,
                    dimension=max(f.size, 1), fields=(f.name,), label=self.name, **where))
            else:
                d1 = self._int_l1(spec, f, scales[f.name])
                out.append(SkellamEvent(
                    l2_sensitivity=d2, l1_sensitivity=d1,
                    variance=shares * sigma_share ** 2, dimension=max(f.size, 1),
                    fields=(f.name,), label=self.name,
                    **where))
        return out

    def _share_stds(self, z: float, spec: UploadSpec, noised: Sequence[Field],
                    scales: Mapping[str, int], worst: int) -> dict[str, float]:
        """Per-client noise std (integer units): z sqrt(W / w_f) Delta_int / sqrt(worst)
        (sqrt(k) for k equal weights), and at least 1/2 for the discrete Gaussian (its
        published bound needs it; more noise only helps privacy)."""
        split = noise_split(noised)
        floor = 0.5 if self.mechanism == "discrete_gaussian" else 0.0
        return {f.name: max(floor, z * split[f.name] * self._int_l2(spec, f, scales[f.name])
                            / math.sqrt(worst)) for f in noised}

    def _int_l2(self, spec: UploadSpec, f: Field, scale_bits: int) -> float:
        base = field_l2(spec, f.name, self.adjacency, self.name) * 2.0 ** scale_bits
        return base if f.is_integer else base + math.sqrt(f.size)

    def _int_l1(self, spec: UploadSpec, f: Field, scale_bits: int) -> float:
        base = field_l1(spec, f.name, self.adjacency, self.name) * 2.0 ** scale_bits
        return base if f.is_integer else base + f.size

    def _calibrated(self, spec: UploadSpec, noised: Sequence[Field], scales: Mapping[str, int],
                    worst: int) -> float:
        """z for the integer mechanism at ``worst`` survivors (exact RDP accounting)."""
        if self._z_given:
            return self.noise_multiplier
        key = (tuple((f.name, f.size, scales[f.name]) for f in noised), worst,
               self._n_releases())
        if key not in self._cal:
            self._cal[key] = calibrate(
                self.epsilon, self.delta, rounds=self._n_releases(), prior=self.prior(),
                event=lambda z: self._events(z, spec, noised, scales, worst, worst))
        return self._cal[key]

    def node_params(self, noise_multiplier: float | None = None) -> dict[str, Any]:
        """As :meth:`_DPLayer.node_params`, with the integer mechanism and precision."""
        return {**super().node_params(noise_multiplier), "mechanism": self.mechanism,
                "precision": self.precision}

    def planned_sum_sigmas(self, spec: UploadSpec, cohort: int) -> dict[str, float]:
        """The noise shares of ``cohort`` clients on the decoded sum (every one of them
        contributing; fewer survivors add less, as the run's notes then report)."""
        release = self.release_plan(spec, cohort)
        return {f.name: release.share_std[f.name] * math.sqrt(cohort)
                / 2.0 ** release.scales[f.name] for f in release.noised}

    def release_plan(self, spec: UploadSpec, n: int,
                     share_survivors: int | None = None) -> DistributedRelease:
        """How a cohort of ``n`` encodes and noises one release (a pure function of the
        spec, n and this layer's parameters, so each client computes the aggregator's plan
        itself): the summed fields, fixed-point scales, z (for the integer mechanism at the
        fewest survivors the secure sum accepts), each client's noise std, the plans with
        room for the noise, the ring, and the events of the worst case.

        ``share_survivors``: size each share for this many survivors instead (a node that
        cannot check the server's cohort passes 1: its own share then carries the whole
        noise; the ring is sized for every client doing so)."""
        # Noised integer fields (counts) travel as fixed point too: with scale 2^s their
        # sensitivity, hence the per-share noise, is large, which keeps the discrete
        # Gaussian sum bound tight (tau ~ 0); the noised sum is rounded back (post-processing).
        additive = tuple(dataclasses.replace(f, dtype="float64")
                         if f.is_integer and f.name not in self.public else f
                         for f in spec.additive)
        integer = frozenset(f.name for f in spec.additive if f.is_integer)
        noised = tuple(f for f in additive if f.name not in self.public)
        worst = max(1, min(self.min_survivors(n), n))
        if share_survivors is not None:
            worst = max(1, min(int(share_survivors), worst))
        sub = UploadSpec(additive, spec.max_records)
        base = plan(sub, n, self.precision, 64)
        scales = {name: fp.scale_bits for name, fp in base.items()}
        z = self._calibrated(spec, noised, scales, worst) if noised else 0.0
        planned = tuple(self._events(z, spec, noised, scales, worst, worst) if noised else [])
        share_std = self._share_stds(z, spec, noised, scales, worst) if noised else {}
        extra = {f.name: noise_tail(share_std[f.name] * math.sqrt(n), f.size, self.mechanism)
                 / 2.0 ** scales[f.name] for f in noised}
        plans64 = plan(sub, n, self.precision, 64, extra_bound=extra)
        ring_bits = min(64, 8 * math.ceil(plan_ring_bits(plans64) / 8))  # whole bytes
        plans = plan(sub, n, self.precision, ring_bits, extra_bound=extra)
        return DistributedRelease(additive, integer, noised, worst, scales, z, share_std,
                                  plans, ring_bits, planned)

    def encode_noised(self, release: DistributedRelease, upload: Upload,
                      rng: np.random.Generator) -> np.ndarray:
        """One client's ring vector (its side, before masking): each summed field encoded
        with the release's plan, plus this client's noise share on the noised fields."""
        mask = np.uint64((1 << release.ring_bits) - 1) if release.ring_bits < 64 \
            else np.uint64(2**64 - 1)
        parts = []
        for f in release.additive:
            enc = release.plans[f.name].encode(np.asarray(upload[f.name]))
            if f.name in release.share_std:
                noise = self._draw(release.share_std[f.name], f.size, rng)
                enc = (enc + noise.view(np.uint64)) & mask
            parts.append(enc)
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    def finish(self, release: DistributedRelease, spec: UploadSpec, ring_sum: np.ndarray,
               contributors: Sequence[int], ctx: RoundContext, ledger: PrivacyLedger,
               private: bool) -> Aggregate:
        """The aggregator's side after the secure sum: spend the events of the noise the
        ``contributors`` actually added (fewer survivors, less noise), decode the noised
        sums, and return the aggregate with its ``notes["dp"]``."""
        contributors = tuple(sorted(int(c) for c in contributors))
        z, scales, share_std = release.z, release.scales, release.share_std
        noised, worst = release.noised, release.worst
        achieved = self._events(z, spec, noised, scales, len(contributors), worst, ctx)
        ledger.spend(*achieved)  # what actually happened: fewer survivors, less noise
        sums = _split_decode(np.asarray(ring_sum, dtype=np.uint64), release.additive,
                             release.plans)
        for name in release.integer:
            sums[name] = np.rint(sums[name]).astype(np.int64)
        for f in noised:
            ctx.observe(SERVER, SERVER, "dp-sum", f.name, "noised", sums[f.name], what="sum")
        real = {f.name: share_std[f.name] * math.sqrt(len(contributors))
                / 2.0 ** scales[f.name] for f in noised}
        target = {f.name: share_std[f.name] * math.sqrt(worst) / 2.0 ** scales[f.name]
                  for f in noised}
        notes = self._notes(spec, real, self.mechanism, private, z=z,
                            target_sigma=target, survivors=len(contributors),
                            min_survivors=worst, ring_bits=release.ring_bits,
                            scale_bits=dict(scales), tail_probability=TAIL_PROBABILITY)
        return Aggregate(ctx.phase, ctx.round, sums, {}, contributors, {"dp": notes})

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """Encode, add noise shares, secure-sum, account the achieved noise, decode."""
        ledger = self.begin(spec, ctx)
        clients = sorted(uploads)
        release = self.release_plan(spec, len(clients))
        ledger.check(*release.planned)  # the worst case fits the budget, before any noise
        names = [f.name for f in release.noised]
        private = [True]

        def encoded(c: int, up: Upload) -> np.ndarray:  # noised and encoded as it is read
            src = self._source(ctx, c, ledger, names)
            private[0] = private[0] and src.private
            return self.encode_noised(release, up, src.rng)

        # each client's step (and its encoding and noise draw) is booked on its masked-input
        # row, as under every other layer
        vectors = Booked(uploads, encoded)
        label = release.label
        # The secure sum transcripts the ring sum under ``label``; it carries the noise.
        ring_sum, contributors = self.inner.sum_encoded(  # type: ignore[attr-defined]
            vectors, release.ring_bits, relabel(ctx, [label] if names else []), label,
            upload_costs=vectors.costs, length=sum(f.size for f in release.additive))
        return self.finish(release, spec, ring_sum, contributors, ctx, ledger, private[0])

    def _draw(self, std: float, size: int, rng: np.random.Generator) -> np.ndarray:
        if self.mechanism == "discrete_gaussian":
            return discrete_gaussian(std, size, rng)
        return skellam(std * std / 2.0, size, rng)


def _split_decode(ring_sum: np.ndarray, fields: Sequence[Field],
                  plans: Mapping[str, FixedPoint]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    pos = 0
    for f in fields:
        part = ring_sum[pos:pos + f.size]
        pos += f.size
        out[f.name] = plans[f.name].decode_sum(part).reshape(f.shape)
    if pos != ring_sum.size:
        raise PrivacyError(f"secure sum returned {ring_sum.size} entries, expected {pos}")
    return out


def node_layer(params: Mapping[str, Any], inner: Layer) -> LocalDP | DistributedDP:
    """The noise side of a DP layer, rebuilt on a client from :meth:`_DPLayer.node_params`
    (a runtime whose clients run elsewhere sends those; ``inner`` is the client's copy of
    the inner layer). Only the layers whose clients add noise can be rebuilt: ``local-dp``
    and ``distributed-dp``.

    Raises:
        PrivacyError: an unknown layer, or a parameter of the wrong type or out of range
            (a client never noises with parameters it cannot check).
    """
    if not isinstance(params, Mapping):
        raise PrivacyError(f"DP parameters must be a mapping, got {type(params).__name__}")
    kinds: dict[str, type[LocalDP] | type[DistributedDP]] = {
        LocalDP.name: LocalDP, DistributedDP.name: DistributedDP}
    kind = kinds.get(params.get("layer"))  # type: ignore[arg-type]
    if kind is None:
        raise PrivacyError(f"a client adds noise for {sorted(kinds)} only, got "
                           f"{params.get('layer')!r}")
    known = {"layer", "noise_multiplier", "delta", "adjacency", "public", "seed"}
    if kind is DistributedDP:
        known |= {"mechanism", "precision"}
    if set(params) - known:
        raise PrivacyError(f"unknown DP parameters {sorted(set(params) - known)}")
    public = params.get("public", [])
    seed = params.get("seed")
    if not isinstance(public, list) or (seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int))):
        raise PrivacyError("DP parameters: public must be a list of names, seed an int or None")
    extra: dict[str, Any] = {}
    if kind is DistributedDP:
        extra = {"mechanism": params.get("mechanism"), "precision": params.get("precision")}
    return kind(inner, noise_multiplier=params.get("noise_multiplier"),
                delta=params.get("delta"), adjacency=params.get("adjacency"),
                public=tuple(public), seed=seed, **extra)
