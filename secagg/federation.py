"""The embedded engine: run an algorithm with a privacy layer over a client population.

:class:`Federation` checks a run's configuration and runs it on the round engine
(:class:`secagg.engine.Engine`) with the clients in this process
(:class:`secagg.engine.InProcess`): sample a cohort, then for each phase the algorithm
declares: broadcast (booked as downlink messages), each client's step (validated against
the phase's UploadSpec), the layer (which applies injected dropouts at its stages, books
its messages and transcripts what the server saw), and the server step on the resulting
Aggregate. After each round the algorithm is evaluated. Everything is deterministic given
``seed``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal

from threadpoolctl import threadpool_limits

from secagg.cores import available_cores
from secagg.data import Partition
from secagg.dropouts import DropoutModel
from secagg.engine import (
    AlgorithmLike,
    ClientState,
    Engine,
    InProcess,
    cohort_size,
    guard_phase,
    plan_privacy,
    run_spec,
    sample_cohort,
    solve,
)
from secagg.errors import ConfigurationError
from secagg.layers.base import Aggregate, Layer
from secagg.result import Evaluation, Result
from secagg.seeds import derive_seed

__all__ = ["AlgorithmLike", "ClientState", "Evaluation", "Federation", "Result",
           "cohort_size", "derive_seed", "guard_phase", "plan_privacy", "run_spec",
           "sample_cohort", "solve"]


def _budget(value: Any) -> Any:
    """A :class:`~secagg.privacy.client_ledger.ClientBudget` from what a user gave."""
    if value is None:
        return None
    from secagg.privacy.client_ledger import ClientBudget

    if isinstance(value, ClientBudget):
        return value
    if isinstance(value, Mapping):
        return ClientBudget(**value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return ClientBudget(release=float(value), server=float(value))
    return ClientBudget.parse(value)


def _progress_wanted() -> bool:
    return sys.stderr.isatty() and os.environ.get("CI", "").lower() not in ("true", "1")


class Federation:
    """Run ``algorithm`` with ``layer`` over ``clients``.

    Args:
        algorithm: an :class:`algorithms.base.Algorithm`.
        layer: the privacy layer every upload goes through.
        clients: a :class:`~secagg.data.Partition` (carries the global test set).
        rounds: number of rounds.
        fraction: fraction of clients sampled each round (at least one).
        dropout: injected dropout probability per client per round (per phase): the chance
            a client drops somewhere in the layer's protocol, spread over the layer's
            :meth:`~secagg.layers.base.Layer.dropout_stages`; or a mapping stage ->
            per-stage probability; or a ready :class:`~secagg.dropouts.DropoutModel`.
        seed: makes sampling, dropouts, initialisation and local training deterministic.
        on_violation: ``"raise"`` (default) refuses out-of-bound uploads; ``"clip"`` clips
            them into the bound and counts the clips in :attr:`Result.clips`.
        on_abort: ``"raise"`` (default) propagates an aborted secure sum;
            ``"skip"`` skips that phase for the round and records it in the result.
        include_values: store observed values in the transcript (sensitive!).
        privacy: a privacy ledger to book DP events in (default: one from the layer, if it
            makes one).
        progress: show a progress bar (default: only on an interactive terminal, not in CI).
        max_records: a public bound on records per client (never the largest client's
            size, which is private). It turns record-level bounds into per-client bounds
            for phases whose spec declares none. Without it, fixed-point planning uses
            :data:`~secagg.messages.DEFAULT_MAX_RECORDS` and client-level DP on a
            record-level bound is refused. A client holding more records is refused.
        threat: an adversary model with ``check(algorithm, layer, specs, n_clients)``
            returning per-field verdicts (``ok``, ``phase``, ``field``, ``reason``), e.g.
            :class:`threat_models.ThreatModel`; the run is refused before its first phase
            when a field is not protected against it.
        allow_leaks: run anyway; the leaking fields are recorded in the transcript header.
        attest: each client (and the HE decryptor) signs, with its own Ed25519 key, a
            statement about every message it sends; the transcript carries them and
            :attr:`Result.identities` the public keys (:mod:`secagg.attest`).
        sampling: ``"fixed"`` (default: a cohort of ``round(fraction * n)`` drawn without
            replacement) or ``"poisson"`` (each eligible client drawn independently with
            probability ``fraction``; the mean divides by the expected cohort). Only under
            Poisson sampling does a client's epsilon against observers of the releases use
            amplification by sampling.
        client_ledgers: a directory holding each client's own privacy ledger
            (``client-<id>.jsonl``, :mod:`secagg.privacy.client_ledger`); it is read
            before the run and extended after every round, so a client's spend carries
            over runs. None (default): the ledgers live in the result only
            (``privacy.clients``, ``client_ledgers.jsonl`` beside ``result.json``).
        client_budget: each client's epsilon budget: a number (against every observer),
            ``"server=EPS"`` / ``"release=EPS"`` (or a list of them), or a
            :class:`~secagg.privacy.client_ledger.ClientBudget`. Before a round touches
            its data a client projects its epsilon under the round's declared terms and
            refuses when over budget (it then leaves the eligible population).
        client_policy: a :class:`~secagg.privacy.policy.NodePolicy` every client holds:
            terms below its floor are refused the same way.
        colluders: how many clients each client assumes reveal their noise shares to the
            server (DistributedDP: its figure against the server uses the rest).
        individual_filter: an :class:`~secagg.privacy.client_ledger.IndividualFilter`
            ("rdp" or "gdp"; "pld" is refused): each client is charged from its actual
            clipped update and sends zeros once the next round would cross its budget.
        stream: compute each client's upload only when the layer reads it, so a cohort
            costs the memory of one upload (default; the layers that can,
            :attr:`~secagg.layers.base.Layer.streams`: plaintext, the secure sum and the DP
            layers around them). False computes every upload first and holds them. Both
            give the same result bit for bit.
        workers: processes the simulated clients' secure-sum work (key agreement,
            signatures, Shamir sharing, DistributedDP's noise shares, masking) is spread over,
            as n devices would do it in parallel (:mod:`secagg.secure_sum.parties`). None
            (default): the cores this process may use (:func:`secagg.cores.available_cores`:
            ``len(os.sched_getaffinity(0))``, else ``os.cpu_count()``); 1: all in this
            process. The messages and the aggregate do not depend on it.
        torch_threads: PyTorch's intra-op threads while the run lasts (restored after):
            1 by default, because a client trains on a few records at a time, where more
            threads only spin (measured on 2 cores under load: a CNN step on 6 records took
            15.9 ms of CPU with 2 threads against 1.8 ms with 1); None leaves PyTorch's
            setting alone.
        blas_threads: threads of numpy's BLAS (OpenBLAS, MKL; through threadpoolctl) while
            the run lasts (restored after): 1 by default. A run's BLAS calls are small (an
            update's norm, a Shamir product), and a second BLAS thread has to be woken on a
            core the other parties are using: on 2 cores, 200 clients of FedAvg under
            DistributedDP spent 1.4 ms per norm of an 80,202-entry update with 2 threads
            against 0.08 ms with 1, and 56 against 36 CPU s in all. None leaves BLAS alone.
    """

    def __init__(
        self,
        algorithm: AlgorithmLike,
        layer: Layer,
        clients: Partition,
        rounds: int = 10,
        fraction: float = 1.0,
        dropout: float | Mapping[str, float] | DropoutModel = 0.0,
        seed: int = 0,
        on_violation: Literal["raise", "clip"] = "raise",
        on_abort: Literal["raise", "skip"] = "raise",
        include_values: bool = False,
        privacy: Any | None = None,
        progress: bool | None = None,
        max_records: int | None = None,
        threat: Any | None = None,
        allow_leaks: bool = False,
        attest: bool = True,
        sampling: Literal["fixed", "poisson"] = "fixed",
        client_ledgers: str | os.PathLike[str] | None = None,
        client_budget: Any | None = None,
        client_policy: Any | None = None,
        colluders: int = 0,
        individual_filter: Any | None = None,
        stream: bool = True,
        workers: int | None = None,
        torch_threads: int | None = 1,
        blas_threads: int | None = 1,
    ) -> None:
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ConfigurationError(
                f"max_records must be a positive integer (a public bound), got {max_records!r}"
            )
        if not isinstance(layer, Layer):
            raise ConfigurationError(f"layer must be a secagg Layer, got {type(layer).__name__}")
        if rounds < 1:
            raise ConfigurationError(f"rounds must be >= 1, got {rounds}")
        if not 0.0 < fraction <= 1.0:
            raise ConfigurationError(f"fraction must be in (0, 1], got {fraction}")
        if not isinstance(clients, Partition):
            raise ConfigurationError("clients must be a secagg.data.Partition (from a *_split)")
        if len(clients) == 0:
            raise ConfigurationError("no clients")
        if on_violation not in ("raise", "clip"):
            raise ConfigurationError(
                f"on_violation must be 'raise' or 'clip', got {on_violation!r}"
            )
        if on_abort not in ("raise", "skip"):
            raise ConfigurationError(f"on_abort must be 'raise' or 'skip', got {on_abort!r}")
        self.algorithm = algorithm
        self.layer = layer
        self.partition = clients
        self.rounds = rounds
        self.fraction = fraction
        self.dropouts = (
            dropout if isinstance(dropout, DropoutModel)
            else DropoutModel(dropout, seed, per="stage" if isinstance(dropout, Mapping)
                              else "round")
        ).for_stages(layer.dropout_stages())
        self.seed = seed
        self.on_violation = on_violation
        self.on_abort = on_abort
        self.include_values = include_values
        self._privacy_arg = privacy
        self.privacy = privacy
        self.progress = _progress_wanted() if progress is None else progress
        self.max_records = max_records
        self.threat = threat
        self.allow_leaks = allow_leaks
        self.attest = bool(attest)
        if sampling not in ("fixed", "poisson"):
            raise ConfigurationError(f"sampling must be 'fixed' or 'poisson', got "
                                     f"{sampling!r}")
        if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
            raise ConfigurationError(f"colluders must be a non-negative integer, got "
                                     f"{colluders!r}")
        self.sampling = sampling
        self.client_ledgers = client_ledgers
        self.client_budget = _budget(client_budget)
        self.client_policy = client_policy
        self.colluders = colluders
        self.individual_filter = individual_filter
        self.stream = bool(stream)
        if workers is None:
            workers = available_cores()
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigurationError(
                f"workers must be a positive integer or None (the cores this process may "
                f"use), got {workers!r}")
        self.workers = workers
        if torch_threads is not None and (isinstance(torch_threads, bool) or not isinstance(
                torch_threads, int) or torch_threads < 1):
            raise ConfigurationError(
                f"torch_threads must be a positive integer or None, got {torch_threads!r}")
        self.torch_threads = torch_threads
        if blas_threads is not None and (isinstance(blas_threads, bool) or not isinstance(
                blas_threads, int) or blas_threads < 1):
            raise ConfigurationError(
                f"blas_threads must be a positive integer or None, got {blas_threads!r}")
        self.blas_threads = blas_threads

    def plan(self) -> list[Any]:
        """The privacy plan before round 0, without contacting or training any client
        (``secagg run --dry-run``): the algorithm's setup and the engine's privacy planning,
        then per DP release and field the noise on the sum, the largest sum the cohort
        could upload, their ratio and the planned epsilon after each round
        (:class:`~secagg.privacy.plan.ReleasePlan`; empty for a layer without DP)."""
        from secagg.messages import DEFAULT_MAX_RECORDS
        from secagg.privacy.plan import plan_run

        states = [ClientState(cd) for cd in self.partition]
        self.algorithm.setup(self.partition.dataset, states, self.seed)
        plan_privacy(self.algorithm, self.layer, self.rounds, self.max_records is not None)
        return plan_run(self.algorithm, self.layer, self.rounds,
                        cohort_size(len(self.partition), self.fraction),
                        self.max_records or DEFAULT_MAX_RECORDS)

    def run(self, on_aggregate: Callable[[int, str, Aggregate], None] | None = None
            ) -> Result:
        """Run all rounds and return the :class:`Result`. ``on_aggregate(round, phase,
        aggregate)`` sees every aggregate the server solves from (as in
        :meth:`secagg.flower.FlowerFederation.run`).

        Raises:
            SecureSumAborted: a secure sum lost too many clients (unless on_abort="skip").
            UploadError: a client's upload broke its spec (unless on_violation="clip").
            InadmissibleField: the layer cannot carry a field of some phase.
        """
        engine = Engine(
            algorithm=self.algorithm, layer=self.layer,
            transport=InProcess(algorithm=self.algorithm, partition=self.partition),
            rounds=self.rounds, fraction=self.fraction, seed=self.seed, dropouts=self.dropouts,
            on_violation=self.on_violation, on_abort=self.on_abort,
            include_values=self.include_values, max_records=self.max_records,
            privacy=self._privacy_arg, threat=self.threat, allow_leaks=self.allow_leaks,
            progress=self.progress, attest=self.attest, sampling=self.sampling,
            client_ledgers=self.client_ledgers, client_budget=self.client_budget,
            client_policy=self.client_policy, colluders=self.colluders,
            individual_filter=self.individual_filter, stream=self.stream, workers=self.workers,
            on_aggregate=on_aggregate)
        import torch

        threads = torch.get_num_threads()
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        blas = (contextlib.nullcontext() if self.blas_threads is None
                else threadpool_limits(limits=self.blas_threads, user_api="blas"))
        try:
            with blas:
                return engine.run()
        finally:
            torch.set_num_threads(threads)
            self.privacy = engine.privacy  # the run's ledger (a fresh one per run)
