"""DistributedDP: around a secure sum, each client adds a share of integer noise (discrete
Gaussian or Skellam) to its fixed-point-encoded vector before masking, sized so that the
survivors' total reaches the target even when as many clients drop as the secure sum's
threshold allows; the noise the contributors actually added is what the ledger records."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from secagg.costs import SERVER
from secagg.encoding import FixedPoint, plan, plan_ring_bits
from secagg.errors import PrivacyError, ProtocolError
from secagg.layers.base import (
    Aggregate,
    Layer,
    NodePart,
    RingEncoding,
    RoundContext,
    ServerPart,
)
from secagg.messages import Field, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import calibrate
from secagg.privacy.dp_base import _DPLayer, _DPPart, relabel
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    PrivacyEvent,
    SkellamEvent,
)
from secagg.privacy.noise import TAIL_PROBABILITY, noise_source, noise_tail
from secagg.privacy.samplers import (
    discrete_gaussian,
    skellam,
)
from secagg.privacy.sensitivity import field_l1, field_l2, noise_split
from secagg.secure_sum.parties import Deferred


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
    needs_encoded_sum: ClassVar[bool] = True
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

    def encode(self, release: DistributedRelease, upload: Upload) -> np.ndarray:
        """One client's ring vector before its noise: each summed field encoded with the
        release's plan."""
        parts = [release.plans[f.name].encode(np.asarray(upload[f.name]))
                 for f in release.additive]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    def shares(self, release: DistributedRelease) -> tuple[tuple[int, int, float], ...]:
        """(start, stop, noise std) of each noised field's slice of the vector, in vector
        order (the order a client draws its shares in)."""
        seg = release.segments
        return tuple((seg[f.name].start, seg[f.name].stop, release.share_std[f.name])
                     for f in release.additive if f.name in release.share_std)

    def encode_noised(self, release: DistributedRelease, upload: Upload,
                      rng: np.random.Generator) -> np.ndarray:
        """One client's ring vector (its side, before masking): each summed field encoded
        with the release's plan, plus this client's noise share on the noised fields."""
        return add_shares(self.encode(release, upload), self.shares(release), self._draw,
                          release.ring_bits, rng)

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

    def server_part(self, spec: UploadSpec, ctx: RoundContext, n: int) -> ServerPart:
        """Begin a release by ``n`` clients: plan it (:meth:`release_plan`), check its worst
        case against the budget; the clients encode and noise their vectors, the inner secure
        sum adds them, the part's finish accounts the noise the contributors added and
        decodes (:meth:`finish`)."""
        return _DistributedPart(self, spec, ctx, n)

    def node_part(self, rng: np.random.Generator, *, sizing: str = "server") -> NodePart:
        """The client's side: encode its upload with the release plan and add its noise
        share, sized as ``sizing`` says (:meth:`node_release`)."""
        return _DistributedNoise(self, rng, sizing)

    def node_release(self, spec: UploadSpec, n: int,
                     sizing: str = "server") -> tuple[DistributedRelease, int]:
        """(the release plan for a cohort of ``n`` as a node noises it, the fewest survivors
        the server's plan sizes shares for): the server's plan (its scales and ring, which
        the server decodes with), with each share sized as the node's ``sizing`` says
        (``"alone"``: for one survivor, so this node's share carries the whole noise; refused
        when the server's ring has no room for it).

        Raises:
            ProtocolError: ``"alone"`` needs a wider ring than the release's.
        """
        release = self.release_plan(spec, n)
        if sizing != "alone":
            return release, int(release.worst)
        alone = self.release_plan(spec, n, 1)
        if alone.ring_bits > release.ring_bits or alone.scales != release.scales:
            raise ProtocolError(
                f"this node adds its whole noise itself (dp-noise-alone), which needs a "
                f"{alone.ring_bits}-bit ring; the release's ring has {release.ring_bits} "
                "bits: refused rather than noise less or overflow the sum")
        return dataclasses.replace(release, share_std=dict(alone.share_std), worst=1,
                                   planned=alone.planned), int(release.worst)

    def _draw(self, std: float, size: int, rng: np.random.Generator) -> np.ndarray:
        return _draw(self.mechanism, std, size, rng)


