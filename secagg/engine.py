"""The round engine: one round, whatever carries the messages.

Both runtimes -- the embedded :class:`~secagg.federation.Federation`, whose clients live in
this process, and :class:`~secagg.flower.server.FlowerFederation`, whose clients live on
Flower's SuperNodes -- run :meth:`Engine.run`. They differ only in their
:class:`Transport`: how the broadcast reaches the clients, how the clients are reached at
all (a :class:`~secagg.link.Link` for a remote runtime), and where the accuracy is
computed. Everything else happens here, once.

A run: plan (the algorithm's setup, the threat check, the DP layer's noise calibrated for
the run's releases and its privacy ledger), open (the transport connects the clients),
then for every round a cohort (:func:`sample_cohort`) and, for each phase the algorithm
declares, under the abort and budget guard (:func:`guard_phase`):

1. **broadcast** -- the phase's public state, booked as one downlink message per client;
2. **collect** -- each client's step on its own data, checked against the phase's
   :class:`~secagg.messages.UploadSpec` (:meth:`~secagg.messages.Upload.validate`), after
   which the local training's DP events are spent (:func:`account_local_training`);
3. **layer** -- the privacy layer turns the uploads into the server's
   :class:`~secagg.layers.base.Aggregate`;
4. **release** -- a DP layer's noise and its privacy event;
5. **solve** -- the phase's server step on the aggregate (:func:`solve`).

Over a link (:meth:`Engine._remote`) the clients' steps run on their nodes inside the
layer's own protocol: the layer's server part begins the release here
(:meth:`~secagg.layers.base.Layer.server_part`), the carrying layer's server side
(:func:`layer_server`) exchanges its stages with the nodes, and the server part ends it
here.

In one process (:meth:`Engine._in_process`) a layer whose server driver declares
:attr:`~secagg.link.LayerServer.local` (Plaintext, Homomorphic) runs that same driver over a
:class:`~secagg.local_link.LocalLink`, whose nodes are the clients here (their steps run when
the driver reads their replies), alone or inside CentralDP (its server part begun and ended
here, as over a remote link); the others (SecureSum, LocalDP, DistributedDP, Homomorphic with
``key_holder="clients"``) still run ``layer.aggregate``, which plays every party's part of
the layer and of its release. Both book the same ledger rows and reach the same aggregate.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from secagg.client_step import run_step
from secagg.client_step import zeros as _zeros
from secagg.costs import SERVER, CostRow, Ledger
from secagg.data import Dataset, Partition
from secagg.dropouts import DropoutModel
from secagg.errors import (
    BudgetExceeded,
    ConfigurationError,
    InadmissibleField,
    PrivacyError,
    ProtocolError,
    SecaggError,
    SecureSumAborted,
)
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.layers.registry import carried_entries, entry_for
from secagg.link import LayerServer, Link, PhaseCall, Reply
from secagg.messages import DEFAULT_MAX_RECORDS, ClipReport, Upload, UploadSpec
from secagg.phase import AlgorithmBase, ClientState, PhaseBase, check_contract
from secagg.result import Result
from secagg.seeds import derive_seed
from secagg.stages import Stage
from secagg.stream import UploadStream
from secagg.transcript import Transcript, digest
from secagg.wire import is_message, pack_arrays, unpack_arrays

if TYPE_CHECKING:
    from secagg.local_link import LocalLink


# ---------------------------------------------------------------- what the engine runs


#: what the engine runs: the contracts, with their defaults, are declared in secagg.phase
_Phase = PhaseBase
AlgorithmLike = AlgorithmBase


# ---------------------------------------------------------------- the shared steps


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


# ---------------------------------------------------------------- transports


class Transport(Protocol):
    """What a runtime supplies to the :class:`Engine`: its clients, how the broadcast
    reaches them and, for a remote runtime, a :class:`~secagg.link.Link` that carries every
    other message. :class:`TransportHooks` gives every hook a default."""

    #: the data set description (its global test set evaluates non-personalized models)
    dataset: Dataset
    #: the clients in this process (empty for a remote runtime)
    states: Sequence[ClientState]
    #: the link to the clients' nodes, or None when they run in this process
    link: Link | None

    def open(self, run: RunState, hello: Callable[[int], dict[str, Any]],
             greeted: Callable[[int, Reply], None]) -> list[int]:
        """Reach the clients; return their ids, sorted. A remote runtime sends each node a
        hello carrying ``hello(number of nodes)`` and hands each reply to ``greeted``."""
        ...

    def meta(self) -> dict[str, Any]:
        """Extra fields for the transcript's run header."""
        ...

    def broadcast(self, payload: Mapping[str, np.ndarray], cohort: Sequence[int],
                  ctx: RoundContext) -> Any:
        """Book the phase's broadcast and return what the clients' steps get: the decoded
        payload (in one process) or its wire bytes (remote: they ride on the step)."""
        ...

    def round_begins(self, round: int) -> None:
        """A round starts."""
        ...

    def phase_begins(self, index: int, run: RunState) -> None:
        """Phase ``index`` of the round starts."""
        ...

    def evaluate(self, round: int, run: RunState) -> float:
        """The accuracy after ``round`` (may be NaN until :meth:`close` fills it in)."""
        ...

    def round_ends(self, round: int) -> None:
        """A round ended."""
        ...

    def aborted(self, exc: SecaggError) -> None:
        """A phase over the link failed (an abort or a protocol error; the runtime may
        annotate ``exc``)."""
        ...

    def close(self, run: RunState) -> None:
        """The last round ended."""
        ...


