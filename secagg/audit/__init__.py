"""Audit a transcript: per phase and field, who sent what, what each party saw, under which
DP guarantee, and what the traffic cost.

:func:`audit` condenses a :class:`~secagg.transcript.Transcript` into

* ``complete``: whether the transcript's closing record matches its body (a truncated or
  altered transcript is reported as incomplete, with the reason);
* ``traffic``: messages and framed wire bytes per direction (``up``, ``down``,
  ``internal``) and per (phase, direction), from the transcript's ``message`` records --
  the same figures, by construction, as the run's ``costs.csv``;
* ``fields``: one entry per (phase, field): the clients that sent it, the form in which
  each party saw it (``server: masked upload x20, noised sum x2``), the bytes of the field
  as uploaded, the DP guarantee (mechanism, noise, adjacency, epsilon at delta, or why there
  is none) and notes;
* ``privacy``: the transcript's privacy records;
* ``attestation``: with public keys held outside the transcript (``identities``), every
  problem :func:`secagg.attest.verify` finds (missing, forged or contradicted statements,
  replaced keys), each naming its record; without them, None: the transcript is then
  *unattested* -- whatever it says was written by the server and only checked for
  accidental damage.

:func:`format_audit` prints it as text.

One concept per module, every public name importable from this package: the summary
(:mod:`.summary`), the checks against what the parties signed (:mod:`.attested`), the
text (:mod:`.text`) and the per-client epsilons (:mod:`.clients`).
"""

from __future__ import annotations

from secagg.audit.attested import check_privacy, signed_dp, trusted_root
from secagg.audit.clients import client_distribution, format_clients
from secagg.audit.summary import audit, reconcile, traffic
from secagg.audit.text import UNATTESTED, format_audit

__all__ = [
    "UNATTESTED",
    "audit",
    "check_privacy",
    "client_distribution",
    "format_audit",
    "format_clients",
    "reconcile",
    "signed_dp",
    "traffic",
    "trusted_root",
]
