"""The shared steps of a round, as every runtime takes them (:class:`secagg.engine.Engine`,
and the embedded :class:`~secagg.federation.Federation`): the cohort a round samples
(:func:`sample_cohort`), the spec a phase runs under (:func:`run_spec`), the abort and budget
guard around a phase (:func:`guard_phase`), the server's solve (:func:`solve`), what one run
accumulates (:class:`RunState`), the local training's DP events (:func:`account_local_training`),
the broadcast's booking (:func:`book_broadcast`) and the clients' own evaluation
(:func:`clients_evaluated`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from secagg.costs import SERVER, Ledger
from secagg.errors import (
    BudgetExceeded,
    ProtocolError,
    SecureSumAborted,
)
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import ClipReport, UploadSpec
from secagg.phase import AlgorithmBase, PhaseBase
from secagg.stages import Stage
from secagg.transcript import Transcript, digest
from secagg.wire import is_message

if TYPE_CHECKING:
    pass


#: what the engine runs: the contracts, with their defaults, are declared in secagg.phase
_Phase = PhaseBase
AlgorithmLike = AlgorithmBase


def cohort_size(n: int, fraction: float) -> int:
    """How many of ``n`` clients one round samples: max(1, round(fraction * n))."""
    return max(1, int(round(fraction * n)))


def sample_cohort(rng: np.random.Generator, n: int, fraction: float) -> list[int]:
    """The indices (sorted) of one round's cohort: :func:`cohort_size` of n clients drawn
    without replacement from ``rng`` (all of them when that is n). Shared by both
    runtimes, so both sample the same cohorts."""
    k = cohort_size(n, fraction)
    if k == n:
        return list(range(n))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


def run_spec(phase: _Phase, layer: Layer, max_records: int, checked: set[str]) -> UploadSpec:
    """The spec a phase runs under: its own, with the run's public ``max_records`` where it
    declares none; the layer checks it the first time the phase runs (``checked`` holds the
    phase names already checked)."""
    spec = phase.spec()
    if spec.max_records is None:
        spec = replace(spec, max_records=max_records)
    if phase.name not in checked:
        layer.check(spec)
        checked.add(phase.name)
    return spec


ROUND_FAILURES = (SecureSumAborted, ProtocolError)
"""The typed failures that end one round's phase (not the run): a secure sum that lost too
many clients, or any protocol error it raised. ``on_abort="skip"`` records each and goes on."""


def guard_phase(
    step: Callable[[], int], round: int, phase: str, cohort: int, on_abort: str,
    aborted: list[tuple[int, str, str]], participation: list[tuple[int, str, int, int]],
) -> bool:
    """Run one phase's ``step`` (which returns how many uploads its aggregate holds) and
    book the outcome, as every runtime does: its participation; or, for a round that failed
    with a typed round failure (:data:`ROUND_FAILURES`: an aborted secure sum, or a
    protocol error no party could be blamed for), the failure (re-raised when
    ``on_abort="raise"``, else recorded with its type and 0 uploads, and the run goes on); or,
    when the privacy guard refused a release before it happened, the refusal. Returns False
    when the run must stop there (the refusal), True otherwise."""
    try:
        got = step()
    except ROUND_FAILURES as exc:
        if on_abort == "raise":
            raise
        why = str(exc) if isinstance(exc, SecureSumAborted) else f"{type(exc).__name__}: {exc}"
        aborted.append((round, phase, why))
        participation.append((round, phase, 0, cohort))
        return True
    except BudgetExceeded as exc:
        # the guard refused a release before it happened: stop here, keep results
        aborted.append((round, phase, str(exc)))
        return False
    participation.append((round, phase, got, cohort))
    return True


def solve(phase: _Phase, agg: Aggregate, ctx: RoundContext,
          measurements: list[dict[str, Any]], cohort: int) -> None:
    """The server's end of a phase, as every runtime does it: the aggregate learns the size
    of the sampled ``cohort`` (:attr:`Aggregate.cohort`, a fixed denominator for means),
    the phase's server step runs on it (booked as a ``solve`` row with its CPU time), then
    what the phase measured (:meth:`algorithms.base.Phase.measurements`, when it has that
    hook and reports anything) is appended to ``measurements`` as
    ``{"round", "phase", **values}``."""
    agg.cohort = int(cohort)
    t0 = time.process_time()
    phase.server_step(agg)
    ctx.message(SERVER, SERVER, "solve", 0, server_cpu_s=time.process_time() - t0)
    values = phase.measurements()
    if values:
        measurements.append({"round": ctx.round, "phase": ctx.phase, **values})


@dataclass(kw_only=True)
class RunState:
    """What one run accumulates: the cost ledger, the transcript, the privacy ledger (None
    until a DP layer or DP-SGD needs one), the accuracy after each round, and per phase
    run the clips, aborts, participation and measurements (see
    :class:`~secagg.result.Result`)."""

    ledger: Ledger
    transcript: Transcript
    privacy: Any | None = None
    history: list[float] = field(default_factory=list)
    clips: ClipReport = field(default_factory=ClipReport)
    aborted: list[tuple[int, str, str]] = field(default_factory=list)
    participation: list[tuple[int, str, int, int]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    #: (round, phase, client, why) for every client whose upload the layer rejected
    rejected: list[tuple[int, str, int, str]] = field(default_factory=list)
    #: (phase, field) -> why it was released without DP noise (kept before a ledger exists)
    unnoised: dict[tuple[str, str], str] = field(default_factory=dict)
    #: the clients' statements: a Signer (in one process) or Collector (remote), or None
    attest: Any | None = None


def account_local_training(phase: _Phase, spec: UploadSpec, layer: Layer, ctx: RoundContext,
                           run: RunState) -> None:
    """Spend the phase's DP-SGD events before anything leaves a client (one dominating
    event per round: the clients' records are disjoint; a user-seeded training's events
    mark the run not private), and, when a privacy ledger is in use, mark every field
    that neither the layer noises nor DP-SGD covers as released without DP noise."""
    covered = set(phase.dp_covered_fields())
    # Un-noised releases are remembered even before a ledger exists (DP-SGD may start
    # in a later round): a ledger made then still reports every one of them.
    for name, why in layer.unnoised_fields(spec).items():
        if name not in covered:
            run.unnoised.setdefault((phase.name, name), why)
    events = list(phase.privacy_events())
    if events:
        from secagg.privacy.accountant import PrivacyLedger
        from secagg.privacy.dpsgd import round_event

        if run.privacy is None:  # DP-SGD under a non-DP layer: a ledger at delta 1e-5
            run.privacy = PrivacyLedger(delta=1e-5)
            ctx.privacy = run.privacy
        # every field of the upload is computed after the training, so each field's
        # guarantee composes with it (conservative for fields that do not use the model)
        run.privacy.spend(
            round_event(events, round=ctx.round, phase=ctx.phase, fields=tuple(spec.names))
        )
    if run.privacy is not None:
        for (ph, name), why in run.unnoised.items():
            run.privacy.mark_unnoised(name, ph, why)


def book_broadcast(ctx: RoundContext, cohort: Sequence[int], wire: bytes,
                   payload: Mapping[str, np.ndarray], client_cpu_s: float = 0.0,
                   server_cpu_s: float = 0.0) -> None:
    """Book a phase's broadcast: one downlink message of ``wire`` per client."""
    plain = int(sum(np.asarray(v).nbytes for v in payload.values()))
    fields = {k: int(np.asarray(v).nbytes) for k, v in payload.items()}
    # the same bytes for every client: hashed once
    sha = digest(wire) if ctx.attest is not None and is_message(wire) else None
    for c in cohort:
        ctx.message(SERVER, c, Stage.BROADCAST, wire, plaintext_bytes=plain, fields=dict(fields),
                    client_cpu_s=client_cpu_s, server_cpu_s=server_cpu_s, sha=sha)