class TransportHooks:
    """No-op defaults for :class:`Transport`'s hooks."""

    link: Link | None = None

    def open(self, run: RunState, hello: Callable[[int], dict[str, Any]],
             greeted: Callable[[int, Reply], None]) -> list[int]:
        """The clients in this process: ids 0..n-1."""
        return list(range(len(self.states)))  # type: ignore[attr-defined]

    def meta(self) -> dict[str, Any]:
        """No extra header fields."""
        return {}

    def round_begins(self, round: int) -> None:
        """Nothing to do."""

    def phase_begins(self, index: int, run: RunState) -> None:
        """Nothing to do."""

    def round_ends(self, round: int) -> None:
        """Nothing to do."""

    def aborted(self, exc: SecaggError) -> None:
        """Nothing to add."""

    def close(self, run: RunState) -> None:
        """Nothing to do."""


class InProcess(TransportHooks):
    """The embedded transport: the clients are :class:`ClientState` objects in this
    process; the broadcast is packed and unpacked as it would travel (its bytes booked);
    the accuracy is computed here."""

    def __init__(self, *, algorithm: AlgorithmLike, partition: Partition) -> None:
        self.algorithm = algorithm
        self.dataset = partition.dataset
        self.states = [ClientState(cd) for cd in partition]

    def broadcast(self, payload: Mapping[str, np.ndarray], cohort: Sequence[int],
                  ctx: RoundContext) -> dict[str, np.ndarray]:
        """Pack the payload (the server's CPU), unpack it (the clients'), book it."""
        if not payload:
            return {}
        t0 = time.process_time()
        wire = pack_arrays(payload)
        server_s = time.process_time() - t0
        t0 = time.process_time()
        decoded = unpack_arrays(wire)
        client_s = time.process_time() - t0
        book_broadcast(ctx, cohort, wire, payload, client_s, server_s)
        return decoded

    def evaluate(self, round: int, run: RunState) -> float:
        """The algorithm's own evaluation on the clients here."""
        return float(self.algorithm.evaluate(self.dataset, self.states))


# ---------------------------------------------------------------- layers over a link


def check_phase(phase: _Phase) -> None:
    """Refuse, on a remote runtime, a phase whose spec has no fields (a "local-only"
    phase: clients compute and upload nothing, the layer is not called). A remote runtime
    reaches the nodes only through a layer's stages, so such a phase would have to become
    its own client-step exchange with no layer; it is refused before any node is contacted
    for it, instead of running it through a layer that has nothing to carry.

    Raises:
        ConfigurationError: the phase uploads nothing.
    """
    if not phase.spec().fields:
        raise ConfigurationError(
            f"phase {phase.name!r} uploads no fields (a local-only phase); the Flower "
            "runtime does not run local-only phases yet: use the embedded Federation")


