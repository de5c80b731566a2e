"""The embedded engine's per-client bookkeeping for a run: the eligible population, each
round's declared terms, every client's admission and its events.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.client_ledger.budget import ClientBudget
from secagg.privacy.client_ledger.epsilon import _check_delta, client_summary
from secagg.privacy.client_ledger.events import ClientEvent, event_to_dict
from secagg.privacy.client_ledger.storage import open_ledgers
from secagg.privacy.events import GaussianEvent, PrivacyEvent

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
