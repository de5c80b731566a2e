"""The DP layers' common base: parameters, calibration, the ledger, checks, and the one
in-process release (:meth:`_DPLayer.aggregate`: the layer's server part begins it, the inner
layer carries it, the server part ends it).

Each DP layer (:mod:`secagg.privacy.central`, :mod:`secagg.privacy.local`,
:mod:`secagg.privacy.distributed`) declares its own server part
(:meth:`~secagg.layers.base.Layer.server_part`, a :class:`_DPPart`) and node part
(:meth:`_DPLayer.node_part`); see :mod:`secagg.privacy.layers` for the noise calibration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from secagg.errors import InadmissibleField, PrivacyError
from secagg.layers.base import (
    Aggregate,
    Layer,
    NodePart,
    RoundContext,
    ServerPart,
)
from secagg.messages import Field, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import calibrate, delta_for, epsilon_for
from secagg.privacy.events import (
    GaussianEvent,
    PrivacyEvent,
)
from secagg.privacy.noise import noise_source
from secagg.privacy.samplers import (
    NoiseSource,
    noise_generator,
)
from secagg.privacy.sensitivity import field_l2, noise_split
from secagg.stages import Stage
from secagg.stream import Booked, Lazy

DEFAULT_DELTA = 1e-5

class _RelabelContext(RoundContext):
    """A RoundContext whose observations of noised fields are recorded as ``"noised"``."""

    _noised: frozenset[str] = frozenset()

    def observe(self, party: str, sender: Any, stage: str, field: str, form: str,
                value: Any, what: str = Stage.UPLOAD, nbytes: int | None = None,
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
    is_dp: ClassVar[bool] = True

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
    def wrapped(self) -> Layer:
        """The inner layer."""
        return self.inner

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

    # -- the release, in parts ----------------------------------------------------------

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """One release in one process, as every runtime runs it: this layer's server part
        begins it (:meth:`server_part`), the inner layer carries the uploads (each through
        its client's node part) or sums the vectors the clients encoded, the server part
        ends it."""
        part = self.server_part(spec, ctx, len(uploads))
        enc = part.encoding
        if enc is None:
            carried: Mapping[int, Upload] = uploads
            if part.node_params is not None:  # each client's node part, as a node runs it
                carried = Lazy(uploads, lambda c, up: self.node_part(noise_source(
                    self.seed, ctx.round, ctx.phase, c).rng).prepare(up, spec)[0])
            agg = self.inner.aggregate(carried, part.carried, part.local_ctx)
        else:
            # each client's step (and its encoding and noise draw) is booked on its
            # masked-input row, as under every other layer
            vectors = Booked(uploads, part.client_vector)
            ring_sum, contributors = self.inner.sum_encoded(  # type: ignore[attr-defined]
                vectors, enc.ring_bits, part.local_ctx, enc.label,
                upload_costs=vectors.costs, length=enc.length, fields=dict(enc.nbytes))
            agg = part.finish(ring_sum, contributors, ctx)
            # the session's notes (secure_sum, dropped), as the one driver gives them on
            # every runtime
            agg.notes.update(self.inner.last_report.notes)  # type: ignore[attr-defined]
        return part.end(agg, ctx)

    def node_part(self, rng: np.random.Generator, *, sizing: str = "server") -> NodePart:
        """What a client does before its upload leaves (rebuilt on a node by
        :func:`node_layer`), drawing its noise from ``rng``; ``sizing`` is how a node sizes
        a noise share (DistributedDP). The default: a layer whose clients add no noise."""
        raise PrivacyError(f"{self.name}: the clients add no noise under this layer")

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


class _DPPart(ServerPart):
    """A DP layer's server part: begun with :meth:`_DPLayer.begin` (the ledger it spends on)."""

    def __init__(self, layer: Any, spec: UploadSpec, ctx: RoundContext) -> None:
        super().__init__(spec, ctx)
        self.layer = layer
        self.ledger: PrivacyLedger = layer.begin(spec, ctx)

    def _noised(self, names: Sequence[str]) -> None:
        """The nodes add noise to ``names``: marked if seeded, relabelled for the inner."""
        self.layer.mark_seeded(self.ledger, names)
        self.ctx = relabel(self.ctx, names)
