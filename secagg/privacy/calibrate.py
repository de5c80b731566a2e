"""Any two of (epsilon, delta, noise multiplier) give the third, for a number of releases.

:func:`calibrate` returns the smallest noise multiplier whose composed guarantee meets a
target epsilon at a given delta — never a less private one: a geometric bracket, a
bisection down to a relative tolerance, and the returned value is the upper end of the
final bracket, whose epsilon was computed and verified to be <= the target.
:func:`epsilon_for` and :func:`delta_for` answer the other two questions. All three compose
exactly the events a run would record, through :class:`PrivacyLedger`, so the calibrated
noise and the run's accounting agree to the last digit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from secagg.errors import PrivacyError
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.events import GaussianEvent, PrivacyEvent

__all__ = ["calibrate", "delta_for", "epsilon_for"]

#: Builds ONE release at noise multiplier z: an event, or the events of a release that
#: covers several fields with separately accounted noise.
EventFactory = Callable[[float], "PrivacyEvent | Sequence[PrivacyEvent]"]


def _gaussian(z: float) -> PrivacyEvent:
    return GaussianEvent(noise_multiplier=z)


#: PLD grid used while bracketing (coarse, fast) and for the final answer (the ledger's).
COARSE_DISCRETIZATION = 2e-3
FINE_DISCRETIZATION = 1e-4


def _ledger(z: float, releases: int, event: EventFactory, prior: PrivacyLedger | None,
            accountant: str, discretization: float = FINE_DISCRETIZATION) -> PrivacyLedger:
    led = PrivacyLedger(accountant=accountant, pld_discretization=discretization)
    if prior is not None:
        led.extend(prior.events)
    one = event(z)
    batch = [one] if isinstance(one, PrivacyEvent) else list(one)
    led.extend(batch * releases)
    return led


def _releases(rounds: int, releases_per_round: int) -> int:
    for name, v in (("rounds", rounds), ("releases_per_round", releases_per_round)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PrivacyError(f"{name} must be a positive integer, got {v!r}")
    return rounds * releases_per_round


def epsilon_for(
    noise_multiplier: float, delta: float, *, rounds: int = 1, releases_per_round: int = 1,
    event: EventFactory | None = None, prior: PrivacyLedger | None = None,
    accountant: str = "auto",
) -> float:
    """Epsilon at ``delta`` of ``rounds * releases_per_round`` releases, each the event
    ``event(noise_multiplier)`` (default: a Gaussian), on top of ``prior``'s events."""
    n = _releases(rounds, releases_per_round)
    return _ledger(noise_multiplier, n, event or _gaussian, prior, accountant).epsilon(delta)


def delta_for(
    noise_multiplier: float, epsilon: float, *, rounds: int = 1, releases_per_round: int = 1,
    event: EventFactory | None = None, prior: PrivacyLedger | None = None,
    accountant: str = "auto",
) -> float:
    """Smallest delta at which the releases are (``epsilon``, delta)-DP."""
    n = _releases(rounds, releases_per_round)
    return _ledger(noise_multiplier, n, event or _gaussian, prior, accountant).delta_for(epsilon)


#: Largest target epsilon :func:`calibrate` accepts. Beyond it a DP guarantee means
#: little, and the PLD accountant's discretisation of near-zero noise would need
#: gigabytes (eps = 1e6 was killed for memory here); use the Plaintext layer instead.
MAX_TARGET_EPSILON = 100.0


def calibrate(
    target_epsilon: float, delta: float, *, rounds: int = 1, releases_per_round: int = 1,
    event: EventFactory | None = None, prior: PrivacyLedger | None = None,
    accountant: str = "auto", rel_tol: float = 1e-3, max_multiplier: float = 1e7,
) -> float:
    """Smallest noise multiplier z (to relative tolerance ``rel_tol``) such that
    ``rounds * releases_per_round`` releases of ``event(z)`` (default Gaussian), composed
    with ``prior``'s events, are (target_epsilon, delta)-DP.

    The returned z is verified: its epsilon is <= ``target_epsilon``; z / (1 + rel_tol)
    misses the target.

    Raises:
        PrivacyError: bad arguments, or the target cannot be met (e.g. the prior events
            alone already spend it) with z <= ``max_multiplier``.
    """
    if not (isinstance(target_epsilon, (int, float)) and target_epsilon > 0
            and math.isfinite(target_epsilon)):
        raise PrivacyError(f"target epsilon must be a positive number, got {target_epsilon!r}")
    if target_epsilon > MAX_TARGET_EPSILON:
        raise PrivacyError(
            f"target epsilon {target_epsilon:g} is above {MAX_TARGET_EPSILON:g}: no meaningful "
            "guarantee, and too little noise to calibrate; use the Plaintext layer for a "
            "non-private baseline"
        )
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    if not (0 < rel_tol < 0.5):
        raise PrivacyError(f"rel_tol must be in (0, 0.5), got {rel_tol!r}")
    n = _releases(rounds, releases_per_round)
    make = event or _gaussian

    def eps_at(z: float, discretization: float) -> float:
        try:
            led = _ledger(z, n, make, prior, accountant, discretization)
            return led.epsilon(delta)
        except PrivacyError:
            return math.inf  # no bound exists at this noise level: it does not qualify

    def coarse(z: float) -> float:
        return eps_at(z, COARSE_DISCRETIZATION)

    def eps(z: float) -> float:
        return eps_at(z, FINE_DISCRETIZATION)

    # 1) bracket and narrow with a coarse PLD grid (pessimistic, so a slight over-estimate
    #    of epsilon; RDP ignores the grid), 2) finish on the ledger's own grid.
    hi = 1.0
    while coarse(hi) > target_epsilon:
        hi *= 4.0
        if hi > max_multiplier:
            raise PrivacyError(
                f"no noise multiplier up to {max_multiplier:g} reaches epsilon "
                f"{target_epsilon:g} at delta {delta:g} over {n} releases"
            )
    lo = hi / 4.0
    while coarse(lo) <= target_epsilon:
        hi, lo = lo, lo / 4.0
        if lo < 1e-6:
            break
    while hi / lo > 1.02:
        mid = math.sqrt(hi * lo)
        if coarse(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    lo, hi = lo / 1.05, hi
    while eps(hi) > target_epsilon:  # the fine grid is tighter, but never trust it blindly
        lo, hi = hi, hi * 1.05
    while eps(lo) <= target_epsilon and lo > 1e-6:
        hi, lo = lo, lo / 1.05
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(hi * lo)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    final = eps(hi)
    if not final <= target_epsilon:  # pragma: no cover - bracket invariant
        raise PrivacyError(f"calibration failed: z={hi} gives epsilon {final}")
    return hi
