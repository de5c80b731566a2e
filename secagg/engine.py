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
:attr:`~secagg.link.LayerServer.local` (Plaintext, Homomorphic in both key roles) runs that
same driver over a :class:`~secagg.local_link.LocalLink`, whose nodes are the clients here
(their steps run when the driver reads their replies), alone or inside a DP wrapper (its
server part begun and ended here and its node part run by each node, as over a remote link);
the others (SecureSum, and the DP wrappers around it) still run ``layer.aggregate``, which
plays every party's part of the layer and of its release.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from secagg.client_step import run_step
from secagg.client_step import zeros as _zeros
from secagg.costs import CostRow, Ledger
from secagg.dropouts import DropoutModel
from secagg.engine_accounts import ClientAccountsMixin
from secagg.errors import ConfigurationError, SecaggError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.link import LayerServer, PhaseCall
from secagg.messages import DEFAULT_MAX_RECORDS, Upload, UploadSpec
from secagg.phase import ClientState, PhaseBase, check_contract
from secagg.remote_layers import (
    NODE_BUDGET_REFUSAL,
    check_phase,
    check_remote,
    is_dp,
    layer_server,
    node_release_event,
)
from secagg.result import Result
from secagg.round_steps import (
    EVALUATION_FIELD,
    EVALUATION_PHASE,
    ROUND_FAILURES,
    AlgorithmLike,
    RunState,
    account_local_training,
    book_broadcast,
    clients_evaluated,
    cohort_size,
    guard_phase,
    run_spec,
    sample_cohort,
    solve,
)
from secagg.run_plan import check_threat, plan_privacy, round_invariant, warn_swamped
from secagg.seeds import derive_seed
from secagg.stages import Stage
from secagg.stream import UploadStream
from secagg.transcript import Transcript
from secagg.transport import InProcess, Transport, TransportHooks

if TYPE_CHECKING:
    from secagg.local_link import LocalLink

#: the names moved out of this module (pure moves), still importable from it
__all__ = [
    "EVALUATION_FIELD", "EVALUATION_PHASE", "NODE_BUDGET_REFUSAL", "ROUND_FAILURES",
    "AlgorithmLike", "ClientState", "Engine", "InProcess", "RunState", "Transport",
    "TransportHooks", "account_local_training", "book_broadcast", "check_phase",
    "check_remote", "check_threat", "clients_evaluated", "cohort_size", "guard_phase",
    "is_dp", "layer_server", "node_release_event", "plan_privacy", "round_invariant",
    "run_spec", "sample_cohort", "solve", "warn_swamped"]

_Phase = PhaseBase


def _export_model(algorithm: AlgorithmLike, states: Sequence[ClientState]) -> Any | None:
    """The algorithm's trained model for the result (``export_model``; None when it has
    none). ``states`` is empty on a remote runtime: the clients' own models live on their
    nodes, and only a global model (the server's) is saved."""
    return algorithm.export_model(states)



# ---------------------------------------------------------------- the engine


class Engine(ClientAccountsMixin):
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
            rejected=run.rejected, n_clients=len(clients),
            wall_s=time.perf_counter() - t_start,
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
        run.rejected.extend((ctx.round, phase.name, int(c), str(why))
                            for c, why in sorted(agg.notes.get("rejected", {}).items()))
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
        driver's state persist across phases); None for the layers still aggregated by their
        in-process ``aggregate``. A DP wrapper runs as on a remote runtime: its release
        begun, the inner driver (the nodes adding their noise), its release ended."""
        if self._over_link is False:
            return None
        if self._over_link is None:
            self._over_link = False
            if self.transport.link is not None:
                return None
            from secagg.local_link import LocalLink

            link = LocalLink([st.id for st in self.transport.states])
            try:
                dp, server = layer_server(self.layer, embedded=True)
            except ConfigurationError:  # a configuration only the in-process layer runs
                return None
            if not server.local:
                return None
            self.dp = dp
            self._over_link = (link, server)
        return self._over_link

    def _over_local_link(self, local: tuple[LocalLink, LayerServer], run: RunState,
                         phase: _Phase, spec: UploadSpec, stepping: list[int],
                         ctx: RoundContext, uploads: UploadStream) -> Aggregate:
        """The layer's one server driver over the in-process link: the clients' steps run
        when the driver reads their replies (``uploads``), the rest after it."""
        link, server = local
        link.serve(uploads, spec)
        rel = self.layer.server_part(spec, ctx, len(stepping))
        instruction = dict(round=ctx.round, rounds=self.rounds, phase=phase.name,
                           seed=self.seed, max_records=self._max_records,
                           on_violation=self.on_violation, dp=rel.node_params)
        call = PhaseCall(spec=spec, cohort=stepping, ctx=ctx, release=rel,
                         instruction=instruction, clips=run.clips, stores=link.store)
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
