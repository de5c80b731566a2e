"""The run's privacy ledger: composes DP events across rounds and phases.

Composition is done by Google's ``dp_accounting`` library:

* when every event is one the privacy-loss-distribution (PLD) accountant handles
  (Gaussian, Poisson-subsampled Gaussian) with a noise multiplier of at least
  :data:`PLD_MIN_NOISE_MULTIPLIER`, the PLD accountant is used — it is tight. Below that
  the PLD grid explodes (z = 0.1: 1.7 GB and 12 s; z = 0.001: 451 GiB) while epsilon is
  already above 100, so the RDP accountant (within a few percent there) is used instead;
* DistributedDP's integer mechanisms (a sum of discrete Gaussians, Skellam) join that
  path when their noise is large (as DistributedDP's always is, in quantisation steps):
  each release is charged as its rounded-Gaussian reference, whose curve is exact, plus
  the pointwise gap between the two laws (2 eta in epsilon, with delta shrunk by e^eta and
  the tails outside a box), proved in :mod:`secagg.privacy.pld`. The ledger composes the
  references in closed form when they are all plain Gaussians (a composition of
  Gaussians is mu-GDP with mu^2 the sum), else with the PLD accountant;
* otherwise the Renyi-DP accountant is used for all events, with the published RDP bounds
  for the distributed discrete Gaussian (Kairouz, Liu, Steinke 2021) and the Skellam
  mechanism (Agarwal, Kairouz, Liu 2021) added through :class:`_RdpAccountant`;
* an event neither accountant can bound is refused (:class:`PrivacyError`) when it is
  added, never silently ignored.

A ledger created with a budget ``(epsilon_budget, delta)`` refuses, with
:class:`BudgetExceeded` and before anything is recorded, an event that would take the
composed epsilon above the budget (:meth:`PrivacyLedger.spend`).

The epsilon is only half of the claim. The ledger also keeps, per field, why a guarantee
does not hold: a field released without DP noise in some phase (:meth:`mark_unnoised`:
declared public, routed through a layer that adds no noise), or noise that was not secret
(a user seed: :meth:`mark_not_private`, or an event's ``not_private_reason``). The run is
private only when no such mark exists; :meth:`field_guarantee` and :meth:`record_in` give
each field's own truth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from secagg.errors import BudgetExceeded, PrivacyError
from secagg.privacy import pld
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    DistributedDiscreteGaussianDpEvent,
    PrivacyEvent,
    SkellamDpEvent,
    SkellamEvent,
)

__all__ = ["PLD_MIN_NOISE_MULTIPLIER", "PrivacyLedger", "ddg_rdp", "skellam_rdp"]

#: RDP orders: dp_accounting's defaults plus a denser grid of large orders, which small
#: epsilons at small deltas need.
RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(set(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
           | {float(a) for a in range(2, 257)} | {320.0, 384.0, 512.0, 1024.0})
)


#: Smallest noise multiplier the PLD accountant is used for (at z = 0.25 and delta = 1e-5 a
#: single Gaussian release is already about (50, 1e-5)-DP; the PLD takes ~3 s and ~0.6 GB).
PLD_MIN_NOISE_MULTIPLIER = 0.25


def _pld_feasible(event: PrivacyEvent) -> bool:
    if isinstance(event, (DiscreteGaussianEvent, SkellamEvent)):
        ref = pld.reference(event.dp_event())
        return ref is not None and ref.noise_multiplier >= PLD_MIN_NOISE_MULTIPLIER
    z = getattr(event, "noise_multiplier", None)
    return event.pld_supported and (z is None or z >= PLD_MIN_NOISE_MULTIPLIER)


class _Transfer:
    """A PLD-path composition in which some releases are integer mechanisms, each charged
    as its Gaussian reference (:mod:`secagg.privacy.pld`): ``H`` the summed eta,
    ``log_tail`` the log of the summed tail mass (of the actual noise and, separately, of
    the references: each is at most e^log_tail)."""

    def __init__(self, groups: Sequence[tuple[Any, int]], discretization: float) -> None:
        self.groups: list[tuple[Any, int]] = []
        self.eta = 0.0
        tails: list[float] = []
        for dpe, count in groups:
            ref = pld.reference(dpe)
            if ref is None:
                self.groups.append((dpe, count))
                continue
            self.groups.append((dp_accounting.GaussianDpEvent(ref.noise_multiplier), count))
            self.eta += count * ref.eta
            tails.append(math.log(count) + ref.log_tail)
        self.log_tail = float(np.logaddexp.reduce(tails)) if tails else -math.inf
        self.mu: float | None = None
        if all(type(e) is dp_accounting.GaussianDpEvent for e, _ in self.groups):
            self.mu = math.sqrt(sum(c / e.noise_multiplier ** 2 for e, c in self.groups))
        self.discretization = discretization

    def _reference_accountant(self) -> pld_privacy_accountant.PLDAccountant:
        acc = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=self.discretization)
        for dpe, count in self.groups:
            acc.compose(dpe, count)
        return acc

    def epsilon(self, delta: float) -> float | None:
        """The composed epsilon at ``delta`` (None when the tails do not fit in the share
        of delta kept for them: the caller then uses RDP)."""
        d_ref = math.exp(-self.eta) * delta * (1.0 - pld.TAIL_SHARE)
        if self.mu is not None:
            eps_ref = pld.epsilon_for_mu(self.mu, d_ref)
        else:
            eps_ref = float(self._reference_accountant().get_epsilon(d_ref))
        eps = eps_ref + 2.0 * self.eta
        if not math.isfinite(eps):
            return eps
        if self.log_tail + float(np.logaddexp(0.0, eps + self.eta)) > math.log(
                pld.TAIL_SHARE * delta):
            return None
        return eps

    def delta(self, epsilon: float) -> float:
        """The smallest delta this bound gives at ``epsilon``."""
        if epsilon < 2.0 * self.eta:  # (2H, d)-DP implies (eps, d + e^2H - e^eps)-DP
            return min(1.0, self.delta(2.0 * self.eta) + math.exp(2.0 * self.eta)
                       - math.exp(epsilon))
        e_ref = epsilon - 2.0 * self.eta
        if self.mu is not None:
            d_ref = pld.delta_for_mu(self.mu, e_ref)
        else:
            d_ref = float(self._reference_accountant().get_delta(e_ref))
        tails = math.exp(min(700.0, self.log_tail + float(np.logaddexp(
            0.0, epsilon - self.eta))))
        return min(1.0, math.exp(self.eta) * d_ref + tails)


#: Composed epsilons already computed (identical event multisets give identical answers).
_EPS_CACHE: dict[tuple[Any, ...], float] = {}
_CACHE_SIZE = 4096


def ddg_rdp(event: DistributedDiscreteGaussianDpEvent, orders: np.ndarray) -> np.ndarray:
    """RDP of a sum of n discrete Gaussians (Kairouz, Liu, Steinke, ICML 2021, Thm 1 with
    Prop 14): with l = Delta_2 / sqrt(n sigma^2), tau = 10 sum_{k=1}^{n-1}
    exp(-2 pi^2 sigma^2 k/(k+1)) and d entries,
    eps(a) = min(a l^2 / 2 + tau d, a/2 (l + sqrt(d) tau)^2).  For n = 1, tau = 0 and this
    is the (Delta_2^2 / (2 sigma^2))-zCDP bound of Canonne, Kamath, Steinke (2020).
    Non-integer orders are evaluated at the next integer (RDP is non-decreasing in a)."""
    n, s2, d = event.n_shares, event.sigma_share ** 2, event.dimension
    ks = np.arange(1, n, dtype=np.float64)
    tau = 10.0 * float(np.sum(np.exp(-2.0 * math.pi ** 2 * s2 * ks / (ks + 1.0))))
    l_scale = event.l2_sensitivity / math.sqrt(n * s2)
    a = np.ceil(np.asarray(orders, dtype=np.float64))
    t1 = a * l_scale ** 2 / 2.0 + tau * d
    t2 = a / 2.0 * (l_scale + math.sqrt(d) * tau) ** 2
    return np.minimum(t1, t2)


def skellam_rdp(event: SkellamDpEvent, orders: np.ndarray) -> np.ndarray:
    """RDP of the multi-dimensional symmetric Skellam mechanism of variance mu (Agarwal,
    Kairouz, Liu, NeurIPS 2021):
    eps(a) = a D2^2/(2 mu) + min(((2a - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)).
    Non-integer orders are evaluated at the next integer."""
    mu, d2, d1 = event.variance, event.l2_sensitivity, event.l1_sensitivity
    a = np.ceil(np.asarray(orders, dtype=np.float64))
    extra = np.minimum(((2 * a - 1) * d2 ** 2 + 6 * d1) / (4 * mu ** 2), 3 * d1 / (2 * mu))
    return a * d2 ** 2 / (2 * mu) + extra


class _RdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """dp_accounting's RDP accountant, extended with the two integer mechanisms."""

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> Any:
        if isinstance(event, DistributedDiscreteGaussianDpEvent):
            if do_compose:
                self._rdp += count * ddg_rdp(event, self._orders)
            return None
        if isinstance(event, SkellamDpEvent):
            if do_compose:
                self._rdp += count * skellam_rdp(event, self._orders)
            return None
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_event.ComposedDpEvent):
            for e in event.events:
                r = self._maybe_compose(e, count, do_compose)
                if r is not None:
                    return r
            return None
        return super()._maybe_compose(event, count, do_compose)


