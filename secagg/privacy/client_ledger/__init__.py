"""Each client's own privacy ledger: events, not epsilons, and the epsilon per observer.

A run's :class:`~secagg.privacy.accountant.PrivacyLedger` gives one epsilon for the worst
client over every release. This package keeps, per client, what actually happened to it in
every round it was eligible for, so that its own epsilon can be computed -- and recomputed
later with another accountant -- against each observer separately.

API (stable; new names are added, none renamed), importable from this package; each
concept has its own module:

* :mod:`.events` -- :class:`ClientEvent`: one round of one client: run, round, phase, what
  the client did (:data:`ACTIONS`), the mechanism and its parameters (noise multiplier,
  clip, the cohort sampling and its rate, the eligible population, the cohort size,
  survivors and minimum survivors under DistributedDP, the tolerated colluders), the
  adjacency, the layer, the privacy events of the release (``events``: JSON dicts of
  :class:`~secagg.privacy.events.PrivacyEvent`, one application each, DP-SGD's
  record-level events included) and, per observer, why no guarantee holds
  (``unprotected``). ``to_dict`` / ``from_dict`` / ``to_json`` / ``from_json`` round-trip
  it exactly.
* :mod:`.epsilon` -- :func:`release_epsilon`, :func:`server_epsilon`,
  :func:`client_epsilons`: the client's epsilon against each :data:`OBSERVERS` at a delta,
  as an :class:`ObserverEpsilon` (``epsilon`` None with a ``reason`` where there is no
  guarantee); :func:`charged_events`: the :class:`PrivacyEvent` list an observer's figure
  composes (to recompute it with any accountant); :func:`group_epsilon`: the epsilon of a
  set of clients held by one organisation, from the group's sensitivity (never the sum of
  single-client epsilons).
* :mod:`.budget` -- :class:`ClientBudget`, :class:`Admission`, :func:`project`,
  :func:`admit`: a budget per observer, and the check a client runs before it touches its
  data in a round: the projected epsilons with the round's declared terms added, refused
  when over budget.
* :mod:`.storage` -- :class:`ClientLedger`: one client's events, append-only on disk as
  JSON lines (:meth:`ClientLedger.open` / :meth:`ClientLedger.append` /
  :meth:`ClientLedger.extend`), and :func:`open_ledgers` for a directory of them (one file
  per client).
* :mod:`.accounts` -- :class:`ClientAccounts`, :func:`declared_release`: the embedded
  engine's side: the eligible population, the round's declared terms, every client's
  admission and events.
* :mod:`.filters` -- :class:`IndividualFilter`, :func:`individual_mu`,
  :class:`UnsoundFilter`: optional data-dependent accounting from each round's actual
  clipped update, through a Renyi or Gaussian-DP filter that stops the client exactly
  before its budget is crossed (PLD is refused); its figures stay on the client.

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

from secagg.privacy.client_ledger.accounts import (
    CENTRAL_DP_SERVER,
    ClientAccounts,
    declared_release,
)
from secagg.privacy.client_ledger.budget import Admission, ClientBudget, admit, project
from secagg.privacy.client_ledger.epsilon import (
    ObserverEpsilon,
    charged_events,
    client_epsilons,
    client_summary,
    group_epsilon,
    release_epsilon,
    server_epsilon,
)
from secagg.privacy.client_ledger.events import (
    ACTIONS,
    CHARGED_IF_SAMPLED,
    OBSERVERS,
    ClientEvent,
    event_from_dict,
    event_to_dict,
)
from secagg.privacy.client_ledger.filters import (
    FILTER_KINDS,
    IndividualFilter,
    UnsoundFilter,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    individual_mu,
)
from secagg.privacy.client_ledger.storage import ClientLedger, open_ledgers

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
