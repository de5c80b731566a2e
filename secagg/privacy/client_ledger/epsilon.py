"""A client's (or a group's) epsilon against each observer, composed from its events.

Which rounds each observer charges, and at what mechanism, is set out in
:mod:`secagg.privacy.client_ledger`; composition uses the run's own
:class:`~secagg.privacy.accountant.PrivacyLedger` (PLD where it can, else RDP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.client_ledger.events import _WILLING, CHARGED_IF_SAMPLED, OBSERVERS, ClientEvent
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    PrivacyEvent,
    SampledGaussianEvent,
    SkellamEvent,
)


@dataclass(frozen=True)
class ObserverEpsilon:
    """A client's (or a group's) epsilon against one observer at ``delta``.

    Attributes:
        observer: one of :data:`OBSERVERS`.
        epsilon: the composed epsilon, or None where no guarantee holds.
        delta: the delta it is stated at.
        reason: why there is no guarantee (``epsilon`` None), else a note (may be empty).
        charged_rounds: how many rounds were charged.
        amplified: whether amplification by Poisson sampling was used for some round.
    """

    observer: str
    epsilon: float | None
    delta: float
    reason: str = ""
    charged_rounds: int = 0
    amplified: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"observer": self.observer, "epsilon": self.epsilon, "delta": self.delta,
                "reason": self.reason, "charged_rounds": self.charged_rounds,
                "amplified": self.amplified}
def _combined_gaussian(evs: Sequence[PrivacyEvent]) -> float | None:
    """The noise multiplier of one Gaussian equivalent to the round's Gaussians on the
    same contribution (exact: z = (sum z_i^-2)^-1/2 per application), or None when some
    event is not a plain Gaussian."""
    if not evs or not all(type(e) is GaussianEvent for e in evs):
        return None
    inv = sum(e.count / e.noise_multiplier ** 2 for e in evs)  # type: ignore[attr-defined]
    return 1.0 / math.sqrt(inv)


def _scaled(e: PrivacyEvent, k: int) -> PrivacyEvent:
    """``e`` with its sensitivity multiplied by ``k`` (a group of k contributions)."""
    if k == 1:
        return e
    if type(e) is GaussianEvent:
        return replace(e, noise_multiplier=e.noise_multiplier / k)
    if type(e) is DiscreteGaussianEvent:
        return replace(e, l2_sensitivity=e.l2_sensitivity * k)
    if type(e) is SkellamEvent:
        return replace(e, l2_sensitivity=e.l2_sensitivity * k,
                       l1_sensitivity=e.l1_sensitivity * k)
    raise PrivacyError(f"no group bound for {e.mechanism} events (record-level DP-SGD "
                       "bounds one record, not a group of clients)")


def _realised(e: PrivacyEvent, colluders: int) -> PrivacyEvent | None:
    """The noise the server does not know when ``colluders`` share holders reveal theirs
    (None: no share is left secret)."""
    if colluders <= 0:
        return e
    if type(e) is DiscreteGaussianEvent:
        left = e.n_shares - colluders
        return None if left < 1 else replace(e, n_shares=left)
    if type(e) is SkellamEvent:
        # the event's variance is the survivors' total; the per-share variance is not
        # kept, so the colluders' part is taken as large as the shares could be: refuse
        raise PrivacyError("Skellam events do not record their share count: give "
                           "colluders=0 or use the discrete Gaussian")
    return e  # client-side (LocalDP) or server-side noise: colluders reveal nothing


def _compose(events: Sequence[PrivacyEvent], delta: float) -> float:
    """Compose with the run's machinery (PLD where it can, else RDP)."""
    ledger = PrivacyLedger(delta=delta)
    ledger.extend(_merged(events))
    return ledger.epsilon(delta)


