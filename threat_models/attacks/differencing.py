"""Differencing across cohorts: a client's upload from exact sums over changing cohorts.

The coalition (the server) keeps every round's sum of a round-invariant field (a client's
record count, its label histogram: :meth:`algorithms.base.Phase.round_invariant_fields`)
and the cohort that produced it. Two sums over cohorts that differ by one client give
that client's value by subtraction; in general client c's value is ``w @ sums`` for the
least-norm weights w of :func:`threat_models.differencing.determined` (when its unit
vector lies in the row space of the cohort-incidence matrix). Exact sums (SecureSum,
Homomorphic, Plaintext, what a CentralDP aggregator sees) give the value in the clear; sums
noised before the server sees them (LocalDP, DistributedDP) give it with an error of
standard deviation ``||w|| sigma`` per entry (at least sqrt(2) sigma for two releases:
the noise scale, which is what DP promises).

What it uses: the sums the coalition observed and the senders of each round (the server
knows its cohorts), nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError
from secagg.messages import UploadSpec
from secagg.transcript import Transcript
from threat_models.attacks.common import AttackResult, observed
from threat_models.differencing import cohorts as round_cohorts
from threat_models.differencing import determined

__all__ = ["DifferencingResult", "difference", "differencing"]


@dataclass
class DifferencingResult(AttackResult):
    """An :class:`AttackResult` with, per estimated client, ``||w||``: the factor by which
    the estimate's noise std exceeds one sum's (0 noise for exact sums)."""

    amplification: dict[int, float] = field(default_factory=dict)


def difference(cohorts: Sequence[Collection[int]], sums: Sequence[np.ndarray],
               name: str = "differencing", basis: str = "differenced exact sums"
               ) -> DifferencingResult:
    """Each client's value from ``sums[k]``, the sum over ``cohorts[k]`` of a
    round-invariant value: estimates for the clients the cohorts determine
    (:func:`~threat_models.differencing.determined`), none for the others. The result's
    ``amplification`` maps each client to ``||w||``: the estimate's noise is ``||w||``
    times a sum's noise std.

    Raises:
        ConfigurationError: cohorts and sums of different lengths or shapes.
    """
    if len(cohorts) != len(sums):
        raise ConfigurationError(f"{len(cohorts)} cohorts but {len(sums)} sums")
    arrays = [np.asarray(s, dtype=np.float64) for s in sums]
    if len({a.shape for a in arrays}) > 1:
        raise ConfigurationError("the sums have different shapes: not one field")
    res = DifferencingResult(name, basis)
    if not arrays:
        return res
    stack = np.stack(arrays)
    for c, w in determined(cohorts).items():
        res.estimates[c] = np.tensordot(w, stack, axes=1)
        res.amplification[c] = float(np.linalg.norm(w))
    return res


def differencing(transcript: Transcript, coalition: Any, phase: str, field: str,
                 spec: UploadSpec | None = None) -> DifferencingResult:
    """The differencing attack on a recorded run (``include_values=True``): every round's
    sum of ``phase``/``field`` that ``coalition`` observed (a secure sum's ring sum is
    decoded with the public ``spec``), with that round's senders as its cohort.

    Raises:
        ConfigurationError: no values, or no sum of the field was observed.
    """
    by_round = round_cohorts(transcript, phase, field)
    groups: list[list[int]] = []
    sums: list[np.ndarray] = []
    forms: set[str] = set()
    for rnd, cohort in by_round.items():
        obs = observed(transcript, coalition, phase, field, round=rnd, spec=spec)
        if obs.sum is None or not cohort:
            continue
        groups.append(cohort)
        sums.append(obs.sum)
        forms.add(obs.sum_form)
    if not sums:
        raise ConfigurationError(f"the coalition observed no sum of {phase}/{field} (a "
                                 "secure sum needs the phase's spec to be decoded)")
    basis = "differenced noised sums" if "noised" in forms else "differenced exact sums"
    return difference(groups, sums, basis=basis)
