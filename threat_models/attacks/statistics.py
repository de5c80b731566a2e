"""Attacks on per-class statistics: label histograms, class prototypes, single records.

Many uploads are per-class sums: FedLog's ``stats[c] = sum over class-c records of
[1, phi]`` (column 0 is the class count), CCVR's ``counts``/``sums``/``outer`` moments,
SphereFed's ``U = sum z onehot(y)^T`` (z unit-norm). Read one client's upload in the clear
and its label histogram is a column away, its class prototypes (mean feature per class)
are a division away, and when it holds a single record of some class, that record's
feature vector is the row itself. Under a summing layer the coalition reads only the sum
over the cohort, and the best per-client guess is the mean share.

Every function takes the transcript and a coalition (a party, a :class:`ThreatModel` or a
name like ``"server+3"``) and returns an :class:`AttackResult`; ``spec`` (the phase's public
UploadSpec, with ``max_records``) lets it decode a secure sum as the server does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from secagg.errors import ConfigurationError
from secagg.messages import UploadSpec
from secagg.transcript import Transcript
from threat_models.attacks.common import AttackResult, observed, per_client

# algorithm name -> (phase, field holding per-class counts, how to read them)
COUNT_SOURCES = {"fedlog": ("stats", "stats"), "ccvr": ("moments", "counts"),
                 "spherefed": ("ffc", "U")}


def _algorithm(transcript: Transcript) -> str:
    head = next((r for r in transcript.records if r.get("type") == "run"), {})
    return str(head.get("algorithm", {}).get("name", ""))


def _counts_from(algo: str, value: np.ndarray) -> np.ndarray:
    if algo == "fedlog":
        return np.rint(np.clip(value[:, 0], 0, None)).astype(np.int64)
    if algo == "ccvr":
        return np.rint(np.clip(value, 0, None)).astype(np.int64)
    # SphereFed: column c of U is the sum of class-c unit features; its norm is <= n_c with
    # equality when they all point one way (trained features cluster by class)
    return np.rint(np.linalg.norm(value, axis=0)).astype(np.int64)


def label_histograms(transcript: Transcript, coalition: Any = "server",
                     round: int | None = None, spec: UploadSpec | None = None) -> AttackResult:
    """Each client's label histogram from its per-class counts (FedLog ``stats[:, 0]``,
    CCVR ``counts``, SphereFed ``||U[:, c]||`` — exact zeros, so exact label presence, and a
    lower bound on each count).

    Raises:
        ConfigurationError: the run's algorithm uploads no per-class counts.
    """
    algo = _algorithm(transcript)
    if algo not in COUNT_SOURCES:
        raise ConfigurationError(
            f"no label-histogram attack for algorithm {algo!r}; supported: "
            f"{', '.join(sorted(COUNT_SOURCES))}")
    phase, field = COUNT_SOURCES[algo]
    obs = observed(transcript, coalition, phase, field, round, spec)
    return per_client(obs, lambda v: _counts_from(algo, v), "label histogram")


def _class_means(counts: np.ndarray, sums: np.ndarray) -> dict[int, np.ndarray]:
    return {int(c): sums[c] / counts[c] for c in range(len(counts)) if counts[c] >= 0.5}


def class_prototypes(transcript: Transcript, coalition: Any = "server",
                     round: int | None = None, spec: UploadSpec | None = None) -> AttackResult:
    """Each client's class prototypes (class -> mean feature) from its class sums: FedLog
    ``stats[c, 1:] / stats[c, 0]``, CCVR ``sums[c] / counts[c]``."""
    algo = _algorithm(transcript)
    if algo == "fedlog":
        obs = observed(transcript, coalition, "stats", "stats", round, spec)
        return per_client(obs, lambda v: _class_means(v[:, 0], v[:, 1:]), "class prototypes")
    if algo == "ccvr":
        counts = observed(transcript, coalition, "moments", "counts", round, spec)
        sums = observed(transcript, coalition, "moments", "sums", round, spec)
        if counts.uploads and sums.uploads:
            est = {c: _class_means(counts.uploads[c], sums.uploads[c])
                   for c in counts.uploads if c in sums.uploads}
            return AttackResult("class prototypes",
                                "clear uploads" if counts.form == "clear" else "noised uploads",
                                est)
        if counts.sum is not None and sums.sum is not None and counts.contributors:
            k = len(counts.contributors)
            share = _class_means(counts.sum / k, sums.sum / k)
            return AttackResult("class prototypes", "sum",
                                {c: share for c in counts.contributors})
        return AttackResult("class prototypes", "nothing", {})
    raise ConfigurationError(f"no class-prototype attack for algorithm {algo!r} "
                             "(supported: fedlog, ccvr)")


def single_records(transcript: Transcript, coalition: Any = "server",
                   round: int | None = None, spec: UploadSpec | None = None) -> AttackResult:
    """The exact feature vector of every record that is alone in its class at its client
    (FedLog: a ``stats`` row with count 1 is ``[1, phi]``). Estimates: client ->
    {class: phi}. From a sum alone a class count of 1 over the whole cohort is needed."""
    if _algorithm(transcript) != "fedlog":
        raise ConfigurationError("the single-record attack reads FedLog's stats")
    obs = observed(transcript, coalition, "stats", "stats", round, spec)

    def singles(v: np.ndarray) -> dict[int, np.ndarray]:
        return {int(c): v[c, 1:] for c in range(v.shape[0]) if abs(v[c, 0] - 1.0) < 1e-9}

    if obs.uploads:
        return AttackResult("single record", "clear uploads" if obs.form == "clear"
                            else "noised uploads",
                            {c: singles(v) for c, v in obs.uploads.items()})
    if obs.sum is not None:
        # a record alone in its class over the whole cohort: its owner is unknown, so the
        # coalition cannot attribute it; report it for every contributor
        found = singles(obs.sum)
        return AttackResult("single record", "sum",
                            {c: found for c in obs.contributors} if found else {})
    return AttackResult("single record", "nothing", {})