def _merged(events: Iterable[PrivacyEvent]) -> list[PrivacyEvent]:
    """Identical mechanisms merged into one event with a count (faster, same number)."""
    counts: dict[Any, tuple[PrivacyEvent, int]] = {}
    for e in events:
        base = replace(e, count=1, label="", round=None, phase=None, fields=(),
                       not_private_reason="")
        k = (type(base).__name__, repr(base))
        prev = counts.get(k)
        counts[k] = (base, e.count + (prev[1] if prev else 0))
    return [replace(b, count=n) for b, n in counts.values()]


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def charged_events(events: Sequence[ClientEvent], observer: str, *,
                   colluders: int | None = None) -> tuple[list[PrivacyEvent], str, bool]:
    """What ``observer``'s figure composes for one client: (the :class:`PrivacyEvent` list,
    the reason there is no guarantee -- empty when there is one --, whether Poisson
    amplification was used). ``colluders`` overrides each event's own (server only)."""
    if observer not in OBSERVERS:
        raise PrivacyError(f"observer must be one of {OBSERVERS}, got {observer!r}")
    out: list[PrivacyEvent] = []
    amplified = False
    for ev in events:
        if observer == "release":
            if ev.action not in _WILLING:
                continue
            z = _combined_gaussian(ev.privacy_events())
            poisson = _poisson(ev) and z is not None
            if not poisson and ev.action not in CHARGED_IF_SAMPLED:
                continue  # not drawn: a fixed-size or unamplified round costs nothing
            if ev.unprotected.get("release"):
                return [], f"round {ev.round} ({ev.phase}): {ev.unprotected['release']}", \
                    amplified
            if poisson:
                assert z is not None
                amplified = amplified or ev.sampling_rate < 1
                out.append(SampledGaussianEvent(noise_multiplier=z,
                                                sampling_rate=ev.sampling_rate, steps=1))
            else:
                out += ev.privacy_events()
        else:
            if ev.action not in CHARGED_IF_SAMPLED:
                continue
            if ev.unprotected.get("server"):
                return [], f"round {ev.round} ({ev.phase}): {ev.unprotected['server']}", False
            c = ev.colluders if colluders is None else int(colluders)
            for e in ev.privacy_events():
                r = _realised(e, c)
                if r is None:
                    return [], (f"round {ev.round} ({ev.phase}): {c} colluding clients "
                                "know every noise share in the sum"), False
                out.append(r)
        if not ev.events and ev.noise_multiplier is None and (
                observer == "server" or ev.action in CHARGED_IF_SAMPLED):
            return [], (f"round {ev.round} ({ev.phase}): the release carried no DP noise "
                        f"(layer {ev.layer or 'unknown'!r})"), amplified
    return out, "", amplified


def _observer_epsilon(events: Sequence[ClientEvent], observer: str, delta: float,
                      colluders: int | None = None) -> ObserverEpsilon:
    d = _check_delta(delta)
    evs, reason, amplified = charged_events(events, observer, colluders=colluders)
    rounds = sum(1 for ev in events if _is_charged(ev, observer))
    if reason:
        return ObserverEpsilon(observer, None, d, reason, rounds, amplified)
    return ObserverEpsilon(observer, _compose(evs, d), d, "", rounds, amplified)


def _poisson(ev: ClientEvent) -> bool:
    """Whether the round is charged the Poisson-subsampled mechanism (release observer)."""
    return ev.sampling == "poisson" and ev.amplifiable


def _is_charged(ev: ClientEvent, observer: str) -> bool:
    if ev.action in CHARGED_IF_SAMPLED:
        return True
    return (observer == "release" and ev.action == "not_sampled"
            and _poisson(ev) and _combined_gaussian(ev.privacy_events()) is not None)


def release_epsilon(events: Sequence[ClientEvent], delta: float) -> ObserverEpsilon:
    """The client's epsilon against observers of the releases who do not learn the cohort
    (see :mod:`secagg.privacy.client_ledger`): Poisson-subsampled Gaussian over every
    eligible round where that holds, else the mechanism over the rounds it uploaded."""
    return _observer_epsilon(events, "release", delta)


def server_epsilon(events: Sequence[ClientEvent], delta: float, *,
                   colluders: int | None = None) -> ObserverEpsilon:
    """The client's epsilon against the server, who learns the cohort: the unamplified
    mechanism over the rounds it uploaded (or dropped in); None under CentralDP or where
    a release had no noise. ``colluders`` overrides each event's assumption."""
    return _observer_epsilon(events, "server", delta, colluders)


def client_epsilons(events: Sequence[ClientEvent], delta: float) -> dict[str, ObserverEpsilon]:
    """Observer -> :class:`ObserverEpsilon` for one client's events."""
    return {"release": release_epsilon(events, delta), "server": server_epsilon(events, delta)}


