"""Each client's own privacy ledger: events, not epsilons, and the epsilon per observer.

A run's :class:`~secagg.privacy.accountant.PrivacyLedger` gives one epsilon for the worst
client over every release. This module keeps, per client, what actually happened to it in
every round it was eligible for, so that its own epsilon can be computed -- and recomputed
later with another accountant -- against each observer separately.

API (stable; new names are added, none renamed):

* :class:`ClientEvent` -- one round of one client: run, round, phase, what the client did
  (:data:`ACTIONS`), the mechanism and its parameters (noise multiplier, clip, the cohort
  sampling and its rate, the eligible population, the cohort size, survivors and minimum
  survivors under DistributedDP, the tolerated colluders), the adjacency, the layer, the
  privacy events of the release (``events``: JSON dicts of
  :class:`~secagg.privacy.events.PrivacyEvent`, one application each, DP-SGD's record-level
  events included) and, per observer, why no guarantee holds (``unprotected``).
  ``to_dict`` / ``from_dict`` / ``to_json`` / ``from_json`` round-trip it exactly.
* :func:`release_epsilon`, :func:`server_epsilon`, :func:`client_epsilons` -- the client's
  epsilon against each :data:`OBSERVERS` at a delta, as an :class:`ObserverEpsilon`
  (``epsilon`` None with a ``reason`` where there is no guarantee).
* :func:`charged_events` -- the :class:`PrivacyEvent` list an observer's figure composes
  (to recompute it with any accountant).
* :func:`group_epsilon` -- the epsilon of a set of clients held by one organisation, from
  the group's sensitivity (never the sum of single-client epsilons).
* :class:`ClientBudget`, :class:`Admission`, :func:`project`, :func:`admit` -- a budget per
  observer, and the check a client runs before it touches its data in a round: the
  projected epsilons with the round's declared terms added, refused when over budget.
* :class:`ClientLedger` -- one client's events, append-only on disk as JSON lines
  (:meth:`ClientLedger.open` / :meth:`ClientLedger.append` / :meth:`ClientLedger.extend`),
  and :func:`open_ledgers` for a directory of them (one file per client).
* :class:`ClientAccounts`, :func:`declared_release` -- the embedded engine's side: the
  eligible population, the round's declared terms, every client's admission and events.
* :class:`IndividualFilter`, :func:`individual_mu`, :class:`UnsoundFilter` -- optional
  data-dependent accounting from each round's actual clipped update, through a Renyi or
  Gaussian-DP filter that stops the client exactly before its budget is crossed (PLD is
  refused); its figures stay on the client.

The observers (the issue's point 2):

``release``
    whoever sees the released aggregates and the models built from them, and not the
    cohort. Where the cohort was drawn by Poisson sampling and the round's release is a
    Gaussian mechanism whose noise the server adds whoever is in the cohort (CentralDP:
    ``amplifiable``), every round the client was *eligible* for (sampled or not) is charged
    the Poisson-subsampled Gaussian at its sampling rate; composing only the rounds it
    took part in would understate it. There, a client that is not drawn and one whose
    contribution is zero give the same release, so the add/remove analysis of the sampled
    Gaussian applies exactly. Noise the clients add themselves (LocalDP, DistributedDP)
    comes and goes with the cohort, so no amplification is claimed for it; rounds drawn
    with a fixed cohort size, or whose mechanism has no subsampling bound here (the
    integer mechanisms, record-level DP-SGD), are charged unamplified too, and only when
    the client uploaded.
``server``
    the aggregator, who learns the cohort: the unamplified mechanism over the rounds the
    client uploaded (a dropped client is charged as if it uploaded). Under CentralDP the
    server sees the un-noised sum: there is no guarantee (None, with the reason). Under
    DistributedDP the charge is the noise actually added by the survivors, less the shares
    of ``colluders`` clients assumed to reveal theirs.

Adjacency is the run's (``adjacency``: ``"client"``, the client's whole contribution
present or absent, or ``"record"``). Every figure is conditioned on the draws of the
cohorts and the dropouts, which do not depend on any client's data.

Composition uses the run's own machinery (:class:`PrivacyLedger`, PLD where it can, else
RDP), so a client's figure and the run's global one are computed alike.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from secagg.errors import PrivacyError
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    PrivacyEvent,
    SampledGaussianEvent,
    SkellamEvent,
    positive_or_none,
)

__all__ = [
    "ACTIONS",
    "CENTRAL_DP_SERVER",
    "CHARGED_IF_SAMPLED",
    "FILTER_KINDS",
    "OBSERVERS",
    "Admission",
    "ClientAccounts",
    "ClientBudget",
    "ClientEvent",
    "ClientLedger",
    "IndividualFilter",
    "ObserverEpsilon",
    "UnsoundFilter",
    "admit",
    "charged_events",
    "client_epsilons",
    "client_summary",
    "declared_release",
    "event_from_dict",
    "event_to_dict",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "group_epsilon",
    "individual_mu",
    "open_ledgers",
    "project",
    "release_epsilon",
    "server_epsilon",
]

#: Who a per-client epsilon holds against (see the module docstring).
OBSERVERS: tuple[str, ...] = ("release", "server")

#: What a client did in a round it was eligible for:
#: ``uploaded`` (sampled, its data entered the release), ``dropped`` (sampled, then dropped:
#: charged as if it uploaded), ``not_sampled`` (eligible and willing, not drawn),
#: ``refused`` (drawn, refused before touching its data: over budget or against its
#: policy), ``declined`` (not drawn, and would have refused), ``filtered`` (a
#: data-dependent filter stopped it: it sent a masked zero; node-side only).
ACTIONS: tuple[str, ...] = ("uploaded", "dropped", "not_sampled", "refused", "declined",
                            "filtered")

#: Actions whose round used the client's data (both observers charge them).
CHARGED_IF_SAMPLED: frozenset[str] = frozenset({"uploaded", "dropped"})
#: Actions of a round the client was willing to join (Poisson amplification charges them).
_WILLING = frozenset({"uploaded", "dropped", "not_sampled"})

_EVENT_TYPES: dict[str, type[PrivacyEvent]] = {
    "gaussian": GaussianEvent,
    "sampled_gaussian": SampledGaussianEvent,
    "discrete_gaussian": DiscreteGaussianEvent,
    "skellam": SkellamEvent,
}
_EVENT_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("noise_multiplier",),
    "sampled_gaussian": ("noise_multiplier", "sampling_rate", "steps"),
    "discrete_gaussian": ("l2_sensitivity", "sigma_share", "n_shares", "dimension"),
    "skellam": ("l2_sensitivity", "l1_sensitivity", "variance"),
}


def event_to_dict(event: PrivacyEvent) -> dict[str, Any]:
    """The mechanism of ``event`` (one application times ``count``) as a JSON dict:
    ``{"mechanism": ..., <parameters>, "count": n}`` (no label, round, phase or fields).

    Raises:
        PrivacyError: a mechanism a client ledger does not keep (e.g. non-private)."""
    name = getattr(event, "mechanism", None)
    if name not in _EVENT_PARAMS or type(event) is not _EVENT_TYPES[name]:
        raise PrivacyError(f"a client ledger keeps Gaussian, sampled Gaussian, discrete "
                           f"Gaussian and Skellam events, not {event!r}")
    out: dict[str, Any] = {"mechanism": name}
    for k in _EVENT_PARAMS[name]:
        out[k] = getattr(event, k)
    out["count"] = event.count
    return out


def event_from_dict(d: Mapping[str, Any]) -> PrivacyEvent:
    """The :class:`PrivacyEvent` a dict of :func:`event_to_dict` describes.

    Raises:
        PrivacyError: an unknown mechanism or missing parameter."""
    name = d.get("mechanism")
    if name not in _EVENT_TYPES:
        raise PrivacyError(f"unknown mechanism in a client ledger event: {name!r}")
    try:
        params = {k: d[k] for k in _EVENT_PARAMS[name]}
    except KeyError as exc:
        raise PrivacyError(f"{name} event without {exc.args[0]!r}: {dict(d)!r}") from None
    return _EVENT_TYPES[name](count=int(d.get("count", 1)), **params)  # type: ignore[call-arg]


@dataclass(frozen=True, kw_only=True)
class ClientEvent:
    """One round of one client, as its ledger keeps it (JSON-able; see the module
    docstring). Only ``events``, ``sampling``, ``sampling_rate``, ``colluders``,
    ``unprotected``, ``adjacency`` and ``action`` enter the epsilons; the rest describes.

    Attributes:
        client: the client's id (a string).
        run: the run's id (rounds of different runs are different releases).
        round, phase: where in the run.
        action: one of :data:`ACTIONS`.
        layer: the privacy layer's name.
        adjacency: ``"client"`` or ``"record"``.
        sampling: ``"poisson"`` (each eligible client drawn independently with
            ``sampling_rate``) or ``"fixed"`` (``cohort`` drawn without replacement).
        sampling_rate: the chance this client was drawn this round.
        eligible: the eligible population the cohort was drawn from this round.
        cohort: the cohort's size (the fixed denominator of a mean).
        noise_multiplier: the release's noise multiplier z (None without DP noise: then a
            round with no ``events`` that used the client's data has no guarantee; with
            one, a round may charge nothing, e.g. a DP-FTRL tree leaf that adds no node).
        clip: the L2 clip of the update (None when the phase has none).
        survivors, min_survivors: under DistributedDP, the clients whose noise shares are
            in the sum, and the fewest the secure sum accepts (the shares are sized for it).
        colluders: clients assumed to reveal their noise shares to the server.
        local_steps, local_rate: record-level DP-SGD's steps and sampling rate this round.
        events: the release's mechanisms (:func:`event_to_dict`), one application each,
            at the planned or realised noise (DistributedDP: the survivors' shares).
        unprotected: observer -> why it has no guarantee from this round (e.g. CentralDP:
            the server saw the un-noised sum; a field released without noise).
        server_amplification: the declared terms claim amplification by sampling against
            the server (a node's policy refuses that: the server learns the cohort).
        reason: why the client refused or declined (empty otherwise).
        amplifiable: the release's noise is added by the server whoever is in the cohort
            (CentralDP), so a Poisson-drawn round is charged the subsampled mechanism
            against observers of the releases (False: never amplified).
        assumes: what the figure rests on beyond the client's own noise (empty: nothing;
            e.g. a DistributedDP share sized on the server's word for the survivors).
    """

    client: str
    run: str
    round: int
    phase: str
    action: str
    layer: str = ""
    adjacency: str = "client"
    sampling: str = "fixed"
    sampling_rate: float = 1.0
    eligible: int = 1
    cohort: int = 1
    noise_multiplier: float | None = None
    clip: float | None = None
    survivors: int | None = None
    min_survivors: int | None = None
    colluders: int = 0
    local_steps: int | None = None
    local_rate: float | None = None
    events: tuple[dict[str, Any], ...] = ()
    unprotected: dict[str, str] = field(default_factory=dict)
    server_amplification: bool = False
    reason: str = ""
    amplifiable: bool = False
    assumes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "client", str(self.client))
        object.__setattr__(self, "events", tuple(dict(e) for e in self.events))
        object.__setattr__(self, "unprotected", dict(self.unprotected))
        if self.action not in ACTIONS:
            raise PrivacyError(f"client event action must be one of {ACTIONS}, got "
                               f"{self.action!r}")
        if self.sampling not in ("poisson", "fixed"):
            raise PrivacyError(f"sampling must be 'poisson' or 'fixed', got {self.sampling!r}")
        if self.adjacency not in ("client", "record"):
            raise PrivacyError(f"adjacency must be 'client' or 'record', got "
                               f"{self.adjacency!r}")
        q = self.sampling_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
            raise PrivacyError(f"sampling_rate must be in (0, 1], got {q!r}")
        for name in ("round", "eligible", "cohort", "colluders"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise PrivacyError(f"{name} must be a non-negative integer, got {v!r}")
        bad = set(self.unprotected) - set(OBSERVERS)
        if bad:
            raise PrivacyError(f"unprotected names unknown observers {sorted(bad)}")
        for e in self.events:
            event_from_dict(e)  # validates

    @property
    def key(self) -> tuple[str, int, str]:
        """(run, round, phase): the release this event belongs to."""
        return (self.run, self.round, self.phase)

    def privacy_events(self) -> list[PrivacyEvent]:
        """The release's mechanisms as :class:`PrivacyEvent` objects."""
        return [event_from_dict(e) for e in self.events]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (:meth:`from_dict` inverts it exactly)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["events"] = [dict(e) for e in self.events]
        out["unprotected"] = dict(self.unprotected)
        if not self.assumes:  # written only where a figure rests on something
            del out["assumes"]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClientEvent:
        """The event a :meth:`to_dict` dict describes (unknown keys are refused)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise PrivacyError(f"unknown client event keys {sorted(unknown)}")
        kw = dict(d)
        kw["events"] = tuple(kw.get("events", ()))
        return cls(**kw)

    def to_json(self) -> str:
        """One line of JSON (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> ClientEvent:
        """The event one line of :meth:`to_json` describes."""
        return cls.from_dict(json.loads(text))


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


# ------------------------------------------------------------------ composition


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
    (see the module docstring): Poisson-subsampled Gaussian over every eligible round
    where that holds, else the mechanism over the rounds it uploaded."""
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


# ------------------------------------------------------------------ budget


@dataclass(frozen=True)
class ClientBudget:
    """A client's epsilon budget per observer (None: no budget against that observer).

    A client holding a ``server`` budget refuses every round that gives no guarantee
    against the server (CentralDP, un-noised releases)."""

    release: float | None = None
    server: float | None = None

    def __post_init__(self) -> None:
        positive_or_none("client budget release", self.release)
        positive_or_none("client budget server", self.server)

    @property
    def observers(self) -> dict[str, float]:
        """Observer -> budget, for the observers that have one."""
        return {o: v for o in OBSERVERS if (v := getattr(self, o)) is not None}

    @classmethod
    def parse(cls, specs: str | Sequence[str]) -> ClientBudget:
        """From CLI text: ``"EPS"`` (every observer), ``"server=EPS"``,
        ``"release=EPS"``, or several of these (a list, or comma-separated).

        Raises:
            PrivacyError: an unknown observer or a value that is not a positive number."""
        items = [specs] if isinstance(specs, str) else list(specs)
        parts = [p.strip() for it in items for p in str(it).split(",") if p.strip()]
        if not parts:
            raise PrivacyError("an empty client budget")
        got: dict[str, float] = {}
        for p in parts:
            name, _, value = p.rpartition("=")
            targets = OBSERVERS if not name else (name.strip(),)
            for t in targets:
                if t not in OBSERVERS:
                    raise PrivacyError(f"client budget observer must be one of {OBSERVERS}, "
                                       f"got {t!r} (in {p!r})")
                try:
                    got[t] = float(value)
                except ValueError:
                    raise PrivacyError(f"client budget {p!r}: {value!r} is not a "
                                       "number") from None
        return cls(**got)

    def to_dict(self) -> dict[str, float | None]:
        """JSON-able form."""
        return {"release": self.release, "server": self.server}


@dataclass(frozen=True)
class Admission:
    """The answer of :func:`admit`: whether the client may take part in the round, its
    projected epsilon per observer with the round added, and why it refuses."""

    admitted: bool
    projected: dict[str, float | None]
    reason: str = ""


def _terms_list(terms: ClientEvent | Sequence[ClientEvent]) -> list[ClientEvent]:
    return [terms] if isinstance(terms, ClientEvent) else list(terms)


def project(history: Sequence[ClientEvent], terms: ClientEvent | Sequence[ClientEvent],
            delta: float) -> dict[str, ObserverEpsilon]:
    """Each observer's epsilon if the client took part in the round ``terms`` declares
    (one event, or one per phase of the round; each charged as an upload, whatever its
    ``action``)."""
    return client_epsilons(
        [*history, *(replace(t, action="uploaded") for t in _terms_list(terms))], delta)


def admit(history: Sequence[ClientEvent], terms: ClientEvent | Sequence[ClientEvent],
          budget: ClientBudget | None, delta: float, policy: Any | None = None) -> Admission:
    """The check a client runs before it touches its data in a round: refuse terms against
    its ``policy`` (a :class:`~secagg.privacy.policy.NodePolicy`), then refuse when the
    projected epsilon against an observer it holds a budget for is above that budget, or
    has no guarantee. Data-independent: the answer depends on the declared terms and the
    history only, so a refusal reveals nothing about the client's data.

    Args:
        history: the client's events so far (every run).
        terms: the round as the server declared it (noise, sampling, cohort...): one
            event, or one per phase of the round.
        budget: the client's budget (None: no budget, only the policy is checked).
        delta: the delta its budget is stated at.
        policy: the client's NodePolicy, or None.
    """
    if policy is not None:
        try:
            for t in _terms_list(terms):
                policy.check_terms(t)
        except PrivacyError as exc:
            return Admission(False, {}, f"policy: {exc}")
    if budget is None or not budget.observers:
        return Admission(True, {})
    eps = project(history, terms, delta)
    projected = {o: e.epsilon for o, e in eps.items()}
    for o, limit in budget.observers.items():
        e = eps[o]
        if e.epsilon is None:
            return Admission(False, projected, f"no guarantee against the {o}: {e.reason}")
        if e.epsilon > limit:
            return Admission(False, projected,
                             f"taking part would bring epsilon against the {o} to "
                             f"{e.epsilon:.4g} at delta={delta:g}, above its budget "
                             f"{limit:g}")
    return Admission(True, projected)


# ------------------------------------------------------------------ storage


class ClientLedger:
    """One client's events, in memory and, when ``path`` is given, appended to a JSON-lines
    file (one :meth:`ClientEvent.to_json` per line, flushed and synced per append).

    Args:
        client: the client's id.
        path: the file (None: in memory only).
    """

    SUFFIX: ClassVar[str] = ".jsonl"

    def __init__(self, client: str | int, path: str | os.PathLike[str] | None = None) -> None:
        self.client = str(client)
        self.path = None if path is None else Path(path)
        self._events: list[ClientEvent] = []

    @classmethod
    def open(cls, client: str | int, path: str | os.PathLike[str]) -> ClientLedger:
        """The ledger in ``path`` (created on first append when absent).

        Raises:
            PrivacyError: a line that is not a valid event, or an event of another
                client."""
        led = cls(client, path)
        p = Path(path)
        if p.exists():
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    ev = ClientEvent.from_json(line)
                except (ValueError, TypeError) as exc:
                    raise PrivacyError(f"{p}:{i}: not a client ledger event ({exc})") from None
                if ev.client != led.client:
                    raise PrivacyError(f"{p}:{i}: event of client {ev.client!r} in the "
                                       f"ledger of client {led.client!r}")
                led._events.append(ev)
        return led

    @property
    def events(self) -> tuple[ClientEvent, ...]:
        """Every event, in order."""
        return tuple(self._events)

    def __iter__(self) -> Iterator[ClientEvent]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: ClientEvent) -> None:
        """Record ``event`` (and write it to the file, synced, when there is one)."""
        if event.client != self.client:
            raise PrivacyError(f"event of client {event.client!r} for the ledger of "
                               f"{self.client!r}")
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(event.to_json() + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        self._events.append(event)

    def epsilons(self, delta: float) -> dict[str, ObserverEpsilon]:
        """:func:`client_epsilons` of this ledger."""
        return client_epsilons(self._events, delta)

    def extend(self, events: Sequence[ClientEvent]) -> None:
        """Record several events with one write (and one sync) of the file."""
        if any(e.client != self.client for e in events):
            raise PrivacyError(f"an event of another client for the ledger of "
                               f"{self.client!r}")
        if self.path is not None and events:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("".join(e.to_json() + "\n" for e in events))
                fh.flush()
                os.fsync(fh.fileno())
        self._events.extend(events)

    def admit(self, terms: ClientEvent | Sequence[ClientEvent], budget: ClientBudget | None,
              delta: float, policy: Any | None = None) -> Admission:
        """:func:`admit` against this ledger's history."""
        return admit(self._events, terms, budget, delta, policy)

    def __repr__(self) -> str:
        return f"ClientLedger(client={self.client!r}, events={len(self)}, path={self.path})"


def open_ledgers(directory: str | os.PathLike[str] | None,
                 clients: Iterable[str | int]) -> dict[str, ClientLedger]:
    """Client id -> its ledger: ``<directory>/client-<id>.jsonl`` (read when present), or
    in memory when ``directory`` is None."""
    out: dict[str, ClientLedger] = {}
    for c in clients:
        cid = str(c)
        if directory is None:
            out[cid] = ClientLedger(cid)
        else:
            if not cid.replace("-", "").replace("_", "").isalnum():
                raise PrivacyError(f"client id {cid!r} cannot name a ledger file")
            out[cid] = ClientLedger.open(cid, Path(directory) / f"client-{cid}"
                                         f"{ClientLedger.SUFFIX}")
    return out


# ------------------------------------------------------------------ the embedded engine's side

#: Why CentralDP gives no guarantee against the server.
CENTRAL_DP_SERVER = ("CentralDP: the server adds the noise after seeing the un-noised sum, "
                     "so nothing holds against it")


def declared_release(layer: Any, spec: Any, n: int,
                     covered: Sequence[str] = ()) -> tuple[list[PrivacyEvent], dict[str, str]]:
    """What a release of ``spec`` through ``layer`` over a cohort of ``n`` declares before
    it happens: its privacy events at the planned noise (DistributedDP: the shares sized
    for the fewest survivors the secure sum accepts; CentralDP's tree: the largest charge
    one round can make, z / sqrt(depth)), and observer -> why that observer has no
    guarantee (fields released without noise, unless ``covered`` by record-level DP-SGD;
    CentralDP against the server; a user-fixed noise seed)."""
    from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP
    from secagg.privacy.tree import tree_depth

    unprotected: dict[str, str] = {}
    bare = {k: v for k, v in layer.unnoised_fields(spec).items() if k not in set(covered)}
    if bare:
        name, why = next(iter(bare.items()))
        text = f"field {name!r} released without DP noise ({why})"
        unprotected = {"release": text, "server": text}
    if not isinstance(layer, (CentralDP, LocalDP, DistributedDP)):
        return [], unprotected
    if getattr(layer, "seed", None) is not None:
        text = f"{layer.name}: noise seed fixed by the user"
        unprotected = {"release": text, "server": text}
    noised = [f for f in spec.fields if f.name not in layer.unnoised_fields(spec)]
    events: list[PrivacyEvent] = []
    if noised:
        z = layer.noise_multiplier
        if isinstance(layer, DistributedDP):
            events = list(layer.release_plan(spec, max(1, n)).planned)
        elif isinstance(layer, CentralDP) and layer.tree:
            events = [GaussianEvent(noise_multiplier=z / math.sqrt(
                tree_depth(layer.releases or 1)))]
        else:
            events = [GaussianEvent(noise_multiplier=z)]
    if isinstance(layer, CentralDP):
        unprotected.setdefault("server", CENTRAL_DP_SERVER)
    return events, unprotected


@dataclass
class _PhaseTerms:
    name: str
    template: ClientEvent


class ClientAccounts:
    """The embedded engine's per-client bookkeeping for one run: every client's ledger
    (read from ``directory`` when given, so a client's spend carries over runs), the
    eligible population, the admission of each client before a round touches its data,
    and one :class:`ClientEvent` per client per released phase.

    Args:
        clients: the clients' ids.
        layer: the run's privacy layer.
        delta: the delta budgets and the reported figures are stated at.
        directory: where each client's ledger file lives (None: in memory only).
        budget: every client's :class:`ClientBudget` (None: no budget).
        policy: every client's NodePolicy (None: none).
        sampling: ``"fixed"`` or ``"poisson"`` (how the engine draws cohorts).
        colluders: clients each client assumes collude with the server (DistributedDP).
        run_id: this run's id in the ledgers (default: a random one).
    """

    def __init__(self, clients: Sequence[int], *, layer: Any, delta: float,
                 directory: str | os.PathLike[str] | None = None,
                 budget: ClientBudget | None = None, policy: Any | None = None,
                 sampling: str = "fixed", colluders: int = 0,
                 run_id: str | None = None) -> None:
        import uuid

        if sampling not in ("fixed", "poisson"):
            raise PrivacyError(f"sampling must be 'fixed' or 'poisson', got {sampling!r}")
        if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
            raise PrivacyError(f"colluders must be a non-negative integer, got {colluders!r}")
        self.layer, self.delta = layer, _check_delta(delta)
        self.budget, self.policy = budget, policy
        self.sampling, self.colluders = sampling, colluders
        from secagg.privacy.layers import CentralDP

        self.amplifiable = isinstance(layer, CentralDP) and not layer.tree
        from secagg.privacy.layers import DistributedDP, LocalDP

        self._dp = isinstance(layer, (CentralDP, LocalDP, DistributedDP))
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.clients = list(clients)
        self.directory = None if directory is None else Path(directory)
        self.ledgers = open_ledgers(directory, self.clients)
        self.active: list[int] = list(self.clients)
        self.refusing: dict[int, str] = {}
        self._terms: dict[str, _PhaseTerms] = {}
        self._round: dict[str, list[ClientEvent]] = {}
        self._eligible = len(self.clients)
        self._rate = 1.0
        self._cohort = 0

    @property
    def guarded(self) -> bool:
        """Whether clients check admission at all (a budget or a policy is set)."""
        return self.budget is not None or self.policy is not None

    def begin_round(self, r: int, phases: Sequence[tuple[str, Any, Sequence[str]]],
                    rate: float, cohort: int) -> None:
        """Declare round ``r``'s terms (each released phase: name, spec, DP-SGD-covered
        fields), drawn at ``rate`` from the current population for a cohort of
        ``cohort``, and run every eligible client's admission (data-independent)."""
        self._eligible, self._rate, self._cohort = len(self.active), float(rate), int(cohort)
        self._terms = {}
        for name, spec, covered in phases:
            events, unprotected = declared_release(self.layer, spec, cohort, covered)
            self._terms[name] = _PhaseTerms(name, self._event(
                "", r, name, "uploaded", events, unprotected))
        self.refusing = {}
        self._round = {}
        if not self.guarded or not self._terms:
            return
        for c in self.active:
            terms = [replace(t.template, client=str(c)) for t in self._terms.values()]
            a = self.ledgers[str(c)].admit(terms, self.budget, self.delta, self.policy)
            if not a.admitted:
                self.refusing[c] = a.reason

    def _event(self, client: str, r: int, phase: str, action: str,
               events: Sequence[PrivacyEvent], unprotected: Mapping[str, str],
               **extra: Any) -> ClientEvent:
        layer = self.layer
        z = layer.noise_multiplier if self._dp else None
        return ClientEvent(
            client=client, run=self.run_id, round=r, phase=phase, action=action,
            layer=getattr(layer, "name", type(layer).__name__),
            adjacency=getattr(layer, "adjacency", "client"), sampling=self.sampling,
            sampling_rate=min(1.0, max(self._rate, 1e-12)), eligible=self._eligible,
            cohort=self._cohort, noise_multiplier=z, colluders=self.colluders,
            amplifiable=self.amplifiable,
            events=tuple(event_to_dict(replace(e, label="", round=None, phase=None,
                                               fields=(), not_private_reason=""))
                         for e in events),
            unprotected=dict(unprotected), **extra)

    def record_phase(self, r: int, phase: str, cohort: Sequence[int],
                     contributors: Sequence[int], events: Sequence[PrivacyEvent],
                     unprotected: Mapping[str, str], *, clip: float | None = None,
                     survivors: int | None = None, min_survivors: int | None = None,
                     local: tuple[int, float] | None = None) -> None:
        """Book a released phase for every eligible client: ``events`` are the release's
        (and DP-SGD's) events as the run's ledger charged them; ``unprotected`` adds to
        the declared reasons."""
        declared = self._terms.get(phase)
        why = dict(declared.template.unprotected) if declared else {}
        for k, v in unprotected.items():
            why.setdefault(k, v)
        kept: list[PrivacyEvent] = []
        for e in events:
            try:
                event_to_dict(e)
            except PrivacyError:
                text = f"a release without a DP bound ({e.mechanism})"
                why.setdefault("release", text)
                why.setdefault("server", text)
                continue
            if e.not_private_reason:
                why.setdefault("release", e.not_private_reason)
                why.setdefault("server", e.not_private_reason)
            kept.append(e)
        in_cohort, got = set(cohort), set(contributors)
        extra: dict[str, Any] = {"clip": clip, "survivors": survivors,
                                 "min_survivors": min_survivors}
        if local is not None:
            extra.update(local_steps=int(local[0]), local_rate=float(local[1]))
        # a client that left the population but was drawn before it left (a cohort drawn
        # a round early) and refused again is booked too
        late = [c for c in cohort if c in self.refusing and c not in self.active]
        for c in [*self.active, *late]:
            if c in self.refusing:
                action = "refused" if c in in_cohort else "declined"
                ev = self._event(str(c), r, phase, action, kept, why,
                                 reason=self.refusing[c], **extra)
            else:
                action = ("uploaded" if c in got else "dropped" if c in in_cohort
                          else "not_sampled")
                ev = self._event(str(c), r, phase, action, kept, why, **extra)
            self._round.setdefault(str(c), []).append(ev)

    def refused(self, client: int, reason: str) -> None:
        """Note that ``client`` refused this round on its own (a Flower node whose budget
        is spent; the server does not hold it): booked as a refusal by
        :meth:`record_phase`, and the client leaves the population at :meth:`end_round`
        (a client that left already but was in a cohort drawn before it left is booked as
        refusing again)."""
        if client in self.clients:
            self.refusing[client] = reason

    def end_round(self, r: int) -> None:
        """Write the round's events (one write per client) and let the clients that
        refused leave the population."""
        for cid, evs in self._round.items():
            self.ledgers[cid].extend(evs)
        self._round = {}
        if self.refusing:
            self.active = [c for c in self.active if c not in self.refusing]

    def filter_state(self, client: int | str) -> dict[str, Any]:
        """A client's individual-filter state kept on its side: read from
        ``client-<id>.filter.json`` in the ledger directory (empty when none)."""
        if self.directory is None:
            return {}
        p = self.directory / f"client-{client}.filter.json"
        return dict(json.loads(p.read_text())) if p.exists() else {}

    def save_filter_state(self, client: int | str, state: Mapping[str, Any]) -> None:
        """Write a client's individual-filter state beside its ledger (nothing without a
        ledger directory)."""
        if self.directory is None or not state:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        p = self.directory / f"client-{client}.filter.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(state), sort_keys=True))
        os.replace(tmp, p)

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Client id -> :func:`client_summary` over its whole ledger (every run)."""
        return {str(c): client_summary(self.ledgers[str(c)].events, self.delta)
                for c in self.clients}


# ------------------------------------------------------------------ data-dependent filters


class UnsoundFilter(PrivacyError):
    """A data-dependent (individual) filter that no theorem makes sound, e.g. PLD."""


#: The individual filters with a soundness theorem for adaptively chosen, data-dependent
#: per-round losses: Renyi (Feldman and Zrnic, NeurIPS 2021) and Gaussian DP (Smith and
#: Thakurta 2022; Koskela, Tobaben and Honkela, ICLR 2023).
FILTER_KINDS: tuple[str, ...] = ("rdp", "gdp")


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP (Dong, Roth, Su 2022, Cor. 2.13):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0:
        return 0.0
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * _phi(-epsilon / mu - mu / 2)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu for which mu-GDP implies (epsilon, delta)-DP (bisection)."""
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) < delta:
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            break
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with mu-GDP => (epsilon, delta)-DP (bisection)."""
    if mu <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class IndividualFilter:
    """A per-client filter charging each round from the client's actual clipped update:
    a Gaussian release with per-field noise sigma_f charges mu_t = sqrt(sum_f
    ||u_f||^2 / sigma_f^2) (its individual sensitivity over the noise). The filter lets a
    round through only while the total stays within budget, so the client is stopped
    exactly before its budget would be crossed; after that it sends zeros (under a secure
    sum, a masked zero the server cannot tell apart), which is what a neighbour without
    its data sends, so the filter theorem applies.

    * ``"gdp"``: sum mu_t^2 <= mu_B^2, mu_B the mu-GDP that gives (epsilon, delta) (fully
      adaptive GDP composition, Smith and Thakurta 2022; the individual GDP filter of
      Koskela et al., ICLR 2023).
    * ``"rdp"``: at one order a, sum a mu_t^2 / 2 <= epsilon - log(1/delta) / (a - 1)
      (Feldman and Zrnic, NeurIPS 2021, Renyi filter).

    ``"pld"`` is refused (:class:`UnsoundFilter`). Such epsilons depend on the client's
    data: they stay on the client (its state), never in the server's result, logs or
    transcript. No amplification by sampling is used.
    """

    kind: str
    epsilon: float
    delta: float
    order: float = 32.0

    def __post_init__(self) -> None:
        if self.kind == "pld":
            raise UnsoundFilter(
                "a data-dependent filter cannot use the PLD accountant: no filter theorem "
                "bounds an adaptively stopped composition of data-dependent privacy loss "
                "distributions; use 'rdp' (Feldman and Zrnic 2021) or 'gdp' (Koskela et al. "
                "2023)")
        if self.kind not in FILTER_KINDS:
            raise PrivacyError(f"filter kind must be one of {FILTER_KINDS}, got {self.kind!r}")
        positive_or_none("client budget epsilon", self.epsilon)
        _check_delta(self.delta)
        if not (isinstance(self.order, (int, float)) and self.order > 1):
            raise PrivacyError(f"RDP order must be > 1, got {self.order!r}")
        if self.capacity <= 0:
            raise PrivacyError(f"an RDP filter at order {self.order:g} has no room for "
                               f"epsilon {self.epsilon:g} at delta {self.delta:g}: "
                               "log(1/delta)/(order - 1) exceeds it; raise the order")

    @property
    def capacity(self) -> float:
        """The filter's budget: mu_B^2 (GDP) or the RDP at its order."""
        if self.kind == "gdp":
            return gdp_mu(self.epsilon, self.delta) ** 2
        return self.epsilon - math.log(1 / self.delta) / (self.order - 1)

    def cost(self, mu: float) -> float:
        """What a round of individual GDP ``mu`` charges."""
        return mu * mu if self.kind == "gdp" else self.order * mu * mu / 2

    def spent_epsilon(self, spent: float) -> float:
        """The (epsilon at this filter's delta) of a charge total ``spent``."""
        if self.kind == "gdp":
            return gdp_epsilon(math.sqrt(max(spent, 0.0)), self.delta)
        return spent + math.log(1 / self.delta) / (self.order - 1) if spent > 0 else 0.0

    def check_layer(self, layer: Any) -> None:
        """Refuse a layer whose release is not one Gaussian per round (the filter charges
        each round's individual Gaussian): CentralDP without a tree, or LocalDP.

        Raises:
            ConfigurationError: another layer."""
        from secagg.errors import ConfigurationError
        from secagg.privacy.layers import CentralDP, LocalDP

        if not (isinstance(layer, LocalDP) or (isinstance(layer, CentralDP)
                                               and not layer.tree)):
            raise ConfigurationError(
                "an individual filter charges a Gaussian release per round: it needs "
                "CentralDP (without a tree) or LocalDP, not "
                f"{getattr(layer, 'name', type(layer).__name__)!r}")

    def step(self, state: dict[str, Any], mu: float) -> bool:
        """Charge a round of individual ``mu`` to ``state`` (the client's own: ``spent``,
        ``halted``) if it fits; returns whether the round may be released. Once a round
        does not fit, the client halts for good."""
        if state.get("halted"):
            return False
        spent = float(state.get("spent", 0.0))
        if spent + self.cost(mu) > self.capacity:
            state["halted"] = True
            return False
        state["spent"] = spent + self.cost(mu)
        return True


def individual_mu(layer: Any, spec: Any, values: Mapping[str, Any]) -> float:
    """A round's individual GDP for one client's upload ``values`` under the Gaussian DP
    ``layer`` (CentralDP without a tree, or LocalDP): sqrt(sum_f ||u_f||^2 / sigma_f^2)
    over the noised fields.

    Raises:
        PrivacyError: a layer whose noise is not one Gaussian per release."""
    import numpy as np

    from secagg.privacy.layers import CentralDP, LocalDP

    if isinstance(layer, LocalDP):
        sigmas, _ = layer.noise_plan(spec)
    elif isinstance(layer, CentralDP) and not layer.tree:
        sigmas = layer.planned_sum_sigmas(spec, 1)
    else:
        raise PrivacyError(f"an individual filter needs a Gaussian release per round "
                           f"(CentralDP without a tree, or LocalDP), not "
                           f"{getattr(layer, 'name', type(layer).__name__)!r}")
    total = 0.0
    for name, sigma in sigmas.items():
        v = np.asarray(values[name], dtype=np.float64)
        total += float(np.sum(v * v)) / (sigma * sigma)
    return math.sqrt(total)
