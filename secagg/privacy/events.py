"""Immutable privacy events: one per DP release, composed by :class:`PrivacyLedger`.

Each event names the mechanism and its parameters, where it happened (round, phase, the
fields it covers) and how many times it was applied (``count``). It converts itself to a
``dp_accounting`` event so that the composition is done by Google's maintained accountant:

============================  ==========================================  ==========
event                         dp_accounting form                          accountant
============================  ==========================================  ==========
:class:`GaussianEvent`        ``GaussianDpEvent(z)``                      PLD (tight)
:class:`SampledGaussianEvent` ``PoissonSampledDpEvent(q, Gaussian(z))``   PLD (tight)
:class:`DiscreteGaussianEvent` sum of n discrete Gaussians: its rounded-  PLD (tight)
                              Gaussian reference (secagg.privacy.pld)
                              where the noise is large, else the RDP      else RDP
                              bound of Kairouz, Liu, Steinke (ICML 2021,
                              Thm 1 / Prop 14); n = 1 is the zCDP bound
                              of Canonne, Kamath, Steinke (2020)
:class:`SkellamEvent`         the same reference (needs ``dimension``),   PLD (tight)
                              else the RDP bound of Agarwal, Kairouz,     else RDP
                              Liu (NeurIPS 2021, multi-dim. Skellam)
:class:`NonPrivateEvent`      ``NonPrivateDpEvent`` (epsilon = inf)        both
============================  ==========================================  ==========

The noise multiplier z of a Gaussian event is sigma / (L2 sensitivity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import attr
import dp_accounting
from dp_accounting import dp_event

from secagg.errors import PrivacyError

__all__ = [
    "DiscreteGaussianEvent",
    "DistributedDiscreteGaussianDpEvent",
    "GaussianEvent",
    "NonPrivateEvent",
    "PrivacyEvent",
    "SampledGaussianEvent",
    "SkellamDpEvent",
    "SkellamEvent",
]


# dp_accounting has no event for these two mechanisms; the RDP accountant subclass in
# secagg.privacy.accountant composes them with the published bounds.
@attr.s(frozen=True, slots=True, auto_attribs=True)
class DistributedDiscreteGaussianDpEvent(dp_event.DpEvent):
    """Sum of ``n_shares`` independent N_Z(0, sigma_share^2) vectors of ``dimension`` entries
    added to an integer query of L2 sensitivity ``l2_sensitivity`` (integer units)."""

    l2_sensitivity: float
    sigma_share: float
    n_shares: int
    dimension: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SkellamDpEvent(dp_event.DpEvent):
    """Symmetric Skellam noise of total ``variance`` on an integer query with L2 and L1
    sensitivities ``l2_sensitivity`` and ``l1_sensitivity`` (integer units), of
    ``dimension`` entries (None: not known, so only the RDP bound applies)."""

    l2_sensitivity: float
    l1_sensitivity: float
    variance: float
    dimension: int | None = None


def _positive(name: str, v: float, allow_zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v >= 0 if allow_zero else v > 0)
    if not ok:
        raise PrivacyError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'}"
                           f" number, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """One DP release (or ``count`` identical ones).

    Attributes:
        label: free text (e.g. "CentralDP sum").
        round: the round of the release, if any.
        phase: the phase of the release, if any.
        fields: the fields the release covers.
        count: how many times this mechanism was applied (self-composition).
        not_private_reason: non-empty when the release's randomness was not secret (e.g. a
            noise seed fixed by the user): the mechanism is accounted as usual, but a ledger
            that records the event marks the run (its ``fields``, or all when empty) not
            private with this reason.
    """

    label: str = ""
    round: int | None = None
    phase: str | None = None
    fields: tuple[str, ...] = ()
    count: int = 1
    not_private_reason: str = ""

    mechanism: ClassVar[str] = "event"
    pld_supported: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise PrivacyError(f"event count must be a positive integer, got {self.count!r}")
        if not isinstance(self.not_private_reason, str):
            raise PrivacyError(f"not_private_reason must be a string, got "
                               f"{self.not_private_reason!r}")

    def dp_event(self) -> dp_event.DpEvent:
        """The dp_accounting event for ONE application (``count`` is applied by the ledger)."""
        raise PrivacyError(f"{type(self).__name__} cannot be bounded by any accountant")

    def key(self) -> tuple[Any, ...]:
        """The mechanism parameters only: events with equal keys compose by counting."""
        return (type(self).__name__, self.dp_event())

    def describe(self) -> dict[str, Any]:
        """JSON-able description of the event."""
        out: dict[str, Any] = {"mechanism": self.mechanism}
        for k, v in self.__dict__.items():
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True, kw_only=True)
class GaussianEvent(PrivacyEvent):
    """Gaussian mechanism with noise multiplier z = sigma / L2 sensitivity."""

    noise_multiplier: float
    mechanism: ClassVar[str] = "gaussian"
    pld_supported: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("noise_multiplier", self.noise_multiplier)

    def dp_event(self) -> dp_event.DpEvent:
        """``GaussianDpEvent(noise_multiplier)``."""
        return dp_accounting.GaussianDpEvent(float(self.noise_multiplier))


@dataclass(frozen=True, kw_only=True)
class SampledGaussianEvent(PrivacyEvent):
    """``steps`` applications of a Poisson-subsampled Gaussian (DP-SGD): sampling rate q,
    noise multiplier z. ``count`` further repeats the whole block."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    mechanism: ClassVar[str] = "sampled_gaussian"
    pld_supported: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("noise_multiplier", self.noise_multiplier)
        q = self.sampling_rate
        if not (isinstance(q, (int, float)) and 0 < q <= 1):
            raise PrivacyError(f"sampling_rate must be in (0, 1], got {q!r}")
        if not isinstance(self.steps, int) or self.steps < 0:
            raise PrivacyError(f"steps must be a non-negative integer, got {self.steps!r}")

    def dp_event(self) -> dp_event.DpEvent:
        """``SelfComposed(PoissonSampled(q, Gaussian(z)), steps)``."""
        inner = dp_accounting.PoissonSampledDpEvent(
            float(self.sampling_rate), dp_accounting.GaussianDpEvent(float(self.noise_multiplier))
        )
        return dp_accounting.SelfComposedDpEvent(inner, int(self.steps))


