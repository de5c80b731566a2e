"""The embedded engine: run an algorithm with a privacy layer over a client population.

One round: sample a cohort, then for each phase the algorithm declares: broadcast (booked
as downlink messages), each client's step (validated against the phase's UploadSpec), the
layer (which applies injected dropouts at its stages, books its messages and transcripts
what the server saw), and the server step on the resulting Aggregate. After each round the
algorithm is evaluated. Everything is deterministic given ``seed``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from secagg.costs import DIRECTIONS, SERVER, CostRow, HardwareProfile, Ledger, get_profile
from secagg.data import ClientData, Dataset, Partition
from secagg.dropouts import DropoutModel
from secagg.errors import BudgetExceeded, ConfigurationError, InadmissibleField, SecureSumAborted
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import DEFAULT_MAX_RECORDS, ClipReport, Upload, UploadSpec
from secagg.transcript import Transcript
from secagg.wire import pack_arrays, unpack_arrays


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived deterministically from ints and strings."""
    words = [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)


def cohort_size(n: int, fraction: float) -> int:
    """How many of ``n`` clients one round samples: max(1, round(fraction * n))."""
    return max(1, int(round(fraction * n)))


def sample_cohort(rng: np.random.Generator, n: int, fraction: float) -> list[int]:
    """The indices (sorted) of one round's cohort: :func:`cohort_size` of n clients drawn
    without replacement from ``rng`` (all of them when that is n). Shared by the embedded
    engine and :mod:`secagg.flower`, so both sample the same cohorts."""
    k = cohort_size(n, fraction)
    if k == n:
        return list(range(n))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


@dataclass
class ClientState:
    """One client during a run: its data and its persistent private state."""

    data: ClientData
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> int:
        """The client id."""
        return self.data.id

    @property
    def n_records(self) -> int:
        """Number of training records."""
        return len(self.data.y)


@dataclass(frozen=True)
class Evaluation:
    """An accuracy and what it measures."""

    accuracy: float
    kind: Literal["global test", "mean local test"]


class _Phase(Protocol):
    name: str

    def spec(self) -> UploadSpec: ...
    def broadcast(self) -> dict[str, np.ndarray]: ...
    def client_step(
        self, client: ClientState, broadcast: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]: ...  # noqa: E501
    def server_step(self, aggregate: Aggregate) -> None: ...
    def client_flops(self, client: ClientState) -> float: ...


class AlgorithmLike(Protocol):
    """What the engine needs of an algorithm (see :class:`algorithms.base.Algorithm`)."""

    name: str
    personalized: bool

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None: ...
    def phases(self, round: int, rounds: int) -> Sequence[_Phase]: ...
    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float: ...
    def describe(self) -> dict[str, Any]: ...


