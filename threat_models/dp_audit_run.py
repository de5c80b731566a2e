"""Running the audits a user asks for (``secagg dp-audit``): every layer at every claimed
epsilon, on a bare bounded sum (:mod:`threat_models.dp_audit`) or on one round of
client-level DP-FedAvg (:mod:`threat_models.dp_audit_fedavg`), printed as a table or JSON
rows. Kept apart from both so that neither imports the other.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal

from threat_models.dp_audit import (
    ALL_LAYERS,
    DEFAULT_CLIENTS,
    DEFAULT_DELTA,
    DPSGD_TRIALS,
    EXIT_VIOLATED,
    FEDAVG_TRIALS,
    FTRL_TRIALS,
    LAYER_NAMES,
    RELEASES,
    SURVIVOR_PATTERNS,
    SURVIVORS_ALL_TRIALS,
    AuditError,
    AuditResult,
    audit_dpsgd,
    audit_dpsgd_one_run,
    audit_sum,
    format_table,
    plot_tradeoff,
)
from threat_models.dp_audit_fedavg import audit_fedavg, audit_fedavg_one_run
from threat_models.dp_audit_sum import audit_kind
from threat_models.dp_audit_tree import audit_tree

__all__ = ["EXIT_VIOLATED", "main_cli", "run_audits"]


def run_audits(*, layers: Sequence[str], epsilons: Sequence[float], delta: float = DEFAULT_DELTA,
               adjacency: Literal["record", "client"] = "record",
               mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
               trials: int | None = None, seed: int = 0, clients: int | None = None,
               confidence: float = 0.95, one_run: bool = False, canaries: int = 1000,
               dpsgd_steps: int = 1, progress: bool | None = None,
               release: Literal["sum", "dp-fedavg", "dp-fedavg-adaptive"] = "sum",
               mode: str = "tight",
               survivors: Sequence[int | str] = SURVIVOR_PATTERNS,
               familywise: bool = False) -> list[AuditResult]:
    """Every requested audit: each layer (``central-dp``, ``local-dp``, ``distributed-dp``,
    ``dp-ftrl`` (CentralDP's tree noise over 8 rounds, :mod:`threat_models.dp_audit_tree`),
    ``dp-sgd``) at each epsilon. DP-SGD's noise multiplier is calibrated to the epsilon for
    ``dpsgd_steps`` full-batch steps; ``one_run`` adds its one-run audit. ``mode``:
    ``"tight"`` (the GDP fit and the threshold tests) or ``"threshold"`` (assumption-free
    only). DistributedDP's sum is audited once per entry of ``survivors`` (default: the
    fewest survivors its secure sum accepts, and all of them; ``clients`` defaults to
    :data:`~threat_models.dp_audit.DEFAULT_CLIENTS`).

    ``release="dp-fedavg-adaptive"`` audits one round of DP-FedAvg with adaptive clipping
    (the update and the clip count released together,
    :mod:`threat_models.dp_audit_adaptive`).

    ``release="dp-fedavg"`` audits the DP layers (client adjacency) on one round of
    client-level DP-FedAvg with a canary update (:mod:`threat_models.dp_audit_fedavg`;
    ``clients`` is the cohort) instead of a bare sum; ``one_run`` adds its one-run audit
    with ``canaries`` canary clients.

    ``familywise``: split 1 - ``confidence`` evenly between the audits (Bonferroni), so
    that with probability >= ``confidence`` no bound of the whole run is wrong, and a run
    over correct layers exits 0 (each row's ``confidence`` is then its own share). The
    tight mode's bound on an exactly calibrated Gaussian layer is above its claim with
    probability close to 1 - its confidence, so without this a run of 18 audits at 0.95
    each would often flag some correct layer."""
    if release not in RELEASES:
        raise AuditError(f"release must be one of {RELEASES}, got {release!r}")
    if familywise:
        count = sum(_planned(name, release, survivors, one_run) for name in layers)
        confidence = 1.0 - (1.0 - confidence) / max(1, count * len(epsilons))
    out: list[AuditResult] = []
    for name in layers:
        for eps in epsilons:
            if release != "sum":
                for who in (survivors if _per_survivors(name) else ("fewest",)):
                    out += _fedavg_audits(name, eps, delta=delta, mechanism=mechanism,
                                          trials=trials, seed=seed, clients=clients,
                                          confidence=confidence, one_run=one_run,
                                          canaries=canaries, progress=progress, mode=mode,
                                          survivors=who, adaptive=release != "dp-fedavg")
                continue
            if name == "dp-ftrl":
                out.append(audit_tree(epsilon=eps, delta=delta, trials=trials or FTRL_TRIALS,
                                      seed=seed, confidence=confidence, progress=progress,
                                      mode=mode))
                continue
            if name == "dp-sgd":
                from secagg.privacy.calibrate import calibrate

                z = calibrate(eps, delta, rounds=dpsgd_steps)
                out.append(audit_dpsgd(noise_multiplier=z, steps=dpsgd_steps, delta=delta,
                                       trials=trials or DPSGD_TRIALS, seed=seed,
                                       confidence=confidence, progress=progress, mode=mode))
                if one_run:
                    out.append(audit_dpsgd_one_run(noise_multiplier=z, steps=dpsgd_steps,
                                                   delta=delta, canaries=canaries, seed=seed,
                                                   confidence=confidence))
                continue
            patterns = survivors if _per_survivors(name) else ("all",)
            for who in patterns:
                # by default all-survivor sums (10 noise shares per release, the slowest
                # draws) get a quarter of the trials: they check the survivor-dependent
                # accounting; the fewest survivors are the tight worst case. Measured with
                # the exact accounting (secagg.privacy.pld), at the run's familywise
                # confidence: 0.94-0.98 of the claim at 250000 (10^6 at 0.95 each: 0.99-1.00,
                # 3-4x the seconds, +40-50 s to a default run at load 12)
                n = trials or (SURVIVORS_ALL_TRIALS if who == "all" and _per_survivors(
                    name) else 1_000_000)
                out.append(audit_sum(name, epsilon=eps, delta=delta, adjacency=adjacency,
                                     mechanism=mechanism, trials=n,
                                     seed=seed, clients=clients, confidence=confidence,
                                     progress=progress, survivors=who, mode=mode))
    return out


def _per_survivors(name: str) -> bool:
    """Whether the audit of layer ``name`` runs once per survivor pattern: a layer whose
    noise is shared among the survivors (the registry's ``audit`` is ``distributed``)."""
    return name in LAYER_NAMES and audit_kind(name) == "distributed"


def _planned(name: str, release: str, survivors: Sequence[int | str], one_run: bool) -> int:
    """How many audits :func:`run_audits` makes of layer ``name`` at one epsilon."""
    if _per_survivors(name):
        return len(survivors) * (1 + (one_run and release == "dp-fedavg"))
    return 1 + (one_run and (release == "dp-fedavg" or name == "dp-sgd"))


def _fedavg_audits(name: str, eps: float, *, delta: float, mechanism: Any,
                   trials: int | None, seed: int, clients: int | None, confidence: float,
                   one_run: bool, canaries: int, progress: bool | None,
                   mode: str, survivors: int | str, adaptive: bool = False
                   ) -> list[AuditResult]:
    if name not in LAYER_NAMES:
        raise AuditError(f"DP-FedAvg is audited under the DP layers {', '.join(LAYER_NAMES)};"
                         f" {name!r} is not one (dp-sgd is record-level: audit it with "
                         "--release sum)")
    if adaptive:  # the update and adaptive clipping's count, released together
        from threat_models.dp_audit_adaptive import audit_adaptive

        return [audit_adaptive(name, epsilon=eps, delta=delta, mechanism=mechanism,
                               trials=trials or FEDAVG_TRIALS, seed=seed,
                               clients=clients or DEFAULT_CLIENTS, confidence=confidence,
                               progress=progress, mode=mode, survivors=survivors)]
    out = [audit_fedavg(name, epsilon=eps, delta=delta, mechanism=mechanism,
                        trials=trials or FEDAVG_TRIALS, seed=seed,
                        clients=clients or DEFAULT_CLIENTS, confidence=confidence,
                        progress=progress, mode=mode, survivors=survivors)]
    if one_run:
        out.append(audit_fedavg_one_run(name, epsilon=eps, delta=delta, mechanism=mechanism,
                                        canaries=canaries, seed=seed, confidence=confidence))
    return out


def main_cli(args: Any) -> int:
    """``secagg dp-audit``: run the audits ``args`` names (see ``secagg dp-audit --help``),
    print the table (or ``--json`` rows), and return the exit status: 0 when every lower
    bound is at most its claim, :data:`EXIT_VIOLATED` when one is above (the mechanism is
    not (epsilon, delta)-DP, at the stated confidence). ``--inject`` audits the injected
    miscalibrations instead."""
    inject = getattr(args, "inject", None)
    if inject:
        return _report(_injected(inject, args), args)
    release = getattr(args, "release", "sum")
    every = ALL_LAYERS if release == "sum" else LAYER_NAMES
    layers = list(dict.fromkeys(
        n for item in args.layer for n in (every if item == "all" else (item,))))
    who = getattr(args, "survivors", "both")
    results = run_audits(release=release, layers=layers, epsilons=args.epsilon,
                         delta=args.delta, adjacency=args.adjacency, mechanism=args.mechanism,
                         trials=args.trials, seed=args.seed, clients=args.clients,
                         confidence=args.confidence, one_run=args.one_run,
                         canaries=args.canaries, progress=False if args.quiet else None,
                         mode=getattr(args, "mode", "tight"),
                         survivors=SURVIVOR_PATTERNS if who == "both" else (who,),
                         familywise=True)
    return _report(results, args)


def _injected(inject: Sequence[str], args: Any) -> list[AuditResult]:
    """``--inject``: audit the injected miscalibrations (:mod:`threat_models.dp_audit_bugs`)
    at each ``--epsilon`` instead of the correct layers."""
    from threat_models.dp_audit_bugs import BUGS, injected_audits

    which = list(dict.fromkeys(b for item in inject for b in (BUGS if item == "all"
                                                              else (item,))))
    out = []
    # the run's confidence split between its audits, as for the correct layers
    confidence = 1.0 - (1.0 - args.confidence) / (len(which) * len(args.epsilon))
    for eps in args.epsilon:
        for item in injected_audits(eps, delta=args.delta, trials=args.trials or 1_000_000,
                                    seed=args.seed, mode=getattr(args, "mode", "tight"),
                                    confidence=confidence, which=which):
            name, _, what = item.bug.partition(": ")
            item.result.mechanism = f"{item.result.mechanism} [injected {name}]"
            item.result.details.update(injected=what, injected_size=item.size)
            out.append(item.result)
    return out


def _report(results: list[AuditResult], args: Any) -> int:
    """Print ``results`` (table or ``--json``), draw ``--plot``, return the exit status."""
    import json

    if args.json:
        print(json.dumps([r.row() for r in results], indent=2))
    else:
        print(format_table(results))
    if getattr(args, "plot", None):
        for target in plot_tradeoff(results, args.plot):
            print(f"secagg dp-audit: wrote {target}", file=sys.stderr)
    bad = [r for r in results if r.violated]
    if bad:
        for r in bad:
            print(f"secagg dp-audit: {r.mechanism} is not ({r.epsilon_claimed:g}, "
                  f"{r.delta:g})-DP: the audit proves epsilon >= {r.epsilon_lower:.3f} with "
                  f"confidence {r.confidence:g} (test: {r.best.statistic}, mode: "
                  f"{r.best.mode})", file=sys.stderr)
        return EXIT_VIOLATED
    return 0