@dataclass(frozen=True, kw_only=True)
class DiscreteGaussianEvent(PrivacyEvent):
    """Sum of ``n_shares`` independent discrete Gaussians N_Z(0, sigma_share^2) per entry,
    added to an integer query of ``dimension`` entries and L2 sensitivity
    ``l2_sensitivity`` (integer units). ``n_shares = 1`` is the plain discrete Gaussian."""

    l2_sensitivity: float
    sigma_share: float
    n_shares: int = 1
    dimension: int = 1
    mechanism: ClassVar[str] = "discrete_gaussian"

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("l2_sensitivity", self.l2_sensitivity)
        _positive("sigma_share", self.sigma_share)
        if self.sigma_share < 0.5:
            raise PrivacyError(
                f"the distributed discrete Gaussian bound needs sigma_share >= 1/2, got "
                f"{self.sigma_share}"
            )
        for name in ("n_shares", "dimension"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PrivacyError(f"{name} must be a positive integer, got {v!r}")

    @property
    def sigma(self) -> float:
        """Standard deviation of the summed noise, sqrt(n_shares) * sigma_share."""
        return math.sqrt(self.n_shares) * self.sigma_share

    def dp_event(self) -> dp_event.DpEvent:
        """A :class:`DistributedDiscreteGaussianDpEvent` (its Gaussian reference where the
        noise is large, else the RDP bound)."""
        return DistributedDiscreteGaussianDpEvent(
            float(self.l2_sensitivity), float(self.sigma_share), int(self.n_shares),
            int(self.dimension),
        )


@dataclass(frozen=True, kw_only=True)
class SkellamEvent(PrivacyEvent):
    """Symmetric Skellam noise of total ``variance`` per entry on an integer query with L2
    and L1 sensitivities (integer units). Sums of Skellam shares are Skellam, so a
    distributed release is described by the survivors' total variance."""

    l2_sensitivity: float
    l1_sensitivity: float
    variance: float
    dimension: int | None = None
    mechanism: ClassVar[str] = "skellam"

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("l2_sensitivity", self.l2_sensitivity)
        _positive("l1_sensitivity", self.l1_sensitivity)
        _positive("variance", self.variance)
        v = self.dimension
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise PrivacyError(f"dimension must be a positive integer or None, got {v!r}")

    def dp_event(self) -> dp_event.DpEvent:
        """A :class:`SkellamDpEvent` (its Gaussian reference where the dimension is known
        and the noise large, else the RDP bound)."""
        return SkellamDpEvent(float(self.l2_sensitivity), float(self.l1_sensitivity),
                              float(self.variance),
                              None if self.dimension is None else int(self.dimension))


@dataclass(frozen=True, kw_only=True)
class NonPrivateEvent(PrivacyEvent):
    """A release with no DP guarantee (e.g. an un-noised field): epsilon becomes infinite."""

    reason: str = ""
    mechanism: ClassVar[str] = "non_private"
    pld_supported: ClassVar[bool] = True

    def dp_event(self) -> dp_event.DpEvent:
        """``NonPrivateDpEvent()``."""
        return dp_accounting.NonPrivateDpEvent()


def positive_or_none(what: str, v: Any) -> float | None:
    """``v`` as a float when it is a finite number > 0, None when it is None; anything else
    raises :class:`PrivacyError` naming ``what`` (e.g. "node policy max_clip")."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
            math.isfinite(v) and v > 0):
        raise PrivacyError(f"{what} must be a positive number, got {v!r}")
    return float(v)
