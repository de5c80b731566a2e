"""The privacy plan before round 0: per release, the noise against the signal's scale.

A DP run can be private and useless at once: client-level DP over ten clients, say, adds
noise whose norm dwarfs any sum the clients could upload. Nothing in the run's output
would say so; the accuracy would just be a lottery. :func:`plan_run` computes, from the
calibrated layer alone (no client is contacted, nothing is trained), for every release of
every round:

* ``sigma``: the standard deviation per entry of the noise the release adds to the sum
  (the layer's :meth:`planned_sum_sigmas`; what the aggregate's notes report once run);
* ``noise_norm = sigma * sqrt(size)``: the expected L2 norm of that noise;
* ``signal_bound = cohort * B``: the largest norm the sum itself can have, B the field's
  per-client L2 bound (a record-level bound times the public ``max_records``);
* ``snr = signal_bound / noise_norm``: below 1 the noise is larger than any sum the
  cohort could send even if every client uploaded at its bound;
* the run's planned epsilon after each round (the layer's planning event, composed, with
  the events spent outside the layer by then, e.g. DP-SGD's: see ``plan_prior``).

:func:`swamped` turns the rows with ``snr < 1`` into one-line warnings with the fix
(:class:`NoiseSwampsSignal`, a :class:`UserWarning`): the engine issues them before round
0, and ``secagg run --dry-run`` prints the whole plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from secagg.messages import UploadSpec
from secagg.privacy.calibrate import epsilon_for

__all__ = ["NoiseSwampsSignal", "ReleasePlan", "plan_run", "swamped"]


class NoiseSwampsSignal(UserWarning):
    """A planned DP release whose noise is larger than any sum its cohort could upload."""


@dataclass(frozen=True)
class ReleasePlan:
    """One field of one planned release (see the module docstring)."""

    round: int
    phase: str
    field: str
    layer: str
    adjacency: str
    cohort: int
    sigma: float
    noise_norm: float
    signal_bound: float
    snr: float
    epsilon_after_round: float
    scaling: str

    def min_cohort(self) -> int:
        """The cohort at which the signal bound would reach the noise (snr 1): noise added
        once grows not with the cohort, each client's own noise grows with its root."""
        if self.snr <= 0:
            return math.inf  # type: ignore[return-value]
        factor = 1.0 / self.snr if self.scaling == "central" else 1.0 / self.snr ** 2
        return max(self.cohort, math.ceil(self.cohort * factor))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {**self.__dict__, "min_cohort": self.min_cohort()}


def _client_l2(spec: UploadSpec, name: str) -> float:
    """The field's L2 bound on one client's whole upload (record bounds x max_records)."""
    f = spec[name]
    b = f.bound
    if b is None:
        return math.inf
    unit = min(x for x in (b.l2, None if b.linf is None else b.linf * math.sqrt(
        max(f.size, 1))) if x is not None)
    if b.adjacency == "client":
        return unit
    return unit * float(spec.max_records or 1)


def plan_run(algorithm: Any, layer: Any, rounds: int, cohort: int,
             max_records: int, *, with_epsilon: bool = True) -> list[ReleasePlan]:
    """The plan of every DP release of a run, before round 0 (see the module docstring).

    Call after the algorithm's ``setup`` and the engine's ``plan_privacy`` (the layer must
    know its release count). A layer that adds no DP noise gives an empty plan.
    ``with_epsilon=False`` skips the per-round epsilons (NaN; the accountant is the slow
    part), as the engine's pre-run warning does.
    """
    planned = getattr(layer, "planned_sum_sigmas", None)
    if not callable(planned):
        return []
    scaling = getattr(layer, "noise_scaling", "central")
    factory = layer._event_factory()
    z, delta = layer.noise_multiplier, layer.delta
    per_event = 1 if getattr(layer, "tree", False) else None
    rows: list[ReleasePlan] = []
    sigmas_of: dict[UploadSpec, dict[str, float]] = {}
    released = 0
    for r in range(rounds):
        phases = [ph for ph in algorithm.phases(r, rounds) if ph.spec().fields]
        released += len(phases)
        events = per_event if per_event is not None else released
        prior = layer.prior(r + 1) if callable(getattr(layer, "prior", None)) else None
        eps = (epsilon_for(z, delta, rounds=events, event=factory, prior=prior) if events
               else 0.0) if with_epsilon else math.nan
        for ph in phases:
            spec = ph.spec()
            if spec.max_records is None:
                spec = replace(spec, max_records=max_records)
            if spec not in sigmas_of:  # the same spec every round: plan its noise once
                sigmas_of[spec] = planned(spec, cohort)
            for name, sigma in sigmas_of[spec].items():
                size = max(spec[name].size, 1)
                noise = sigma * math.sqrt(size)
                signal = cohort * _client_l2(spec, name)
                rows.append(ReleasePlan(
                    round=r, phase=ph.name, field=name, layer=layer.name,
                    adjacency=layer.adjacency, cohort=cohort, sigma=float(sigma),
                    noise_norm=float(noise), signal_bound=float(signal),
                    snr=float(signal / noise) if noise > 0 else math.inf,
                    epsilon_after_round=float(eps), scaling=scaling))
    return rows


def swamped(rows: Sequence[ReleasePlan]) -> list[str]:
    """One line per (phase, field) whose planned noise exceeds the largest sum its cohort
    could upload (snr < 1), with what would fix it."""
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for p in rows:
        if p.snr >= 1 or (p.phase, p.field) in seen:
            continue
        seen.add((p.phase, p.field))
        fixes = [f">= {p.min_cohort():,} clients per round"]
        if p.adjacency == "client":
            fixes.insert(0, "record-level adjacency (with DP-SGD, release_rounds=1 or a "
                            "public body)")
        fixes.append("fewer releases (rounds or release_rounds=1) or a larger epsilon")
        out.append(
            f"{p.adjacency}-level {p.layer} over {p.cohort} clients, phase {p.phase!r} field "
            f"{p.field!r}: noise std {p.sigma:.3g} per entry (norm {p.noise_norm:.3g}) "
            f"against a sum of norm <= {p.signal_bound:.3g}: the noise swamps the signal; "
            f"use {', '.join(fixes[:-1])} or {fixes[-1]}")
    return out


def format_plan(rows: Sequence[ReleasePlan]) -> str:
    """The plan as a table (one row per release and field)."""
    if not rows:
        return "no DP release: the layer adds no noise"
    head = ("round", "phase", "field", "noise std", "noise norm", "sum bound", "snr",
            "eps after round")
    lines = [head]
    for p in rows:
        lines.append((str(p.round + 1), p.phase, p.field, f"{p.sigma:.4g}",
                      f"{p.noise_norm:.4g}", f"{p.signal_bound:.4g}", f"{p.snr:.3g}",
                      f"{p.epsilon_after_round:.4g}"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines)
