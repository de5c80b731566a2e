"""The engine's client accounts: each client's own privacy ledger, kept by the
:class:`~secagg.engine.Engine` through :class:`ClientAccountsMixin` -- the eligible population a
cohort is drawn from (:meth:`~ClientAccountsMixin._draw`), the round's declared terms and the
clients' admission, each phase booked in every eligible client's ledger, and the ledgers the
result reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from secagg.layers.base import Aggregate, Layer
from secagg.phase import ClientState, PhaseBase
from secagg.remote_layers import NODE_BUDGET_REFUSAL
from secagg.round_steps import RunState, cohort_size, run_spec

_Phase = PhaseBase


class ClientAccountsMixin:
    """The :class:`~secagg.engine.Engine`'s methods over its clients' accounts (``accounts``:
    a :class:`~secagg.privacy.client_ledger.ClientAccounts`, or None when no client keeps
    one). Moved here from the engine unchanged; they read the engine's attributes."""

    accounts: Any | None
    layer: Layer
    fraction: float
    sampling: str
    transport: Any
    client_ledgers: Any
    client_budget: Any
    client_policy: Any
    colluders: Any
    _max_records: int

    def _filter_state(self, st: ClientState) -> dict[str, Any]:
        """The client's own individual-filter state (loaded from its ledger directory the
        first time; never reported to the server)."""
        key = "individual_filter"
        if key not in st.state:
            st.state[key] = (self.accounts.filter_state(st.id)
                             if self.accounts is not None else {})
        return st.state[key]

    def _accounts(self, clients: list[int], run: RunState) -> Any | None:
        """The clients' ledgers for this run. Over a link: the server's view of them (no
        budget or policy here: each node admits itself, and a node's budget refusal
        reaches the server as a failed reply, see :meth:`_record_accounts`)."""
        from secagg.privacy.client_ledger import ClientAccounts

        delta = getattr(run.privacy, "delta", None) or getattr(self.layer, "delta", None)
        return ClientAccounts(
            clients, layer=self.layer, delta=float(delta or 1e-5),
            directory=self.client_ledgers, budget=self.client_budget,
            policy=self.client_policy, sampling=self.sampling, colluders=self.colluders)

    def _draw(self, rng: np.random.Generator, n: int) -> list[int]:
        """One round's cohort from the eligible population (the same draws as
        :func:`sample_cohort` while every client is eligible)."""
        assert self.accounts is not None
        pop = self.accounts.active
        if self.sampling == "poisson":
            return [pop[i] for i in np.flatnonzero(rng.random(len(pop)) < self.fraction)]
        k = min(cohort_size(n, self.fraction), len(pop))
        if k == len(pop):
            return list(pop)
        return sorted(pop[int(i)] for i in rng.choice(len(pop), size=k, replace=False))

    def _rate_and_cohort(self, n: int) -> tuple[float, int]:
        """(the chance each eligible client is drawn, the planned cohort size)."""
        assert self.accounts is not None
        pop = max(1, len(self.accounts.active))
        if self.sampling == "poisson":
            return self.fraction, max(1, int(round(self.fraction * pop)))
        k = min(cohort_size(n, self.fraction), pop)
        return k / pop, k

    def _denominator(self, cohort: Sequence[int]) -> int:
        """The mean's fixed denominator: the sampled cohort's size, or under Poisson
        sampling the expected one (never the number of replies)."""
        if self.accounts is None or self.sampling != "poisson":
            return len(cohort)
        return self._rate_and_cohort(len(self.accounts.clients))[1]

    def _begin_accounts(self, r: int, phases: Sequence[_Phase], checked: set[str],
                        n: int) -> None:
        """Declare the round's terms to the clients and run their admission."""
        assert self.accounts is not None
        infos = []
        for ph in phases:
            if not ph.spec().fields:
                continue
            spec = run_spec(ph, self.layer, self._max_records, checked)
            infos.append((ph.name, spec, tuple(ph.dp_covered_fields())))
        rate, k = self._rate_and_cohort(n)
        self.accounts.begin_round(r, infos, rate, k)

    def _record_accounts(self, run: RunState, phase: _Phase, cohort: list[int],
                         agg: Aggregate, payload: Mapping[str, np.ndarray],
                         booked: int) -> None:
        """Book the phase in every eligible client's ledger: the events the run's ledger
        charged for it, and why an observer has no guarantee."""
        assert self.accounts is not None
        from secagg.privacy.events import SampledGaussianEvent

        events = [] if run.privacy is None else list(run.privacy.events[booked:])
        why: dict[str, str] = {}
        bare = [f for (ph, f) in run.unnoised if ph == phase.name]
        if bare:
            reason = run.unnoised[(phase.name, bare[0])]
            text = f"field {bare[0]!r} released without DP noise ({reason})"
            why = {"release": text, "server": text}
        notes = agg.notes.get("dp", {}) if isinstance(agg.notes, Mapping) else {}
        if self.transport.link is not None:
            # a node that refused by its own budget leaves the population (end_round)
            dropped = agg.notes.get("dropped", {}) if isinstance(agg.notes, Mapping) else {}
            for whys in dropped.values():
                for c, text in (whys.items() if isinstance(whys, Mapping) else ()):
                    if NODE_BUDGET_REFUSAL in str(text) and c in cohort:
                        self.accounts.refused(int(c), str(text))
        clip = payload.get("clip")
        local = next(((e.steps, e.sampling_rate) for e in events
                      if isinstance(e, SampledGaussianEvent)), None)
        self.accounts.record_phase(
            int(agg.round), phase.name, cohort, agg.contributors, events, why,
            clip=None if clip is None else float(np.asarray(clip).ravel()[0]),
            survivors=notes.get("survivors"), min_survivors=notes.get("min_survivors"),
            local=local)

    def _reported_accounts(self, run: RunState) -> Any | None:
        """The clients' ledgers the result reports: for a DP run, or when ledgers, a
        budget or a policy were asked for."""
        acc = self.accounts
        if acc is None:
            return None
        asked = (self.client_ledgers is not None or self.client_budget is not None
                 or self.client_policy is not None)
        return acc if (run.privacy is not None or asked) else None