def check_remote(layer: Layer) -> None:
    """Refuse a layer a remote runtime cannot carry yet (with what can be used), as the layer
    registry declares it (:mod:`secagg.layers.registry`): carried are the layers with a
    server driver (Plaintext, SecureSum without pinned identities, Homomorphic with a
    decryptor node), and the DP layers around one of them (DistributedDP around a layer
    that sums encoded vectors: SecureSum). A layer is matched by its exact class.

    Raises:
        ConfigurationError: the layer (or its inner layer) does not run remotely.
    """
    entry = entry_for(layer)
    inner = layer.wrapped
    if entry is not None and entry.dp and entry.on_flower and inner is not None:
        carriers = [e for e in carried_entries()
                    if e.sums_encoded or not layer.needs_encoded_sum]
        if entry_for(inner) not in carriers:
            raise ConfigurationError(
                f"{type(layer).__name__} around {type(inner).__name__} does not run on "
                f"Flower yet: its inner layer must be one of "
                f"{[e.class_name for e in carriers]} there")
        check_remote(inner)
        return
    if entry is None or entry.server is None or not entry.on_flower:
        why = f" ({entry.not_on_flower})" if entry is not None and entry.not_on_flower else ""
        raise ConfigurationError(
            f"layer {getattr(layer, 'name', type(layer).__name__)!r} "
            f"({type(layer).__name__}) does not run on Flower yet{why}: its client side would "
            "have to run on the nodes; use Plaintext, SecureSum or Homomorphic there (alone "
            "or inside CentralDP, LocalDP, or DistributedDP around SecureSum), or the "
            "embedded Federation"
        )
    if entry.flower_check is not None:
        entry.flower_check(layer)


#: what a Flower node's error reply says when it refuses a release by its own privacy
#: budget (secagg.flower.client); the server takes such a node out of the population
NODE_BUDGET_REFUSAL = "refused by this node's privacy budget"


def node_release_event(client: int, run: str, round: int, phase: str,
                       dp: Any, **terms: Any) -> Any:
    """The release an instruction asks a Flower node for, as the node's own ledger charges
    it (:func:`secagg.privacy.node_budget.node_event`, from the same instruction fields):
    the server keeps its copy beside the node's reported ledger head. Named here, where
    the engine keeps its privacy plumbing, so that the transport imports no privacy
    code."""
    from secagg.privacy.node_budget import node_event

    return node_event(client, run, round, phase, dp, **terms)


def _export_model(algorithm: AlgorithmLike, states: Sequence[ClientState]) -> Any | None:
    """The algorithm's trained model for the result (``export_model``; None when it has
    none). ``states`` is empty on a remote runtime: the clients' own models live on their
    nodes, and only a global model (the server's) is saved."""
    return algorithm.export_model(states)


def is_dp(layer: Layer) -> bool:
    """Whether ``layer`` is a DP layer (:attr:`~secagg.layers.base.Layer.is_dp`)."""
    return layer.is_dp


def layer_server(layer: Layer, *, decryptor: int | None = None,
                 pinned: Mapping[int, bytes] | None = None,
                 ) -> tuple[Layer | None, LayerServer]:
    """(the DP wrapper or None, the server side of the layer that carries the uploads) for
    a remote runtime (:func:`check_remote` first). ``decryptor``: Homomorphic's decryptor
    client id (None: the smallest connected). ``pinned``: the nodes' pinned public keys
    (client id -> 32 bytes), which SecureSum's server checks every ADVERTISE against."""
    check_remote(layer)
    dp = layer if layer.is_dp else None
    carrier = layer.wrapped if dp is not None and layer.wrapped is not None else layer
    entry = entry_for(carrier)
    assert entry is not None and entry.server is not None  # check_remote: it is carried
    return dp, entry.server(carrier, decryptor=decryptor, pinned=pinned)


# ---------------------------------------------------------------- the engine