@dataclass
class Result:
    """What a run produced.

    Attributes:
        accuracy: final accuracy; ``accuracy_kind`` says whether it is on the global test
            set or the mean local test accuracy (personalized algorithms).
        history: accuracy after each round.
        costs: the cost ledger (one row per message).
        transcript: what each party observed.
        privacy: the run's privacy ledger when a DP layer was used, else None.
        clips: clipped uploads per field (when clipping was asked for).
        aborted: (round, phase, reason) for phases that aborted and were skipped.
        participation: (round, phase, contributors, cohort) per phase run: how many
            sampled clients' uploads made it into the aggregate (dropouts show here; an
            aborted and skipped secure sum counts 0).
        measurements: per phase run, what the phase reported after its server step
            (:meth:`algorithms.base.Phase.measurements`, e.g. the clip bound and how many
            clients' updates were clipped), as ``{"round", "phase", **measurements}``.
    """

    algorithm: dict[str, Any]
    layer: dict[str, Any]
    rounds: int
    seed: int
    accuracy: float
    accuracy_kind: str
    history: list[float]
    costs: Ledger
    transcript: Transcript
    privacy: Any | None = None
    clips: dict[str, int] = field(default_factory=dict)
    aborted: list[tuple[int, str, str]] = field(default_factory=list)
    participation: list[tuple[int, str, int, int]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    n_clients: int = 0
    wall_s: float = 0.0

    @property
    def best_accuracy(self) -> float:
        """The highest accuracy over the rounds (see :attr:`best_round`)."""
        return max(self.history) if self.history else float("nan")

    @property
    def best_round(self) -> int:
        """The 0-based round after which :attr:`best_accuracy` was measured (the first such)."""
        return int(np.argmax(self.history)) if self.history else -1

    @property
    def planned_rounds(self) -> int:
        """The rounds the run was asked for (from the transcript header; :attr:`rounds` is
        how many ran)."""
        head = next((r for r in self.transcript.records if r.get("type") == "run"), {})
        return int(head.get("rounds", self.rounds))

    def failure(self) -> str | None:
        """Why the run did not produce a usable model, or None: every phase aborted (no
        upload was ever aggregated), or the privacy budget guard stopped it early."""
        ran = {(p[0], p[1]) for p in self.participation}
        refused = [a for a in self.aborted if (a[0], a[1]) not in ran]
        if refused and not any(p[2] for p in self.participation):
            r, phase, why = refused[0]
            return (f"the privacy budget guard refused the first release (round {r + 1}, "
                    f"phase {phase!r}): {why}; nothing was aggregated, the model is the "
                    "untrained initial one")
        if refused:
            r, phase, why = refused[0]
            return (f"stopped in round {r + 1} of {self.planned_rounds} (phase {phase!r}) by "
                    f"the privacy budget guard: {why}")
        if self.participation and all(p[2] == 0 for p in self.participation):
            return (f"every phase aborted ({len(self.aborted)} of {len(self.participation)}); "
                    "no upload was aggregated, the model is the untrained initial one")
        if self.rounds < self.planned_rounds:
            why = self.aborted[-1][2] if self.aborted else "stopped"
            return (f"stopped after {self.rounds} of {self.planned_rounds} rounds by the "
                    f"privacy budget guard: {why}")
        return None

    def to_dict(self, profile: HardwareProfile | str = "phone-wifi") -> dict[str, Any]:
        """JSON-able summary (no ledger rows or transcript records): final and best-round
        accuracy, the accuracy curve (``history``), byte totals per direction and the
        deterministic client device figures on ``profile``."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        d = {
            "algorithm": self.algorithm,
            "layer": self.layer,
            "rounds": self.rounds,
            "planned_rounds": self.planned_rounds,
            "seed": self.seed,
            "n_clients": self.n_clients,
            "accuracy": self.accuracy,
            "accuracy_kind": self.accuracy_kind,
            "best_accuracy": self.best_accuracy,
            "best_round": self.best_round,
            "history": self.history,
            "failure": self.failure(),
            "clips": self.clips,
            "aborted": self.aborted,
            "participation": self.participation,
            "measurements": self.measurements,
            "wall_s": self.wall_s,
            "costs": {d: self.costs.total(direction=d) for d in DIRECTIONS},
            "client_rounds": self.costs.client_rounds(),
            "device": {"profile": prof.name, **self.costs.estimate(prof)},
        }
        if self.privacy is not None and hasattr(self.privacy, "to_dict"):
            d["privacy"] = self.privacy.to_dict()
        return d

    def save(self, out_dir: str | Path,
             profile: HardwareProfile | str = "phone-wifi") -> dict[str, Path]:
        """Write ``result.json``, ``costs.csv`` (with the device columns for ``profile``) and
        ``transcript.jsonl`` (closed: see :meth:`secagg.transcript.Transcript.close`) into
        ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "result": out / "result.json",
            "costs": out / "costs.csv",
            "transcript": out / "transcript.jsonl",
        }
        paths["result"].write_text(
            json.dumps(self.to_dict(profile), indent=2, default=str) + "\n")
        self.costs.to_csv(paths["costs"], profile)
        self.transcript.close(self.rounds, self.failure())
        self.transcript.write(paths["transcript"])
        return paths

    def table(self, profile: HardwareProfile | str = "phone-wifi") -> str:
        """The closing table: final and best-round accuracy, bytes per client per round,
        the client's compute (FLOPs) and its deterministic device time and energy on
        ``profile``, internal traffic, and the measured host CPU seconds apart."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        up, down = self.costs.total("up"), self.costs.total("down")
        internal = self.costs.total("internal")
        per = max(1, self.costs.client_rounds())  # clients only: server/decryptor never count
        est = self.costs.estimate(prof)
        rows = [
            (f"accuracy ({self.accuracy_kind}), final", f"{self.accuracy:.4f}"),
            ("accuracy, best round", f"{self.best_accuracy:.4f} after round "
             f"{self.best_round + 1} of {self.rounds} (curve in result.json: history)"),
            ("rounds", str(self.rounds) if self.rounds == self.planned_rounds
             else f"{self.rounds} of {self.planned_rounds}"),
            ("uplink bytes / client / round", f"{up['wire_bytes'] / per:,.0f}"),
            ("downlink bytes / client / round", f"{down['wire_bytes'] / per:,.0f}"),
            ("uplink / downlink bytes, total",
             f"{int(up['wire_bytes']):,} / {int(down['wire_bytes']):,}"),
            ("internal bytes (server, decryptor), total", f"{int(internal['wire_bytes']):,}"),
            ("client compute / client / round", f"{est['flops_per_client_round']:,.3g} FLOP"),
            (f"est. client latency / client / round ({prof.name})",
             f"{est['latency_s_per_client_round']:.3f} s "
             f"(compute {est['compute_s_per_client_round']:.3f} s)"),
            (f"est. client energy / client / round ({prof.name})",
             f"{est['energy_j_per_client_round']:.4g} J"),
            (f"est. client energy, total ({prof.name})", f"{est['energy_j']:.4g} J"),
            ("host CPU s, measured (client / server)",
             f"{up['client_cpu_s'] + down['client_cpu_s']:.2f} / "
             f"{sum(self.costs.total(d)['server_cpu_s'] for d in DIRECTIONS):.2f}"),
        ]
        if self.privacy is not None and hasattr(self.privacy, "summary_rows"):
            rows.extend(self.privacy.summary_rows())
        if self.clips:
            rows.append(("clipped uploads", json.dumps(self.clips)))
        got = sum(p[2] for p in self.participation)
        asked = sum(p[3] for p in self.participation)
        if got < asked:
            rows.append(("uploads aggregated / sampled", f"{got:,} / {asked:,} "
                         f"({got / asked:.1%}; dropouts and aborted sums)"))
        if self.aborted:
            rows.append(("aborted phases", str(len(self.aborted))))
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


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


def guard_phase(
    step: Callable[[], int], round: int, phase: str, cohort: int, on_abort: str,
    aborted: list[tuple[int, str, str]], participation: list[tuple[int, str, int, int]],
) -> bool:
    """Run one phase's ``step`` (which returns how many uploads its aggregate holds) and
    book the outcome, as every runtime does: its participation; or, for an aborted secure
    sum, the abort (re-raised when ``on_abort="raise"``, else recorded with 0 uploads); or,
    when the privacy guard refused a release before it happened, the refusal. Returns False
    when the run must stop there (the refusal), True otherwise."""
    try:
        got = step()
    except SecureSumAborted as exc:
        if on_abort == "raise":
            raise
        aborted.append((round, phase, str(exc)))
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
    """The server's end of a phase, as every runtime does it: the aggregate learns the
    size of the sampled ``cohort`` (:attr:`Aggregate.cohort`), the phase's server step runs
    on it (booked as a ``solve`` row with its CPU time), then what the phase
    measured (:meth:`algorithms.base.Phase.measurements`, when it has that hook and
    reports anything) appended to ``measurements`` as ``{"round", "phase", **values}``."""
    agg.cohort = int(cohort)
    t0 = time.process_time()
    phase.server_step(agg)
    ctx.message(SERVER, SERVER, "solve", 0, server_cpu_s=time.process_time() - t0)
    measure = getattr(phase, "measurements", None)
    values = measure() if callable(measure) else None
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
    from secagg.privacy.sensitivity import check_training_adjacency, dp_adjacency

    seen: set[tuple[Any, ...]] = set()
    for r in range(rounds):
        for phase in algorithm.phases(r, rounds):
            trained = tuple(getattr(phase, "trained_fields", lambda: ())())
            dpsgd = bool(getattr(phase, "trained_with_dpsgd", lambda: False)())
            if (phase.name, trained, dpsgd) in seen:
                continue
            seen.add((phase.name, trained, dpsgd))
            spec = phase.spec()
            check_training_adjacency(
                phase.name, spec, trained, dp_adjacency(layer, spec), dpsgd,
                getattr(phase, "training_note", ""),
                max_records_given or spec.max_records is not None)
    maker = getattr(layer, "make_privacy_ledger", None)
    return maker() if callable(maker) else None


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

    def _check_threat(self, max_records: int) -> list[str]:
        """Judge every phase's fields against ``self.threat``; raise InadmissibleField for
        the first unprotected one unless ``allow_leaks`` (then return them all)."""
        specs: dict[str, UploadSpec] = {}
        for r in range(self.rounds):
            for ph in self.algorithm.phases(r, self.rounds):
                if ph.name not in specs:
                    spec = ph.spec()
                    specs[ph.name] = spec if spec.max_records is not None else replace(
                        spec, max_records=max_records)
        cohort = cohort_size(len(self.partition), self.fraction)
        d = self.dropouts
        may_drop = bool(d.default > 0 or (any(float(v) > 0 for v in d.rate.values())
                                          if isinstance(d.rate, Mapping) else d.rate > 0))
        verdicts = self.threat.check(self.algorithm, self.layer, specs, n_clients=cohort,
                                     rounds=self.rounds, fraction=self.fraction,
                                     dropouts=may_drop)
        leaks = [v for v in verdicts if not v.ok]
        if leaks and not self.allow_leaks:
            v = leaks[0]
            name = getattr(self.threat, "name", str(self.threat))
            raise InadmissibleField(
                self.layer.name, v.field,
                f"phase {v.phase!r}: not protected against threat {name!r}: {v.reason} "
                "(choose a layer that protects it, or pass allow_leaks=True to run anyway; "
                "the transcript then records the leak)")
        return [str(v) for v in leaks]

    def _round_invariant(self) -> dict[str, list[str]]:
        """Phase -> the fields its algorithm declares round-invariant (``Phase.
        round_invariant_fields``), for the threat audit's differencing rule."""
        out: dict[str, list[str]] = {}
        for r in range(self.rounds):
            for ph in self.algorithm.phases(r, self.rounds):
                # a duck-typed phase (not an algorithms.base.Phase) declares nothing
                declared = getattr(ph, "round_invariant_fields", None)
                names = list(declared()) if callable(declared) else []
                if names:
                    out.setdefault(ph.name, [])
                    out[ph.name] += [n for n in names if n not in out[ph.name]]
        return out

    def _cohort(self, rng: np.random.Generator) -> list[int]:
        return sample_cohort(rng, len(self.partition), self.fraction)

    def run(self) -> Result:
        """Run all rounds and return the :class:`Result`.

        Raises:
            SecureSumAborted: a secure sum lost too many clients (unless on_abort="skip").
            UploadError: a client's upload broke its spec (unless on_violation="clip").
            InadmissibleField: the layer cannot carry a field of some phase.
        """
        t_start = time.perf_counter()
        ledger, transcript = Ledger(), Transcript(self.include_values)
        states = [ClientState(cd) for cd in self.partition]
        dataset = self.partition.dataset
        max_records = DEFAULT_MAX_RECORDS if self.max_records is None else self.max_records
        transcript.meta(
            algorithm=self.algorithm.describe(),
            layer=self.layer.describe(),
            seed=self.seed,
            rounds=self.rounds,
            clients=len(states),
            fraction=self.fraction,
            **({} if self.threat is None else {
                "threat": self.threat.describe(), "allow_leaks": self.allow_leaks}),
        )
        header = transcript.records[-1]
        self.algorithm.setup(dataset, states, self.seed)
        if self.threat is not None:
            header["leaks"] = self._check_threat(max_records)
        made = plan_privacy(self.algorithm, self.layer, self.rounds,
                            self.max_records is not None)
        header["layer"] = self.layer.describe()  # as planned (noise for the real releases)
        header["round_invariant"] = self._round_invariant()
        # a fresh ledger per run (unless one was given)
        self.privacy = self._privacy_arg if self._privacy_arg is not None else made
        self._unnoised: dict[tuple[str, str], str] = {}  # kept until a ledger exists
        rng = np.random.default_rng(derive_seed(self.seed, "cohort"))
        history: list[float] = []
        clips = ClipReport()
        aborted: list[tuple[int, str, str]] = []
        participation: list[tuple[int, str, int, int]] = []
        checked: set[str] = set()
        self._measurements: list[dict[str, Any]] = []
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=self.rounds,
                desc=f"{self.algorithm.name}/{self.layer.name}",
                unit="round",
                file=sys.stderr,
            )
        stopped = False
        for r in range(self.rounds):
            cohort = self._cohort(rng)
            for phase in self.algorithm.phases(r, self.rounds):
                spec = phase.spec()
                local = not spec.fields  # a local-only phase: no layer, no release
                if not local:
                    spec = run_spec(phase, self.layer, max_records, checked)
                ctx = RoundContext(
                    r,
                    phase.name,
                    derive_seed(self.seed, r, phase.name),
                    ledger,
                    transcript,
                    self.dropouts,
                    self.privacy,
                )
                if local:
                    got = self._run_local(phase, cohort, states, ctx)
                    participation.append((r, phase.name, got, len(cohort)))
                    continue
                if not guard_phase(
                        partial(self._run_phase, phase, spec, cohort, states, ctx, clips),
                        r, phase.name, len(cohort), self.on_abort, aborted, participation):
                    stopped = True
                    break
            history.append(float(self.algorithm.evaluate(dataset, states)))
            if bar is not None:
                bar.set_postfix(acc=f"{history[-1]:.3f}")
                bar.update(1)
            if stopped:
                break
        if bar is not None:
            bar.close()
        if self.privacy is not None and hasattr(self.privacy, "record_in"):
            self.privacy.record_in(transcript)
        kind = (
            "mean local test" if getattr(self.algorithm, "personalized", False) else "global test"
        )
        return Result(
            algorithm=self.algorithm.describe(),
            layer=self.layer.describe(),
            rounds=len(history),
            seed=self.seed,
            accuracy=history[-1],
            accuracy_kind=kind,
            history=history,
            costs=ledger,
            transcript=transcript,
            privacy=self.privacy,
            clips=dict(clips.counts),
            aborted=aborted,
            participation=participation,
            measurements=self._measurements,
            n_clients=len(states),
            wall_s=time.perf_counter() - t_start,
        )

    def _broadcast(
        self, phase: _Phase, cohort: list[int], ctx: RoundContext
    ) -> dict[str, np.ndarray]:
        payload = phase.broadcast()
        if not payload:
            return {}
        t0 = time.process_time()
        wire = pack_arrays(payload)
        server_s = time.process_time() - t0
        t0 = time.process_time()
        decoded = unpack_arrays(wire)
        client_s = time.process_time() - t0
        plain = int(sum(np.asarray(v).nbytes for v in payload.values()))
        for c in cohort:
            ctx.message(
                SERVER,
                c,
                "broadcast",
                wire,
                plaintext_bytes=plain,
                fields={k: int(np.asarray(v).nbytes) for k, v in payload.items()},
                client_cpu_s=client_s,
                server_cpu_s=server_s,
            )
        return decoded

    def _run_phase(
        self,
        phase: _Phase,
        spec: UploadSpec,
        cohort: list[int],
        states: list[ClientState],
        ctx: RoundContext,
        clips: ClipReport,
    ) -> int:
        """Broadcast, client steps, privacy accounting of the local work, layer, server step;
        returns how many clients' uploads the aggregate contains."""
        bcast = self._broadcast(phase, cohort, ctx)
        uploads: dict[int, Upload] = {}
        for c in cohort:
            st = states[c]
            t0 = time.process_time()
            values = phase.client_step(st, bcast)
            dt = time.process_time() - t0
            up = Upload.validate(spec, values, c, st.n_records, self.on_violation)
            up.cpu_s, up.flops = dt, float(phase.client_flops(st))
            clips.add(up)
            uploads[c] = up
        self._account_local_training(phase, spec, ctx)
        agg = self.layer.aggregate(uploads, spec, ctx)
        solve(phase, agg, ctx, self._measurements, len(cohort))
        return len(agg.contributors)

    def _run_local(self, phase: _Phase, cohort: list[int], states: list[ClientState],
                   ctx: RoundContext) -> int:
        """A phase with no upload fields: broadcast, then each selected client's step, booked
        as a zero-byte ``local`` ledger row (its FLOPs and CPU time; no transcript message,
        as nothing is sent); no layer, no server step, no release. Returns the number of
        clients that ran it."""
        bcast = self._broadcast(phase, cohort, ctx)
        for c in cohort:
            t0 = time.process_time()
            out = phase.client_step(states[c], bcast)
            dt = time.process_time() - t0
            if out:
                raise ConfigurationError(
                    f"phase {phase.name!r} declares no upload fields but its client step "
                    f"returned {sorted(out)}: a local phase must return {{}}")
            flops = float(phase.client_flops(states[c]))
            # work, not a message: a ledger row of 0 bytes, nothing in the transcript
            ctx.ledger.record(CostRow(round=ctx.round, phase=ctx.phase, stage="local",
                                      sender=c, receiver=c, client_cpu_s=dt, flops=flops,
                                      step_flops=flops))
        return len(cohort)

    def _account_local_training(self, phase: _Phase, spec: UploadSpec, ctx: RoundContext) -> None:
        """Spend the phase's DP-SGD events before anything leaves a client (one dominating
        event per round: the clients' records are disjoint; a user-seeded training's events
        mark the run not private), and, when a privacy ledger is in use, mark every field
        that neither the layer noises nor DP-SGD covers as released without DP noise."""
        covered = set(getattr(phase, "dp_covered_fields", lambda: ())())
        # Un-noised releases are remembered even before a ledger exists (DP-SGD may start
        # in a later round): a ledger made then still reports every one of them.
        for name, why in self.layer.unnoised_fields(spec).items():
            if name not in covered:
                self._unnoised.setdefault((phase.name, name), why)
        events = list(getattr(phase, "privacy_events", lambda: [])())
        if events:
            from secagg.privacy.accountant import PrivacyLedger
            from secagg.privacy.dpsgd import round_event

            if self.privacy is None:  # DP-SGD under a non-DP layer: a ledger at delta 1e-5
                self.privacy = PrivacyLedger(delta=1e-5)
                ctx.privacy = self.privacy
            # every field of the upload is computed after the training, so each field's
            # guarantee composes with it (conservative for fields that do not use the model)
            self.privacy.spend(
                round_event(events, round=ctx.round, phase=ctx.phase, fields=tuple(spec.names))
            )
        if self.privacy is not None:
            for (ph, name), why in self._unnoised.items():
                self.privacy.mark_unnoised(name, ph, why)