def _check_delta(delta: float) -> float:
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


class PrivacyLedger:
    """All DP releases of a run, composed into one (epsilon, delta) guarantee.

    Args:
        epsilon_budget: the total epsilon the run may spend (None: no guard).
        delta: the delta the budget (and default queries) refer to.
        accountant: ``"auto"`` (PLD when every event allows it, else RDP), ``"pld"`` or
            ``"rdp"``.
        pld_discretization: PLD value discretisation interval (smaller is tighter, slower).
        holds_against: whom the guarantee holds against, in words (set by the DP layer that
            makes the ledger: everyone who sees the releases, and the server only where it
            never sees an un-noised value). No epsilon here uses amplification by sampling
            the cohort, so none depends on an observer not learning who took part.
    """

    #: What every guarantee on a ledger leaves out, stated with it.
    NO_COHORT_AMPLIFICATION = ("no amplification by cohort sampling is claimed: each "
                               "epsilon holds whether or not its observer learns the cohort")

    def __init__(
        self,
        epsilon_budget: float | None = None,
        delta: float | None = None,
        accountant: str = "auto",
        pld_discretization: float = 1e-4,
        holds_against: Sequence[str] = ("everyone who sees the releases",),
    ) -> None:
        if accountant not in ("auto", "pld", "rdp"):
            raise PrivacyError(f"accountant must be 'auto', 'pld' or 'rdp', got {accountant!r}")
        if epsilon_budget is not None:
            if not (isinstance(epsilon_budget, (int, float)) and epsilon_budget > 0
                    and math.isfinite(epsilon_budget)):
                raise PrivacyError(f"epsilon budget must be a positive number, got "
                                   f"{epsilon_budget!r}")
            if delta is None:
                raise PrivacyError("an epsilon budget needs a delta")
        self.epsilon_budget = None if epsilon_budget is None else float(epsilon_budget)
        self.delta = None if delta is None else _check_delta(delta)
        self.accountant = accountant
        self.pld_discretization = float(pld_discretization)
        self._events: list[PrivacyEvent] = []
        self._not_private: list[str] = []
        self._global_reasons: list[str] = []
        self._field_reasons: dict[str, list[str]] = {}
        self._unnoised: dict[tuple[str | None, str], str] = {}
        if isinstance(holds_against, str) or not all(isinstance(h, str) for h in
                                                     holds_against):
            raise PrivacyError(f"holds_against must be a sequence of strings, got "
                               f"{holds_against!r}")
        self.holds_against = tuple(holds_against)

    # -- recording -----------------------------------------------------------------------

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        """Every event recorded so far, in order."""
        return tuple(self._events)

    @property
    def private(self) -> bool:
        """False when some release used user-seeded noise, some field was released without
        DP noise, or the run was otherwise marked not private."""
        return not self._not_private

    @property
    def not_private_reasons(self) -> tuple[str, ...]:
        """Why the run is not private (empty when it is), one line per cause."""
        return tuple(self._not_private)

    def mark_not_private(self, reason: str, *, fields: Sequence[str] = ()) -> None:
        """Record that the run's guarantee does not hold (e.g. user-fixed noise seed):
        for ``fields`` only, or for every field when none are named."""
        if not isinstance(reason, str) or not reason:
            raise PrivacyError(f"a not-private mark needs a reason, got {reason!r}")
        if isinstance(fields, str):
            fields = (fields,)
        if reason not in self._not_private:
            self._not_private.append(reason)
        targets = [self._field_reasons.setdefault(f, []) for f in fields] or [
            self._global_reasons]
        for lst in targets:
            if reason not in lst:
                lst.append(reason)

    def mark_unnoised(self, field: str, phase: str | None, reason: str) -> None:
        """Record that ``field`` was released in ``phase`` without DP noise, and why (e.g.
        declared public, or routed through a layer that adds no noise). The run is then not
        private; the field's guarantee is epsilon = infinity."""
        if not isinstance(field, str) or not field:
            raise PrivacyError(f"field must be a field name, got {field!r}")
        key = (phase, field)
        if key in self._unnoised:
            return
        self._unnoised[key] = reason
        where = f"phase {phase!r}: " if phase is not None else ""
        self.mark_not_private(f"{where}field {field!r} released without DP noise: {reason}",
                              fields=(field,))

    @property
    def unnoised(self) -> dict[tuple[str | None, str], str]:
        """(phase, field) -> why that field was released there without DP noise."""
        return dict(self._unnoised)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every field the ledger knows of: covered by an event, released without noise,
        or named by a not-private mark (sorted)."""
        names = {f for e in self._events for f in e.fields}
        names |= {f for _, f in self._unnoised} | set(self._field_reasons)
        return tuple(sorted(names))

    def field_guarantee(self, field: str, delta: float | None = None) -> dict[str, Any]:
        """The guarantee of one field over the whole run: ``phases`` it was released in,
        ``epsilon`` at ``delta`` (default: the ledger's; infinity when some release of it
        was not noised; None without a delta), ``private`` and, when not private, the
        ``reason`` (every cause, joined by "; ")."""
        d = delta if delta is not None else self.delta
        unnoised = sorted(p for p, f in self._unnoised if f == field and p is not None)
        phases = {e.phase for e in self._events if field in e.fields and e.phase is not None}
        eps: float | None
        if any(f == field for _, f in self._unnoised):
            eps = math.inf
        else:
            eps = None if d is None else self.epsilon(d, field=field)
        reasons = [*self._global_reasons, *self._field_reasons.get(field, [])]
        out: dict[str, Any] = {"field": field, "phases": sorted(phases | set(unnoised)),
                               "epsilon": eps, "private": not reasons}
        if reasons:
            out["reason"] = "; ".join(reasons)
        return out

    def check(self, *events: PrivacyEvent) -> float:
        """The epsilon (at the budget's delta) the run would reach with ``events`` added.

        Raises:
            PrivacyError: an event no accountant can bound.
            BudgetExceeded: the result would exceed the budget (nothing is recorded).
        """
        for e in events:
            if not isinstance(e, PrivacyEvent):
                raise PrivacyError(f"not a PrivacyEvent: {e!r}")
            self._supported(e)
        if self.epsilon_budget is None or self.delta is None:
            return math.nan
        eps = self._epsilon([*self._events, *events], self.delta)
        if eps > self.epsilon_budget:
            what = ", ".join(e.label or e.mechanism for e in events)
            raise BudgetExceeded(
                f"release ({what}) would bring epsilon to {eps:.4g} at delta={self.delta:g}, "
                f"above the budget {self.epsilon_budget:g}; nothing was released"
            )
        return eps

    def spend(self, *events: PrivacyEvent) -> float:
        """Record ``events`` after the budget guard (:meth:`check`) passes; returns the
        epsilon after them (NaN when the ledger has no budget)."""
        eps = self.check(*events)
        for e in events:
            self._record(e)
        return eps

    def extend(self, events: Iterable[PrivacyEvent]) -> None:
        """Record events without the budget guard (e.g. a history replayed from a file)."""
        for e in events:
            self.check_supported(e)
            self._record(e)

    def _record(self, event: PrivacyEvent) -> None:
        self._events.append(event)
        if event.not_private_reason:
            self.mark_not_private(event.not_private_reason, fields=event.fields)

    def check_supported(self, event: PrivacyEvent) -> None:
        """Raise :class:`PrivacyError` if no accountant can bound ``event``."""
        self._supported(event)

    # -- queries -------------------------------------------------------------------------

    def epsilon(
        self, delta: float | None = None, *, field: str | None = None, phase: str | None = None
    ) -> float:
        """Composed epsilon at ``delta`` (default: the ledger's delta) over every event, or
        only those covering ``field`` / in ``phase``. 0.0 when there is no event."""
        d = delta if delta is not None else self.delta
        if d is None:
            raise PrivacyError("epsilon(delta) needs a delta (none given and no ledger delta)")
        return self._epsilon(self._select(field, phase), _check_delta(d))

    def delta_for(self, epsilon: float, *, field: str | None = None,
                  phase: str | None = None) -> float:
        """Smallest delta for which the selected events are (epsilon, delta)-DP."""
        if not (isinstance(epsilon, (int, float)) and epsilon >= 0):
            raise PrivacyError(f"epsilon must be a non-negative number, got {epsilon!r}")
        events = self._select(field, phase)
        if not events:
            return 0.0
        if self._transfers(events):
            return self._transfer(events).delta(float(epsilon))
        acc = self._accountant(events)
        return float(acc.get_delta(float(epsilon)))

    def method(self, events: Sequence[PrivacyEvent] | None = None) -> str:
        """Which accountant composes ``events`` (default: all): ``"pld"`` (integer
        mechanisms with enough noise included, through their Gaussian reference) or
        ``"rdp"``."""
        evs = self._events if events is None else events
        if self.accountant != "auto":
            return self.accountant
        return "pld" if all(_pld_feasible(e) for e in evs) else "rdp"

    def summary(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able report: total epsilon, per-field and per-phase epsilons, the accountant,
        whether the run is private, and the events."""
        d = delta if delta is not None else self.delta
        out: dict[str, Any] = {
            "delta": d, "accountant": self.method(), "private": self.private,
            "not_private_reasons": list(self._not_private),
            "epsilon_budget": self.epsilon_budget, "n_events": len(self._events),
            "holds_against": list(self.holds_against),
            "amplification": self.NO_COHORT_AMPLIFICATION,
        }
        if d is not None:
            out["epsilon"] = self.epsilon(d)
            fields = sorted({f for e in self._events for f in e.fields})
            out["per_field"] = {f: self.epsilon(d, field=f) for f in fields}
            phases = sorted({e.phase for e in self._events if e.phase is not None})
            out["per_phase"] = {p: self.epsilon(d, phase=p) for p in phases}
        out["fields"] = {f: self.field_guarantee(f, d) for f in self.fields}
        out["unnoised"] = [{"phase": p, "field": f, "reason": why}
                           for (p, f), why in self._unnoised.items()]
        out["events"] = [e.describe() for e in self._events]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for ``Result.to_dict``): :meth:`summary` at the ledger's delta."""
        return self.summary()

    def summary_rows(self) -> list[tuple[str, str]]:
        """Rows for the run's closing table: spent epsilon (and budget), per field,
        and whether the guarantee holds."""
        if self.delta is None:
            return [("privacy", f"{len(self._events)} DP events (no delta set)")]
        eps = self.epsilon()
        budget = "" if self.epsilon_budget is None else f" of budget {self.epsilon_budget:g}"
        rows = [(f"DP epsilon spent (delta={self.delta:g}, {self.method().upper()})",
                 f"{eps:.4g}{budget}")]
        for f in self.fields:
            g = self.field_guarantee(f)
            text = ("none (released without noise)" if g["epsilon"] == math.inf
                    else f"{g['epsilon']:.4g}")
            rows.append((f"DP epsilon, field {f}", text))
        rows.append(("DP guarantee holds", "yes" if self.private else
                     "NO: " + "; ".join(self._not_private)))
        rows.append(("DP guarantee holds against", "; ".join(self.holds_against)
                     + " (no amplification by cohort sampling)"))
        return rows

    def record_in(self, transcript: Any) -> None:
        """Write the guarantee per field and in total into a transcript
        (:meth:`secagg.transcript.Transcript.privacy` records).

        One record per field the run released (noised or not): ``field``, ``phases``,
        ``epsilon`` (infinity when some release of it was not noised; None without a
        delta), ``delta``, ``accountant``, ``private`` (this field's own truth) and, when
        not private, ``reason``. Then one total record (``field`` None): ``epsilon`` of the
        noised releases composed, ``delta``, ``accountant``, ``private`` (the run's),
        ``not_private_reasons``, ``unnoised`` ([{phase, field, reason}]), ``epsilon_budget``
        and ``n_events``.
        """
        method = self.method()
        for f in self.fields:
            g = self.field_guarantee(f)
            transcript.privacy(field=f, phases=g["phases"], epsilon=g["epsilon"],
                               delta=self.delta, accountant=method, private=g["private"],
                               **({"reason": g["reason"]} if "reason" in g else {}))
        transcript.privacy(field=None,
                           epsilon=None if self.delta is None else self.epsilon(),
                           delta=self.delta, accountant=method, private=self.private,
                           not_private_reasons=list(self._not_private),
                           unnoised=[{"phase": p, "field": f, "reason": why}
                                     for (p, f), why in self._unnoised.items()],
                           epsilon_budget=self.epsilon_budget, n_events=len(self._events),
                           holds_against=list(self.holds_against),
                           amplification=self.NO_COHORT_AMPLIFICATION)

    # -- internals -----------------------------------------------------------------------

    def _select(self, field: str | None, phase: str | None) -> list[PrivacyEvent]:
        return [e for e in self._events
                if (field is None or field in e.fields) and (phase is None or e.phase == phase)]

    def _supported(self, event: PrivacyEvent) -> None:
        dpe = event.dp_event()  # raises PrivacyError for unboundable events
        if isinstance(event, (DiscreteGaussianEvent, SkellamEvent)):
            if self.accountant == "pld" and not _pld_feasible(event):
                raise PrivacyError(
                    f"the event {event.describe()} has too little noise (or no dimension) "
                    "for the PLD accountant's Gaussian reference (secagg.privacy.pld); "
                    "use accountant='rdp' or 'auto'")
            return  # the reference (PLD path) or the published RDP bound covers it
        if self.accountant == "pld" and event.pld_supported and not _pld_feasible(event):
            raise PrivacyError(
                f"noise multiplier {event.noise_multiplier:g} is below "  # type: ignore[attr-defined]
                f"{PLD_MIN_NOISE_MULTIPLIER}: the PLD accountant's grid would not fit in "
                "memory; use accountant='rdp' or 'auto'")
        method = self.method([event]) if self.accountant == "auto" else self.accountant
        acc = self._new(method)
        if not acc.supports(dpe):
            if self.accountant == "auto" and method == "pld" and self._new("rdp").supports(dpe):
                return
            raise PrivacyError(
                f"the {method.upper()} accountant cannot bound the event {event.describe()}"
            )

    def _new(self, method: str) -> dp_accounting.PrivacyAccountant:
        if method == "pld":
            return pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=self.pld_discretization)
        return _RdpAccountant(orders=RDP_ORDERS)

    @staticmethod
    def _grouped(events: Sequence[PrivacyEvent]) -> list[tuple[Any, int]]:
        """Canonical composition: identical mechanisms merged into one count, in a fixed
        order, so the same multiset of events always gives the same number."""
        counts: dict[Any, int] = {}
        for e in events:
            k = e.dp_event()
            counts[k] = counts.get(k, 0) + e.count
        return sorted(counts.items(), key=lambda kv: repr(kv[0]))

    def _accountant(self, events: Sequence[PrivacyEvent],
                    rdp: bool = False) -> dp_accounting.PrivacyAccountant:
        acc = self._new("rdp" if rdp else self.method(events))
        for dpe, count in self._grouped(events):
            if not acc.supports(dpe):
                raise PrivacyError(f"the accountant cannot bound {dpe}")
            acc.compose(dpe, count)
        return acc

    def _transfers(self, events: Sequence[PrivacyEvent]) -> bool:
        """True when ``events`` go the PLD path with some integer mechanism among them."""
        return self.method(events) == "pld" and any(
            isinstance(e, (DiscreteGaussianEvent, SkellamEvent)) for e in events)

    def _transfer(self, events: Sequence[PrivacyEvent]) -> _Transfer:
        return _Transfer(self._grouped(events), self.pld_discretization)

    def _epsilon(self, events: Sequence[PrivacyEvent], delta: float) -> float:
        if not events:
            return 0.0
        groups = self._grouped(events)
        key = (self.method(events), self.pld_discretization, delta, tuple(groups))
        if key not in _EPS_CACHE:
            eps: float | None = None
            if self._transfers(events):
                eps = self._transfer(events).epsilon(delta)  # None: tails too heavy, RDP
            if eps is None:
                eps = float(self._accountant(events, rdp=self._transfers(events))
                            .get_epsilon(delta))
            if len(_EPS_CACHE) >= _CACHE_SIZE:
                _EPS_CACHE.pop(next(iter(_EPS_CACHE)))
            _EPS_CACHE[key] = math.inf if math.isnan(eps) else eps
        return _EPS_CACHE[key]

    def __repr__(self) -> str:
        return (f"PrivacyLedger(events={len(self._events)}, budget={self.epsilon_budget}, "
                f"delta={self.delta}, private={self.private})")