class Engine:
    """Run ``algorithm`` with ``layer`` over the clients a :class:`Transport` reaches.

    Args:
        algorithm, layer, rounds, fraction, seed, on_violation, on_abort, include_values,
            max_records, threat, allow_leaks: see :class:`~secagg.federation.Federation`
            (already checked by the runtime).
        transport: the runtime's :class:`Transport`.
        dropouts: the injected dropout model, for the layer's stages.
        privacy: a privacy ledger to book DP events in (default: one from the layer).
        progress: show a progress bar.
        on_aggregate: called with (round, phase, Aggregate) after each phase's solve.
        decryptor: remote Homomorphic: the decryptor node's client id.
        pinned: remote SecureSum: the nodes' pinned Ed25519 public keys (client id -> 32
            bytes; :func:`layer_server`).
        attest: every client (and the decryptor) signs a statement per message it sends
            (:mod:`secagg.attest`); in one process the engine holds their keys, remotely
            the transport's ``collector`` gathers what the nodes signed.
        sampling: ``"fixed"`` (a cohort of :func:`cohort_size` drawn without replacement
            from the eligible clients) or ``"poisson"`` (each eligible client drawn with
            probability ``fraction``; the mean's fixed denominator is then the expected
            cohort). In one process only.
        client_ledgers, client_budget, client_policy, colluders: the clients' own ledgers
            (:class:`~secagg.privacy.client_ledger.ClientAccounts`; in one process only):
            the ledger directory (None: in the result only), each client's
            :class:`~secagg.privacy.client_ledger.ClientBudget` and NodePolicy, and the
            colluders each client assumes under DistributedDP.
        individual_filter: an :class:`~secagg.privacy.client_ledger.IndividualFilter`
            each client runs on its actual clipped update (in one process; CentralDP
            without a tree or LocalDP): once the next round would cross its budget the
            client sends zeros (masked under a secure sum), never a visible refusal. Its
            figures stay in the client's state (and its ledger directory).
        stream: in one process, let a layer that streams read each upload as its client
            steps (:meth:`_in_process`); False computes every upload first.
        workers: in one process, how many processes a layer may spread the simulated
            clients' protocol work over (:attr:`RoundContext.workers`).
    """

    def __init__(
        self, *, algorithm: AlgorithmLike, layer: Layer, transport: Transport, rounds: int,
        fraction: float, seed: int, dropouts: DropoutModel,
        on_violation: Literal["raise", "clip"] = "raise",
        on_abort: Literal["raise", "skip"] = "raise", include_values: bool = False,
        max_records: int | None = None, privacy: Any | None = None,
        threat: Any | None = None, allow_leaks: bool = False, progress: bool = False,
        on_aggregate: Callable[[int, str, Aggregate], None] | None = None,
        decryptor: int | None = None, pinned: Mapping[int, bytes] | None = None,
        attest: bool = True,
        sampling: Literal["fixed", "poisson"] = "fixed", client_ledgers: Any | None = None,
        client_budget: Any | None = None, client_policy: Any | None = None,
        colluders: int = 0, individual_filter: Any | None = None, stream: bool = True,
        workers: int = 1,
    ) -> None:
        self.algorithm, self.layer, self.transport = algorithm, layer, transport
        self.stream, self.workers = stream, workers
        self.attest = attest
        self.rounds, self.fraction, self.seed = rounds, fraction, seed
        self.dropouts = dropouts
        self.on_violation, self.on_abort = on_violation, on_abort
        self.include_values = include_values
        self.max_records = max_records
        self.privacy, self.threat, self.allow_leaks = privacy, threat, allow_leaks
        self.progress, self.on_aggregate = progress, on_aggregate
        self.dp: Layer | None = None
        self.server: LayerServer | None = None
        self._over_link: tuple[LocalLink, LayerServer] | bool | None = None
        if sampling not in ("fixed", "poisson"):
            raise ConfigurationError(f"sampling must be 'fixed' or 'poisson', got "
                                     f"{sampling!r}")
        self.sampling = sampling
        self.client_ledgers, self.client_budget = client_ledgers, client_budget
        self.client_policy, self.colluders = client_policy, colluders
        self.accounts: Any | None = None
        self.individual_filter = individual_filter
        if individual_filter is not None:
            if transport.link is not None:
                raise ConfigurationError("an individual filter runs in one process; on "
                                         "Flower the node keeps its own")
            individual_filter.check_layer(layer)
        if transport.link is not None:  # the layer's server side runs over the link
            if sampling != "fixed" or client_budget is not None or client_ledgers is not None:
                raise ConfigurationError(
                    "Poisson sampling and the engine's client ledgers and budgets run in "
                    "one process; on Flower each node keeps its own ledger")
            self.dp, self.server = layer_server(layer, decryptor=decryptor,
                                                pinned=pinned)
        elif sampling == "poisson" and getattr(layer, "tree", False):
            raise ConfigurationError(
                "Poisson sampling with CentralDP(tree=True): the tree's noise is shared "
                "across rounds, so no per-round amplification by sampling is claimed; use "
                "sampling='fixed'")

    @property
    def _max_records(self) -> int:
        # public, never derived from the clients' data
        return DEFAULT_MAX_RECORDS if self.max_records is None else self.max_records

    def _may_drop(self) -> bool:
        """Whether a client may drop out of a phase: always over a remote transport (real
        nodes), else when the injected dropout model has a positive rate."""
        if self.transport.link is not None:
            return True
        d = self.dropouts
        rate = d.rate
        if isinstance(rate, Mapping):
            return bool(d.default > 0 or any(float(v) > 0 for v in rate.values()))
        return bool(d.default > 0 or float(rate) > 0)

    def run(self) -> Result:
        """Run all rounds and return the :class:`~secagg.result.Result`.

        Raises:
            SecureSumAborted: a secure sum lost too many clients (unless on_abort="skip").
            UploadError: a client's upload broke its spec (unless on_violation="clip").
            InadmissibleField: the layer cannot carry a field of some phase.
        """
        t_start = time.perf_counter()
        alg, layer, tr = self.algorithm, self.layer, self.transport
        # plan: before any client is contacted
        alg.setup(tr.dataset, tr.states, self.seed)
        check_contract(alg, [ph for r in range(self.rounds) for ph in alg.phases(r, self.rounds)])
        leaks = None if self.threat is None else check_threat(
            alg, layer, self.threat, self.rounds, len(tr.states), self.fraction,
            self._max_records, self.allow_leaks, may_drop=self._may_drop())
        made = plan_privacy(alg, layer, self.rounds, self.max_records is not None)
        warn_swamped(alg, layer, self.rounds, cohort_size(len(tr.states), self.fraction),
                     self._max_records)
        run = RunState(ledger=Ledger(), transcript=Transcript(self.include_values),
                       privacy=self.privacy if self.privacy is not None else made)
        self.privacy = run.privacy  # the run's ledger (DP-SGD may make one later)
        # open: reach the clients (a remote layer's first stage may ride on the hello)
        first = list(alg.phases(0, self.rounds))[:1]
        announced = [0]

        def hello(n_nodes: int) -> dict[str, Any]:
            announced[0] = cohort_size(n_nodes, self.fraction)
            if self.server is None or not first:
                return {}
            return self.server.hello(0, first[0].name, announced[0])

        greeted = self.server.greeted if self.server is not None else (lambda c, r: None)
        clients = tr.open(run, hello, greeted)
        run.attest = self._attestor(clients)
        run.transcript.meta(
            algorithm=alg.describe(), layer=layer.describe(), seed=self.seed,
            rounds=self.rounds, clients=len(clients), fraction=self.fraction, **tr.meta(),
            **({"sampling": "poisson"} if self.sampling == "poisson" else {}),
            **({} if self.threat is None else {
                "threat": self.threat.describe(), "allow_leaks": self.allow_leaks}),
            **({} if run.attest is None else {"attestation": run.attest.header()}),
        )
        run.transcript.records[-1]["round_invariant"] = round_invariant(alg, self.rounds)
        if leaks is not None:
            run.transcript.records[-1]["leaks"] = leaks
        rng = np.random.default_rng(derive_seed(self.seed, "cohort"))
        cohorts: list[list[int]] = []
        self.accounts = self._accounts(clients, run)

        def cohort_of(r: int) -> list[int]:
            """Round r's cohort: the draws in round order, each once (a round's cohort is
            drawn early when the previous round's last phase advertises to it)."""
            while len(cohorts) <= r:
                if self.accounts is None:
                    cohorts.append([clients[i] for i in
                                    sample_cohort(rng, len(clients), self.fraction)])
                else:
                    cohorts.append(self._draw(rng, len(clients)))
            return cohorts[r]

        if self.server is not None:
            self.server.start(cohort_of(0), announced[0])
        checked: set[str] = set()
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.rounds, desc=f"{alg.name}/{layer.name}", unit="round",
                       file=sys.stderr)
        stopped = False
        for r in range(self.rounds):
            tr.round_begins(r)
            cohort = cohort_of(r)
            phases = list(alg.phases(r, self.rounds))
            if self.accounts is not None:
                self._begin_accounts(r, phases, checked, len(clients))
            for i, phase in enumerate(phases):
                tr.phase_begins(i, run)
                spec = phase.spec()
                local = not spec.fields  # a local-only phase: no layer, no release
                if local and tr.link is not None:
                    check_phase(phase)
                if not local:
                    spec = run_spec(phase, layer, self._max_records, checked)
                ctx = RoundContext(r, phase.name, derive_seed(self.seed, r, phase.name),
                                   run.ledger, run.transcript, self.dropouts, run.privacy,
                                   run.attest, self.workers)
                if local:
                    got = self._local(phase, cohort, ctx)
                    run.participation.append((r, phase.name, got, len(cohort)))
                    continue

                def upcoming(i: int = i, r: int = r, phases: list = phases,
                             cohort: list[int] = cohort) -> tuple[int, str, list[int]] | None:
                    """The phase after this one: (round, name, cohort), None after the last."""
                    if i + 1 < len(phases):
                        return r, phases[i + 1].name, cohort
                    if r + 1 < self.rounds:
                        nxt = list(alg.phases(r + 1, self.rounds))[:1]
                        return (r + 1, nxt[0].name, cohort_of(r + 1)) if nxt else None
                    return None

                step = partial(self._phase, run, phase, spec, cohort, ctx, upcoming)
                if not guard_phase(step, r, phase.name, len(cohort), self.on_abort,
                                   run.aborted, run.participation):
                    stopped = True
                    break
            if self.accounts is not None:
                self.accounts.end_round(r)
                if self.individual_filter is not None:
                    for st in tr.states:
                        if "individual_filter" in st.state:
                            self.accounts.save_filter_state(st.id, st.state["individual_filter"])
            run.history.append(tr.evaluate(r, run))
            tr.round_ends(r)
            if bar is not None:
                bar.set_postfix(acc=f"{run.history[-1]:.3f}")
                bar.update(1)
            if stopped:
                break
        tr.close(run)
        if bar is not None:
            bar.close()
        if run.privacy is not None and hasattr(run.privacy, "record_in"):
            run.privacy.record_in(run.transcript)
        if run.attest is not None and hasattr(run.attest, "close"):
            # every party closes its signed sequence, with the DP terms the run applied
            run.attest.close(run.transcript, run.privacy)
        self.privacy = run.privacy
        kind = "mean local test" if alg.personalized else "global test"
        return Result(
            algorithm=alg.describe(), layer=layer.describe(), rounds=len(run.history),
            seed=self.seed, accuracy=run.history[-1], accuracy_kind=kind,
            history=run.history, costs=run.ledger, transcript=run.transcript,
            privacy=run.privacy, clips=dict(run.clips.counts), aborted=run.aborted,
            participation=run.participation, measurements=run.measurements,
            n_clients=len(clients), wall_s=time.perf_counter() - t_start,
            identities=None if run.attest is None else (
                run.attest.published() if hasattr(run.attest, "published")
                else dict(run.attest.header()["keys"])),
            attest_scheme=None if run.attest is None else run.attest.header()["scheme"],
            client_accounts=self._reported_accounts(run),
            trained=_export_model(alg, tr.states if tr.link is None else []),
        )

    def _attestor(self, clients: list[int]) -> Any | None:
        """Who signs the clients' statements: in one process a Signer holding every
        client's key (the pinned ``SecureSum(identities=...)`` keys where given), remotely
        the transport's collector; None when attestation is off."""
        if not self.attest:
            return None
        if self.transport.link is not None:
            return getattr(self.transport, "collector", None)
        from secagg.attest import Signer

        carrier = self.layer.wrapped or self.layer
        pinned = getattr(carrier, "identities", None) or getattr(self.layer, "identities", None)
        return Signer(parties=clients, layer=self.layer.describe(), keys=pinned)

    def _phase(self, run: RunState, phase: _Phase, spec: UploadSpec, cohort: list[int],
               ctx: RoundContext, upcoming: Callable[[], tuple[int, str, list[int]] | None],
               ) -> int:
        """One phase: broadcast, collect + layer + release, solve. Returns how many
        clients' uploads the aggregate holds."""
        if self.accounts is not None and all(c in self.accounts.refusing for c in cohort):
            # nobody drawn, or every drawn client refused before touching its data:
            # nothing to aggregate or release (the model stays as it is)
            self.accounts.record_phase(ctx.round, phase.name, cohort, (), [], {})
            return 0
        # 1. broadcast
        payload = phase.broadcast()
        bcast = self.transport.broadcast(payload, cohort, ctx)
        booked = 0 if run.privacy is None else len(run.privacy.events)
        # 2-4. collect, layer, release
        if self.transport.link is None:
            agg = self._in_process(run, phase, spec, cohort, ctx, bcast)
        else:
            agg = self._remote(run, phase, spec, cohort, ctx, bcast, upcoming)
        # 5. solve (over the fixed denominator: the cohort, or the expected one)
        solve(phase, agg, ctx, run.measurements, self._denominator(cohort))
        if self.accounts is not None:
            self._record_accounts(run, phase, cohort, agg, payload, booked)
        if self.on_aggregate is not None:
            self.on_aggregate(ctx.round, phase.name, agg)
        return len(agg.contributors)

    def _in_process(self, run: RunState, phase: _Phase, spec: UploadSpec, cohort: list[int],
                    ctx: RoundContext, bcast: Mapping[str, np.ndarray]) -> Aggregate:
        """The clients' steps here (each upload validated against the spec), the local
        training's DP events, then the layer, which runs every party's part (its release
        included) in this process.

        When the layer streams (:attr:`~secagg.layers.base.Layer.streams`) and the phase's
        training spends no DP-SGD events (they must be booked before the release), each
        client steps when the layer reads its upload (:class:`~secagg.stream.UploadStream`):
        the cohort is never held whole. Otherwise every client steps first, in cohort order.
        Either way every client of the cohort steps exactly once and the aggregate is the
        same bit for bit."""
        states = self.transport.states
        refusing = {} if self.accounts is None else self.accounts.refusing
        filt = self.individual_filter

        def halted(st: ClientState) -> bool:
            return filt is not None and bool(self._filter_state(st).get("halted", False))

        # the phase's prepare hook: the clients about to step (e.g. batched training; its
        # client_cpu_s hook then books the shared work to each, in run_step)
        phase.prepare([states[c] for c in cohort if c not in refusing and not halted(states[c])],
                      bcast)

        def screen(spec: UploadSpec, up: Upload) -> Upload:
            """The client's individual filter, charged from what it would send; over its
            budget it sends zeros instead, silently."""
            from secagg.privacy.client_ledger import individual_mu

            assert filt is not None
            st = states[up.client]
            if filt.step(self._filter_state(st), individual_mu(self.layer, spec, up)):
                return up
            return Upload.validate(spec, _zeros(spec), up.client, st.n_records,
                                   self.on_violation)

        def step(c: int) -> Upload:
            st = states[c]
            # over the link, the driver counts the clips of what arrives
            return run_step(phase, st, bcast, spec, on_violation=self.on_violation,
                            halted=halted(st), screen=None if filt is None else screen,
                            clips=run.clips if local is None else None)

        # refused before touching its data: no step, no upload
        stepping = [c for c in cohort if c not in refusing]
        lazy = self.stream and self.layer.streams and not bool(phase.trained_with_dpsgd())
        local = self._local_link()
        uploads = UploadStream(stepping, step, keep=not lazy)
        account_local_training(phase, spec, self.layer, ctx, run)
        if local is not None:
            return self._over_local_link(local, run, phase, spec, stepping, ctx, uploads)
        try:
            agg = self.layer.aggregate(uploads, spec, ctx)
        except SecaggError:  # an aborted or refused release: the cohort stepped all the same
            uploads.finish()
            raise
        uploads.finish()  # the steps of clients that dropped before sending
        return agg

    def _local_link(self) -> tuple[LocalLink, LayerServer] | None:
        """The in-process link and the layer's server driver over it, when the layer's
        driver runs over a :class:`~secagg.local_link.LocalLink` in one process (its
        :attr:`~secagg.link.LayerServer.local`; made once per run: the nodes' stores and the
        driver's state persist across phases); None for the layers (and the DP wrappers
        whose noise the nodes add) still aggregated by their in-process ``aggregate``;
        CentralDP runs as on a remote runtime: its release begun, the inner driver, its
        release ended."""
        if self._over_link is False:
            return None
        if self._over_link is None:
            self._over_link = False
            if self.transport.link is not None or (self.layer.is_dp
                                                   and not self.layer.aggregator_noises):
                return None
            try:
                dp, server = layer_server(self.layer)
            except ConfigurationError:  # a configuration only the in-process layer runs
                return None
            if not server.local:
                return None
            from secagg.local_link import LocalLink

            self.dp = dp
            self._over_link = (LocalLink([st.id for st in self.transport.states]), server)
        return self._over_link

    def _over_local_link(self, local: tuple[LocalLink, LayerServer], run: RunState,
                         phase: _Phase, spec: UploadSpec, stepping: list[int],
                         ctx: RoundContext, uploads: UploadStream) -> Aggregate:
        """The layer's one server driver over the in-process link: the clients' steps run
        when the driver reads their replies (``uploads``), the rest after it."""
        link, server = local
        link.serve(uploads, spec)
        rel = self.layer.server_part(spec, ctx, len(stepping))  # CentralDP: no node part
        instruction = dict(round=ctx.round, rounds=self.rounds, phase=phase.name,
                           seed=self.seed, max_records=self._max_records,
                           on_violation=self.on_violation)
        call = PhaseCall(spec=spec, cohort=stepping, ctx=ctx, release=rel,
                         instruction=instruction, clips=run.clips)
        try:
            agg = server.aggregate(call, link)
        except SecaggError:  # an aborted or refused release: the cohort stepped all the same
            link.settle()
            raise
        link.settle()  # the steps of clients that dropped before sending
        return rel.end(agg, ctx)

    def _remote(self, run: RunState, phase: _Phase, spec: UploadSpec, cohort: list[int],
                ctx: RoundContext, wire: bytes,
                upcoming: Callable[[], tuple[int, str, list[int]] | None]) -> Aggregate:
        """The release begun here, the layer's server side over the link (the clients'
        steps run on their nodes, inside the layer's first stage), the release ended
        here."""
        assert self.server is not None and self.transport.link is not None
        account_local_training(phase, spec, self.layer, ctx, run)
        rel = self.layer.server_part(spec, ctx, len(cohort))
        instruction = dict(round=ctx.round, rounds=self.rounds, phase=phase.name,
                           seed=self.seed, max_records=self._max_records,
                           on_violation=self.on_violation, broadcast=wire,
                           dp=rel.node_params)
        call = PhaseCall(spec=spec, cohort=cohort, ctx=ctx, release=rel,
                         instruction=instruction, clips=run.clips, upcoming=upcoming)
        try:
            agg = self.server.aggregate(call, self.transport.link)
        except ROUND_FAILURES as exc:
            self.transport.aborted(exc)
            raise
        return rel.end(agg, ctx)

    # -- the clients' own ledgers (in one process)

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

    def _local(self, phase: _Phase, cohort: list[int], ctx: RoundContext) -> int:
        """A phase with no upload fields (in one process): broadcast, then each selected
        client's step, booked as a zero-byte ``local`` ledger row (its FLOPs and CPU time;
        no transcript message, as nothing is sent); no layer, no server step, no release.
        Returns the number of clients that ran it."""
        states = self.transport.states
        refusing = {} if self.accounts is None else self.accounts.refusing
        cohort = [c for c in cohort if c not in refusing]  # they do not touch their data
        bcast = self.transport.broadcast(phase.broadcast(), cohort, ctx)
        empty = phase.spec()
        for c in cohort:
            up = run_step(phase, states[c], bcast, empty)  # refuses a non-empty return
            # work, not a message: a ledger row of 0 bytes, nothing in the transcript
            ctx.ledger.record(CostRow(round=ctx.round, phase=ctx.phase, stage=Stage.LOCAL,
                                      sender=c, receiver=c, client_cpu_s=up.cpu_s,
                                      flops=up.flops, step_flops=up.flops))
        return len(cohort)