#: where the transcript records the clients' own evaluation (phase, field)
EVALUATION_PHASE, EVALUATION_FIELD = Stage.EVALUATE, "local test accuracy"


def clients_evaluated(run: RunState, round: int, acc: Mapping[int, tuple[float, bool]]
                      ) -> None:
    """The accuracy after ``round`` of a personalized model evaluated where it lives (on
    each client, on its own local test set): ``acc`` holds, per client that answered,
    (accuracy, has a local test set). The round's accuracy is their mean over the clients
    that have a local test set (in client-id order, as the algorithm's own evaluate; NaN
    when none). What the server saw is on the record: each client's pair as a clear
    observation in the transcript and, under a privacy ledger, the field marked released
    without DP noise."""
    if acc:
        for c in sorted(acc):
            run.transcript.observe(
                round=round, phase=EVALUATION_PHASE, stage=Stage.EVALUATE, party=SERVER,
                sender=c, field=EVALUATION_FIELD, form="clear",
                value=np.array(acc[c], dtype=np.float64))
        if run.privacy is not None:
            run.privacy.mark_unnoised(
                EVALUATION_FIELD, EVALUATION_PHASE,
                "node evaluation: each node sent the server its local test accuracy, of a "
                "model trained on its records, in the clear (FlowerFederation("
                "node_evaluation=False) keeps it on the nodes)")
    accs = [acc[c][0] for c in sorted(acc) if acc[c][1]]
    run.history[round] = float(np.mean(accs)) if accs else float("nan")
