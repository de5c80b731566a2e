"""Planning a run, before round 0: the DP layer's noise and privacy ledger
(:func:`plan_privacy`), the threat model's check (:func:`check_threat`), the warning for a
release whose noise swamps its signal (:func:`warn_swamped`), and the fields a phase declares
the same in every round (:func:`round_invariant`)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from secagg.errors import (
    InadmissibleField,
    PrivacyError,
)
from secagg.layers.base import Layer
from secagg.messages import UploadSpec
from secagg.phase import PhaseBase

if TYPE_CHECKING:
    pass

from secagg.round_steps import AlgorithmLike, cohort_size

_Phase = PhaseBase


def plan_privacy(algorithm: AlgorithmLike, layer: Layer, rounds: int,
                 max_records_given: bool) -> Any | None:
    """What every runtime does before round 0 of a run: a DP layer calibrates its noise for
    the run's real release count (every phase with upload fields, in every round:
    ``plan_releases``), every phase's DP sensitivity is checked against what its clients
    trained (:func:`~secagg.privacy.sensitivity.check_training_adjacency`; a per-record
    bound on trained uploads is refused here, before anything is released), and the run
    gets a fresh privacy ledger from the layer (None for a layer that adds no DP noise).

    Args:
        max_records_given: whether a public max_records bound was given (client-level DP
            on a record-level bound needs one).
    """
    released = [ph.name for r in range(rounds) for ph in algorithm.phases(r, rounds)
                if ph.spec().fields]
    plan = getattr(layer, "plan_releases", None)
    if callable(plan):  # DP layers calibrate their noise for the run's release count
        plan(len(released))
    phases = getattr(layer, "plan_phases", None)
    if callable(phases):  # e.g. DP-FTRL's one tree refuses releases of several phases
        phases(released)
    from secagg.privacy.clipping import AdaptiveClip

    if getattr(layer, "tree", False) and isinstance(
            algorithm.clip_policy, AdaptiveClip):
        raise PrivacyError(  # refused here, not after round 0's training
            f"{layer.name}: DP-FTRL's tree needs the same bound in every round, but the "
            "algorithm's clip is adaptive (its bound moves each round); use a fixed clip "
            "(e.g. --clip 1.0) with the tree, or adaptive clipping without --dp-ftrl")
    from secagg.privacy.sensitivity import check_training_adjacency, dp_adjacency

    seen: set[tuple[Any, ...]] = set()
    for r in range(rounds):
        for phase in algorithm.phases(r, rounds):
            trained = tuple(phase.trained_fields())
            dpsgd = bool(phase.trained_with_dpsgd())
            if (phase.name, trained, dpsgd) in seen:
                continue
            seen.add((phase.name, trained, dpsgd))
            spec = phase.spec()
            check_training_adjacency(
                phase.name, spec, trained, dp_adjacency(layer, spec), dpsgd,
                phase.training_note,
                max_records_given or spec.max_records is not None)
    maker = getattr(layer, "make_privacy_ledger", None)
    return maker() if callable(maker) else None


def check_threat(algorithm: AlgorithmLike, layer: Layer, threat: Any, rounds: int,
                 n_clients: int, fraction: float, max_records: int,
                 allow_leaks: bool, may_drop: bool = False) -> list[str]:
    """Judge every phase's fields against ``threat`` (``check(algorithm, layer, specs,
    n_clients, rounds=, fraction=, dropouts=)`` returning per-field verdicts; the last
    three let it judge differencing across cohorts); raise InadmissibleField for the first
    unprotected one unless ``allow_leaks`` (then return them all, as text)."""
    specs: dict[str, UploadSpec] = {}
    for r in range(rounds):
        for ph in algorithm.phases(r, rounds):
            if ph.name not in specs:
                spec = ph.spec()
                specs[ph.name] = spec if spec.max_records is not None else replace(
                    spec, max_records=max_records)
    cohort = cohort_size(n_clients, fraction)
    verdicts = threat.check(algorithm, layer, specs, n_clients=cohort, rounds=rounds,
                            fraction=fraction, dropouts=may_drop)
    leaks = [v for v in verdicts if not v.ok]
    if leaks and not allow_leaks:
        v = leaks[0]
        name = getattr(threat, "name", str(threat))
        raise InadmissibleField(
            layer.name, v.field,
            f"phase {v.phase!r}: not protected against threat {name!r}: {v.reason} "
            "(choose a layer that protects it, or pass allow_leaks=True to run anyway; "
            "the transcript then records the leak)")
    return [str(v) for v in leaks]


def warn_swamped(algorithm: AlgorithmLike, layer: Layer, rounds: int, cohort: int,
                 max_records: int) -> list[str]:
    """Before round 0: warn, one line each with the fix, for every DP release whose
    planned noise is larger than any sum the cohort could upload
    (:mod:`secagg.privacy.plan`); returns the lines (none for a layer without DP)."""
    if not callable(getattr(layer, "planned_sum_sigmas", None)):
        return []
    from secagg.privacy.plan import NoiseSwampsSignal, plan_run, swamped

    lines = swamped(plan_run(algorithm, layer, rounds, cohort, max_records,
                             with_epsilon=False))
    for line in lines:
        warnings.warn(line, NoiseSwampsSignal, stacklevel=3)
    return lines


def round_invariant(algorithm: AlgorithmLike, rounds: int) -> dict[str, list[str]]:
    """Phase -> the fields its algorithm declares round-invariant
    (:meth:`algorithms.base.Phase.round_invariant_fields`), for the transcript header and
    the threat audit's differencing rule; a duck-typed phase declares nothing."""
    out: dict[str, list[str]] = {}
    for r in range(rounds):
        for ph in algorithm.phases(r, rounds):
            names = list(ph.round_invariant_fields())
            if names:
                have = out.setdefault(ph.name, [])
                have += [n for n in names if n not in have]
    return out