def client_summary(events: Sequence[ClientEvent], delta: float) -> dict[str, Any]:
    """What ``result.json``'s ``privacy.clients`` holds per client: ``epsilon``
    {observer: float | None}, ``participations`` (rounds, of any run, it uploaded or
    dropped in), ``eligible_rounds`` (rounds it was eligible for, refused ones included),
    ``refusals`` (rounds it refused) and ``status`` (``"exhausted"`` when its last round
    was refused or declined, ``"active"`` otherwise, ``"never eligible"`` without
    events); plus
    ``reasons`` {observer: why None} where a figure is None."""
    eps = client_epsilons(events, delta)
    last = events[-1].action if events else None
    status = ("never eligible" if last is None else
              "exhausted" if last in ("refused", "declined") else "active")
    out: dict[str, Any] = {
        "epsilon": {o: e.epsilon for o, e in eps.items()},
        "participations": len({(e.run, e.round) for e in events
                               if e.action in CHARGED_IF_SAMPLED}),
        "eligible_rounds": len({(e.run, e.round) for e in events}),
        "refusals": len({(e.run, e.round) for e in events if e.action == "refused"}),
        "status": status,
    }
    reasons = {o: e.reason for o, e in eps.items() if e.epsilon is None}
    if reasons:
        out["reasons"] = reasons
    return out


def group_epsilon(ledgers: Mapping[str, Sequence[ClientEvent]], delta: float,
                  observer: str) -> ObserverEpsilon:
    """The epsilon of a group of clients (one organisation holding all of them) against
    ``observer``, from the group's sensitivity: in each release, k contributing members
    have k times one client's sensitivity (a sum), and under Poisson sampling the group is
    drawn if any member is (rate 1 - prod(1 - q_i)); never the sum of single epsilons.

    Args:
        ledgers: member id -> its events.
        delta: the delta to state the figure at.
        observer: one of :data:`OBSERVERS`.
    """
    d = _check_delta(delta)
    if observer not in OBSERVERS:
        raise PrivacyError(f"observer must be one of {OBSERVERS}, got {observer!r}")
    by_key: dict[tuple[str, int, str], list[ClientEvent]] = {}
    for evs in ledgers.values():
        for ev in evs:
            by_key.setdefault(ev.key, []).append(ev)
    out: list[PrivacyEvent] = []
    rounds, amplified = 0, False
    for key in sorted(by_key, key=repr):
        members = by_key[key]
        if any(m.adjacency != "client" for m in members):
            return ObserverEpsilon(observer, None, d, "a group figure needs client-level "
                                   "adjacency (a record-level bound says nothing about a "
                                   "group of clients)", rounds, amplified)
        used = [m for m in members if m.action in CHARGED_IF_SAMPLED]
        willing = [m for m in members if m.action in _WILLING]
        if observer == "release":
            if not willing:
                continue
            z = _combined_gaussian(willing[0].privacy_events())
            poisson = all(_poisson(m) for m in willing) and z is not None
            if not poisson and not used:
                continue
            why = next((m.unprotected["release"] for m in willing
                        if m.unprotected.get("release")), "")
            if why:
                return ObserverEpsilon(observer, None, d, f"round {key[1]} ({key[2]}): "
                                       f"{why}", rounds, amplified)
            rounds += 1
            if poisson:
                assert z is not None
                q = 1.0 - math.prod(1.0 - m.sampling_rate for m in willing)
                amplified = amplified or q < 1
                out.append(SampledGaussianEvent(noise_multiplier=z / len(willing),
                                                sampling_rate=min(1.0, q), steps=1))
                continue
            group = used
        else:
            if not used:
                continue
            why = next((m.unprotected["server"] for m in used if m.unprotected.get("server")),
                       "")
            if why:
                return ObserverEpsilon(observer, None, d, f"round {key[1]} ({key[2]}): "
                                       f"{why}", rounds, amplified)
            rounds += 1
            group = used
        try:
            for e in group[0].privacy_events():
                if observer == "server":
                    r = _realised(e, group[0].colluders)
                    if r is None:
                        return ObserverEpsilon(observer, None, d, "colluders know every "
                                               "noise share", rounds, amplified)
                    e = r
                out.append(_scaled(e, len(group)))
        except PrivacyError as exc:
            return ObserverEpsilon(observer, None, d, str(exc), rounds, amplified)
        if not group[0].events and group[0].noise_multiplier is None:
            return ObserverEpsilon(observer, None, d, f"round {key[1]} ({key[2]}): the "
                                   "release carried no DP noise", rounds, amplified)
    return ObserverEpsilon(observer, _compose(out, d), d, "", rounds, amplified)