def _draw(mechanism: str, std: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` integer noise values of standard deviation ``std`` (int64)."""
    if mechanism == "discrete_gaussian":
        return discrete_gaussian(std, size, rng)
    return skellam(std * std / 2.0, size, rng)


def add_shares(vector: np.ndarray, shares: Sequence[tuple[int, int, float]],
               draw: Callable[[float, int, np.random.Generator], np.ndarray], ring_bits: int,
               rng: np.random.Generator) -> np.ndarray:
    """``vector`` (ring elements) with a noise share ``draw(std, size, rng)`` added modulo
    2^ring_bits to each (start, stop, std) slice, drawn in that order."""
    mask = np.uint64((1 << ring_bits) - 1) if ring_bits < 64 else np.uint64(2**64 - 1)
    out = np.array(vector, dtype=np.uint64, copy=True)
    for start, stop, std in shares:
        noise = draw(std, stop - start, rng)
        out[start:stop] = (out[start:stop] + noise.view(np.uint64)) & mask
    return out


def noised_in_client(vector: np.ndarray, shares: Sequence[tuple[int, int, float]],
                     mechanism: str, ring_bits: int, seed: int | None, round: int, phase: str,
                     client: int) -> np.ndarray:
    """What a simulated client's own process does to its encoded vector (run there as a
    :class:`~secagg.secure_sum.parties.Deferred`): draw its noise shares from its own stream
    (:func:`~secagg.privacy.noise.noise_source`: fresh OS randomness, or with a user seed
    the stream derived from (seed, round, phase, client), the same in any process) and add
    them (:func:`add_shares`)."""
    rng = noise_source(seed, round, phase, client).rng

    def draw(std: float, size: int, gen: np.random.Generator) -> np.ndarray:
        return _draw(mechanism, std, size, gen)

    return add_shares(vector, shares, draw, ring_bits, rng)


_CLIENT_SIDE = ("encode", "shares", "encode_noised", "_draw")


def _as_declared(layer: DistributedDP) -> bool:
    """True when ``layer``'s client side is :class:`DistributedDP`'s own (no subclass or
    instance overrides :data:`_CLIENT_SIDE`), so :func:`noised_in_client` computes exactly
    its ``encode_noised`` in any process."""
    return all(getattr(type(layer), name) is getattr(DistributedDP, name)
               for name in _CLIENT_SIDE) and not set(_CLIENT_SIDE) & set(vars(layer))


class _DistributedPart(_DPPart):
    """DistributedDP's server part: the plan, its worst case checked against the budget;
    the clients' ring vectors (noise shares added) are summed by the inner secure sum, and
    :meth:`finish` accounts the noise the contributors added and decodes."""

    def __init__(self, layer: DistributedDP, spec: UploadSpec, ctx: RoundContext,
                 n: int) -> None:
        super().__init__(layer, spec, ctx)
        self.plan = plan_ = layer.release_plan(spec, n)
        self.ledger.check(*plan_.planned)  # the worst case fits, before any noise
        self.names = [f.name for f in plan_.noised]
        self.encoding = RingEncoding(plan_.ring_bits, plan_.segments,
                                     {f.name: f.nbytes for f in plan_.additive}, plan_.label)
        # in one process the secure sum transcripts the whole vector under its label
        self._local = relabel(ctx, [plan_.label] if self.names else [])
        if self.names:
            self.node_params = json.dumps(layer.node_params(plan_.z))
            self._noised(self.names)

    @property
    def local_ctx(self) -> RoundContext:
        """The context relabelling the vector's label (it carries the noise)."""
        return self._local

    def client_vector(self, client: int, up: Upload) -> Deferred | np.ndarray:
        """The client's encoded vector, its noise share to be drawn from its own noise
        stream and added where the client runs (:func:`noised_in_client`): in the secure
        sum's worker that holds the client, so the cohort's noise is drawn on every core. A
        layer whose client side is overridden (a subclass, an audit's injected bug) runs its
        own ``encode_noised`` here instead, as it is."""
        layer = self.layer
        if not _as_declared(layer):
            src = layer._source(self.ctx, client, self.ledger, self.names)
            return layer.encode_noised(self.plan, up, src.rng)
        layer.mark_seeded(self.ledger, self.names)
        return Deferred(noised_in_client, (
            layer.encode(self.plan, up), layer.shares(self.plan), layer.mechanism,
            self.plan.ring_bits, layer.seed, int(self.ctx.round), str(self.ctx.phase),
            int(client)))

    def finish(self, ring_sum: np.ndarray, contributors: Sequence[int],
               ctx: RoundContext) -> Aggregate:
        """Account the contributors' noise and decode (:meth:`DistributedDP.finish`)."""
        return self.layer.finish(self.plan, self.spec, ring_sum, contributors, ctx,
                                 self.ledger, self.layer.seed is None)


class _DistributedNoise(NodePart):
    """DistributedDP's node part: the release plan derived on the node, the upload encoded
    with it and this node's noise share added."""

    def __init__(self, layer: DistributedDP, rng: np.random.Generator, sizing: str) -> None:
        self.layer, self.rng, self.sizing = layer, rng, sizing
        self.name = layer.name
        self.noise_multiplier = float(layer.noise_multiplier)
        self.seeded = layer.seed is not None

    def encode(self, up: Upload, spec: UploadSpec, n: int) -> tuple[np.ndarray, int, int]:
        """(the noised ring vector, its ring bits, the survivors the server's plan sizes
        shares for)."""
        release, planned = self.layer.node_release(spec, n, self.sizing)
        return self.layer.encode_noised(release, up, self.rng), release.ring_bits, planned


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
