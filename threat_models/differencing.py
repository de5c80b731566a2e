"""Differencing across cohorts: exact sums of a round-invariant field over changing cohorts.

A secure sum hides single uploads within one release. It does not hide them across
releases: if a field's value for each client is the same in every round (its record count,
its label histogram: :meth:`algorithms.base.Phase.round_invariant_fields`) and the
coalition reads its exact sum over cohort A in one round and over cohort B in another, then
``S_A - S_B`` is the sum over A \\ B minus the sum over B \\ A. When the cohorts differ by one
client (a dropout, a retried or resumed phase, a client that joins late), that is the
client's upload in the clear; with more rounds of client sampling, the sums are a linear
system ``M x = S`` (M the 0/1 cohort-incidence matrix, one row per release) and client c's
value is determined exactly when the unit vector e_c lies in the row space of M: then
``x_c = w^T S`` for the least-norm w with ``M^T w = e_c`` (:func:`determined`).

The rule, applied to a plan (:func:`plan_risks`, used by :func:`threat_models.admissible`)
and to a transcript (:func:`transcript_risks`, used by ``secagg audit --threat``):

  a (phase, field) is flagged when (1) the algorithm declares the field round-invariant,
  (2) the coalition reads its sum *exactly* (the server in the coalition and no DP noise
  on the field before the server sees it: Plaintext, SecureSum, Homomorphic, CentralDP,
  or a field a DP layer lists as public), (3) it is released in two or more rounds, and
  (4) the cohorts can differ between those releases (a plan: client sampling with
  fraction < 1, or dropouts; a transcript: the observed cohorts determine some client's
  value, which is then named).

LocalDP and DistributedDP noise the field before any coalition sees it, so differencing
yields the value plus noise of standard deviation ``||w|| sigma`` per entry (sqrt(2) sigma
for two releases), and the privacy ledger composes the releases: not flagged. (An
outside observer of released noised sums is likewise covered by the DP guarantee.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from threat_models.coalition import Coalition

__all__ = ["DifferencingRisk", "cohorts", "determined", "exact_sum_for", "invariant_fields",
           "plan_risks", "transcript_risks"]

_EXACT = ("plaintext", "secure-sum", "homomorphic")


@dataclass(frozen=True)
class DifferencingRisk:
    """A round-invariant field whose exact sums a coalition can difference.

    Attributes:
        phase, field: which field.
        reason: why, in words (quoted in verdicts and audits).
        clients: the clients whose value the observed cohorts determine (a transcript;
            empty for a plan, where it depends on the sampled cohorts).
    """

    phase: str
    field: str
    reason: str
    clients: tuple[int, ...] = ()


def determined(cohorts: Sequence[Collection[int]], tol: float = 1e-8) -> dict[int, np.ndarray]:
    """Client -> the least-norm weights w (one per release) with sum_k w_k 1[c in cohort_k]
    = 1[c' = c] for every client c': ``w @ sums`` is then client c's value exactly when the
    sums are exact, and its value plus noise of std ``||w|| sigma`` when each sum carries
    independent noise of std sigma. Only clients whose unit vector lies in the row space of
    the cohort-incidence matrix appear."""
    clients = sorted({int(c) for k in cohorts for c in k})
    if len(cohorts) < 2 or not clients:
        return {}
    index = {c: i for i, c in enumerate(clients)}
    m = np.zeros((len(cohorts), len(clients)))
    for r, k in enumerate(cohorts):
        for c in k:
            m[r, index[int(c)]] = 1.0
    out: dict[int, np.ndarray] = {}
    pinv = np.linalg.pinv(m.T)  # least-norm solutions of M^T w = e_c
    for c, i in index.items():
        w = pinv[:, i]
        e = np.zeros(len(clients))
        e[i] = 1.0
        if np.linalg.norm(m.T @ w - e) < tol:
            out[c] = w
    return out


def exact_sum_for(desc: Mapping[str, Any], field: str, group: str,
                  threat: Coalition) -> bool:
    """True when ``threat`` reads the exact (un-noised) sum of ``field`` under the layer
    described by ``desc`` (``layer.describe()``)."""
    if not threat.has_server:
        return False
    name = desc.get("name")
    if name == "per-group":
        routed = desc.get("routes", {}).get(group, desc.get("default"))
        return routed is not None and exact_sum_for(routed, field, group, threat)
    if name in _EXACT or name == "central-dp":  # central DP: the server noises after seeing
        return True
    if name in ("local-dp", "distributed-dp"):
        return field in desc.get("public", ()) and exact_sum_for(
            desc.get("inner", {}), field, group, threat)
    return True  # an unknown layer: not known to noise it


def invariant_fields(algorithm: Any, rounds: int) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Phase name -> (rounds that release it, the fields it declares round-invariant),
    over ``rounds`` rounds of ``algorithm`` (after ``setup``)."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    for r in range(rounds):
        for ph in algorithm.phases(r, rounds):
            if not ph.spec().fields:
                continue  # a local phase releases nothing
            count, fields = out.get(ph.name, (0, ()))
            fn = getattr(ph, "round_invariant_fields", None)  # duck-typed phases: none
            declared = tuple(fn()) if callable(fn) else ()
            out[ph.name] = (count + 1, tuple(dict.fromkeys(fields + declared)))
    return out


def plan_risks(algorithm: Any, layer: Any, threat: Coalition, *, rounds: int,
               fraction: float = 1.0, dropouts: bool = False
               ) -> dict[tuple[str, str], DifferencingRisk]:
    """The differencing risks of a planned run (module docstring's rule): ``rounds`` rounds,
    cohorts of ``fraction`` of the clients (< 1: samplings differ), ``dropouts`` (True:
    clients may drop between rounds, or a phase may be retried with another cohort)."""
    if fraction >= 1.0 and not dropouts:
        return {}
    desc = layer if isinstance(layer, Mapping) else layer.describe()
    why = (f"client sampling (fraction {fraction:.3g})" if fraction < 1.0
           else "dropouts or a retried phase")
    out: dict[tuple[str, str], DifferencingRisk] = {}
    for phase, (count, fields) in invariant_fields(algorithm, rounds).items():
        if count < 2:
            continue
        spec = {f.name: f for ph in algorithm.phases(0, rounds) if ph.name == phase
                for f in ph.spec().fields}
        for name in fields:
            group = spec[name].group if name in spec else "default"
            if not exact_sum_for(desc, name, group, threat):
                continue
            out[(phase, name)] = DifferencingRisk(
                phase, name,
                f"{name!r} is round-invariant and released as an exact sum in {count} rounds "
                f"over cohorts that differ through {why}: differencing two sums over cohorts "
                "that differ by one client gives that client's value (more samplings solve "
                "for more clients); release it once, or noise it with LocalDP/DistributedDP")
    return out


def cohorts(transcript: Any, phase: str, field: str) -> dict[int, list[int]]:
    """Round -> the clients whose uploads of ``phase``/``field`` the run recorded (the
    cohort of that round's sum); for a round where the field's uploads travelled under a
    layer's own label (a DistributedDP release), the senders of any upload of the phase."""
    mine: dict[int, set[int]] = {}
    phase_senders: dict[int, set[int]] = {}
    rounds: set[int] = set()
    for r in transcript.observations():
        if r["phase"] != phase:
            continue
        rnd = int(r["round"])
        if r["field"] == field:
            rounds.add(rnd)
        if r["what"] == "upload" and isinstance(r["sender"], int):
            phase_senders.setdefault(rnd, set()).add(int(r["sender"]))
            if r["field"] == field:
                mine.setdefault(rnd, set()).add(int(r["sender"]))
    return {k: sorted(mine.get(k) or phase_senders.get(k, set())) for k in sorted(rounds)}


def transcript_risks(transcript: Any, threat: Coalition | str
                     ) -> dict[tuple[str, str], DifferencingRisk]:
    """The differencing risks of a recorded run: each field the run's header declares
    round-invariant (``round_invariant``: phase -> fields, written by the engine), read as
    an exact sum by ``threat``, over observed cohorts that determine some client's value
    (:func:`determined`)."""
    th = Coalition.parse(threat) if isinstance(threat, str) else threat
    head = next((r for r in transcript.records if r.get("type") == "run"), {})
    desc = head.get("layer", {})
    out: dict[tuple[str, str], DifferencingRisk] = {}
    for phase, fields in (head.get("round_invariant") or {}).items():
        for name in fields:
            if not exact_sum_for(desc, name, "default", th):
                continue
            by_round = cohorts(transcript, phase, name)
            rounds = [r for r in by_round if by_round[r]]
            got = determined([by_round[r] for r in rounds])
            if not got:
                continue
            example = _pair(by_round)
            how = (f"rounds {example[0]} and {example[1]} differ only by client {example[2]}"
                   if example else f"a combination of the {len(rounds)} sums isolates each")
            out[(phase, name)] = DifferencingRisk(
                phase, name,
                f"round-invariant {name!r} was released as an exact sum over {len(rounds)} "
                f"cohorts that determine the value of {len(got)} client(s) {sorted(got)} "
                f"by differencing ({how})", tuple(sorted(got)))
    return out


def _pair(by_round: Mapping[int, list[int]]) -> tuple[int, int, int] | None:
    """Two rounds whose cohorts differ by exactly one client, and that client."""
    items = list(by_round.items())
    for i, (r1, a) in enumerate(items):
        for r2, b in items[i + 1:]:
            diff = set(a) ^ set(b)
            if len(diff) == 1:
                return r1, r2, diff.pop()
    return None
