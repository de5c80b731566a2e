"""One round of one client as its ledger keeps it: :class:`ClientEvent`, the observers and
actions it names, and the JSON form of the privacy events it carries
(:func:`event_to_dict`, :func:`event_from_dict`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    PrivacyEvent,
    SampledGaussianEvent,
    SkellamEvent,
)

#: Who a per-client epsilon holds against (see :mod:`secagg.privacy.client_ledger`).
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
    "skellam": ("l2_sensitivity", "l1_sensitivity", "variance", "dimension"),
}
#: parameters a ledger written before they existed may lack (read as the event's default:
#: a Skellam event without its dimension is charged by the published RDP bound)
_OPTIONAL_PARAMS: dict[str, tuple[str, ...]] = {"skellam": ("dimension",)}


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
    optional = _OPTIONAL_PARAMS.get(name, ())
    try:
        params = {k: d[k] for k in _EVENT_PARAMS[name] if k not in optional or k in d}
    except KeyError as exc:
        raise PrivacyError(f"{name} event without {exc.args[0]!r}: {dict(d)!r}") from None
    return _EVENT_TYPES[name](count=int(d.get("count", 1)), **params)  # type: ignore[call-arg]


@dataclass(frozen=True, kw_only=True)
class ClientEvent:
    """One round of one client, as its ledger keeps it (JSON-able; see
    :mod:`secagg.privacy.client_ledger`). Only ``events``, ``sampling``, ``sampling_rate``,
    ``colluders``, ``unprotected``, ``adjacency`` and ``action`` enter the epsilons; the
    rest describes.

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
