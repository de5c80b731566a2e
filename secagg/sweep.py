"""Privacy-utility sweeps: a grid of federated runs, resumable, in parallel, with a cache.

A sweep is a grid over algorithms x layers x epsilon x delta x clipping bound x dropout x
seeds, read from a TOML file (:func:`load_config`, keys documented in :data:`KEYS` and in
``examples/sweep.toml``) or given as a dict to :func:`sweep`. Every cell is one
:class:`~secagg.federation.Federation` run; cells run in worker processes (``spawn``
context, ``os.cpu_count()`` workers by default) and each finished cell is appended, with
flush and fsync, to ``results.jsonl`` and ``results.csv`` in the output directory, keyed by
a stable cell id (a hash of everything that determines the cell's result). Rerunning the
same sweep skips the cells already recorded, so an interrupted sweep loses only the cells
that were running.

Which releases are noised. By default every phase of every round goes through the cell's
DP layer. ``dp_phases`` (phase names) and ``dp_rounds`` (``"all"`` or ``"last"``) restrict
the DP layer to some releases -- e.g. SphereFed's ``"ffc"`` calibration on a body trained
without DP, or FedLog's last-round head. The other releases then go through the DP
layer's inner layer (Plaintext or SecureSum) *without noise*; the run's privacy ledger is
marked not private with that reason, and the epsilon reported covers the noised releases
only. Nothing is called private that is not.

The statistics cache. When an upload does not depend on the noise of earlier releases
(one-shot statistics: a Gram/ridge solve, CCVR's moments or SphereFed's FFC on a fixed
body, a FedLog head on fixed bodies), the clients' statistics are the same in every cell
that differs only in the DP layer, epsilon or delta. The sweep then runs one *recording*
cell per group (same algorithm, data, seed, dropout, clip and inner layer), which stores
what the non-noised releases gave the server and the clients' uploads of the noised ones;
every other cell of the group *replays* them and only re-noises. Replay is checked, not
assumed: before each client step the broadcast is compared (SHA-256) with the recorded
one, and the first difference -- an upload that does depend on earlier noise -- abandons
the replay and runs the cell for real. The ``cache`` column says ``record``, ``hit``,
``miss`` (fell back) or ``off``. With the same (seeded) noise a cached cell equals the
uncached one exactly (tests/test_sweep.py).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import inspect
import io
import json
import math
import os
import pickle
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from secagg.errors import ConfigurationError, SecaggError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec

__all__ = ["KEYS", "Cell", "SweepConfig", "SweepResult", "load_config", "sweep", "run_cell"]

DP_LAYERS = ("central-dp", "local-dp", "distributed-dp")
PLAIN_LAYERS = ("plaintext", "secure-sum")
#: Algorithm constructor argument the ``clip`` grid axis sets, by algorithm name.
CLIP_ARGUMENT = {"fedlog": "feature_bound", "ccvr": "feature_bound", "fedavg": "param_bound",
                 "fedprox": "param_bound", "feduv": "param_bound", "turbosvm": "param_bound"}

#: Every TOML key the sweep reads: table -> key -> (type, meaning).
KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "sweep": {
        "out": ("str", "output directory (default runs/sweep-NAME, NAME the config's stem)"),
        "rounds": ("int", "rounds per run"),
        "fraction": ("float", "fraction of clients sampled per round (default 1)"),
        "threshold": ("float", "secure-sum threshold, fraction (<1) or count (default 0.7)"),
        "adjacency": ("str", "DP adjacency, 'record' or 'client' (default: the layers')"),
        "dp_phases": ("list[str]", "phases the DP layer noises (default: all)"),
        "dp_rounds": ("str", "'all' (default) or 'last': rounds the DP layer noises"),
        "cache": ("bool", "reuse client statistics across epsilon/delta/layer (default true)"),
        "workers": ("int", "worker processes (default os.cpu_count(); 0 runs in-process)"),
        "device_profile": ("str", "profile for energy/latency estimates (default phone-wifi)"),
        "noise_seed": ("int", "seed the DP noise (reproducible, NOT private; tests only)"),
        "plot": ("bool", "draw the plots beside the results when done (default true)"),
    },
    "data": {
        "dataset": ("str", "digits | fashion-mnist | mnist"),
        "data_dir": ("str", "directory of the IDX .gz files"),
        "clients": ("int", "number of clients"),
        "alpha": ("float", "Dirichlet concentration; 0 means IID"),
        "train_limit": ("int", "use only the first N training records"),
        "local_test_fraction": ("float", "local test split per client, in [0, 1) (default "
                                "0.2); 0 trains on every record (algorithms scored on the "
                                "global test set; personalized ones need local test sets)"),
    },
    "grid": {
        "algorithms": ("list[str]", "registered algorithm names (or module:Class)"),
        "layers": ("list[str]", "plaintext, secure-sum, central-dp, local-dp, distributed-dp"),
        "epsilon": ("list[float]", "total epsilon of a DP run (> 0)"),
        "delta": ("list[float]", "delta in (0, 1) (default [1e-5])"),
        "clip": ("list[float]", "clipping bound, passed to the algorithm's bound argument"),
        "dropout": ("list[float]", "per-round dropout probability in [0, 1) (default [0])"),
        "seeds": ("list[int]", "run seeds (default [0])"),
    },
    "algorithm": {"*": ("table", "[algorithm.NAME]: constructor arguments of NAME")},
}


def _err(key: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"sweep config: {key}: {problem}")


def _typed(key: str, value: Any, kind: str) -> Any:
    """Check one value against a KEYS type name."""
    def num(v: Any, integer: bool) -> bool:
        if isinstance(v, bool):
            return False
        return isinstance(v, int) if integer else isinstance(v, (int, float))

    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and num(value, True):
        return int(value)
    if kind == "float" and num(value, False):
        if not math.isfinite(value):
            raise _err(key, f"must be finite, got {value!r}")
        return float(value)
    if kind.startswith("list[") and isinstance(value, list):
        inner = kind[5:-1]
        if not value:
            raise _err(key, "is empty: the grid would have no cells (leave the key out for "
                       "its default)")
        return [_typed(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    raise _err(key, f"expected {kind}, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class Cell:
    """One run of the grid. ``epsilon``/``delta`` are None for non-DP layers, ``clip`` is
    None for the algorithm's default bound."""

    algorithm: str
    layer: str
    epsilon: float | None
    delta: float | None
    clip: float | None
    dropout: float
    seed: int


@dataclass
class SweepConfig:
    """A validated sweep: the run settings, the data, the grid and algorithm arguments."""

    out: Path
    rounds: int = 3
    fraction: float = 1.0
    threshold: float = 0.7
    adjacency: str | None = None
    dp_phases: tuple[str, ...] | None = None
    dp_rounds: str = "all"
    cache: bool = True
    workers: int | None = None
    device_profile: str = "phone-wifi"
    noise_seed: int | None = None
    plot: bool = True
    data: dict[str, Any] = field(default_factory=dict)
    algorithms: tuple[str, ...] = ("fedlog",)
    layers: tuple[str, ...] = ("plaintext",)
    epsilon: tuple[float, ...] = ()
    delta: tuple[float, ...] = (1e-5,)
    clip: tuple[float | None, ...] = (None,)
    dropout: tuple[float, ...] = (0.0,)
    seeds: tuple[int, ...] = (0,)
    algorithm_args: dict[str, dict[str, Any]] = field(default_factory=dict)

    def cells(self) -> list[Cell]:
        """Every cell of the grid, in a stable order (non-DP layers once per epsilon/delta)."""
        out: list[Cell] = []
        for algo in self.algorithms:
            for clip in self.clip:
                for drop in self.dropout:
                    for seed in self.seeds:
                        for layer in self.layers:
                            if layer in DP_LAYERS:
                                out.extend(Cell(algo, layer, e, d, clip, drop, seed)
                                           for d in self.delta for e in self.epsilon)
                            else:
                                out.append(Cell(algo, layer, None, None, clip, drop, seed))
        return out

    def settings(self) -> dict[str, Any]:
        """Everything besides the cell that determines a result (hashed into cell ids)."""
        return {"rounds": self.rounds, "fraction": self.fraction, "threshold": self.threshold,
                "adjacency": self.adjacency, "dp_phases": self.dp_phases,
                "dp_rounds": self.dp_rounds, "noise_seed": self.noise_seed,
                "data": self.data, "algorithm_args": self.algorithm_args,
                "device_profile": self.device_profile}

    def _settings_for(self, algorithm: str) -> dict[str, Any]:
        """:meth:`settings` with only ``algorithm``'s constructor arguments: adding another
        algorithm (or its arguments) to a sweep leaves this algorithm's cells as they were."""
        s = self.settings()
        s["algorithm_args"] = self.algorithm_args.get(algorithm, {})
        return s

    def cell_id(self, cell: Cell) -> str:
        """Stable id: SHA-256 of the cell and the settings, 16 hex digits."""
        blob = json.dumps({"cell": dataclasses.asdict(cell), **self._settings_for(cell.algorithm)},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def cache_key(self, cell: Cell) -> str:
        """Cells with the same key see the same client statistics (all but layer noise)."""
        inner = "secure-sum" if cell.layer in ("secure-sum", "distributed-dp") else "plaintext"
        s = self._settings_for(cell.algorithm)
        s.pop("noise_seed")
        blob = json.dumps({"algorithm": cell.algorithm, "clip": cell.clip,
                           "dropout": cell.dropout, "seed": cell.seed, "inner": inner, **s},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_config(source: str | os.PathLike[str] | Mapping[str, Any],
                out: str | os.PathLike[str] | None = None) -> SweepConfig:
    """Read and validate a sweep config (a TOML path or an already parsed mapping).

    Raises:
        ConfigurationError: unknown key, wrong type, empty grid, bad value; the message
            names the key (``grid.epsilon[1]``, ``sweep.rounds``, ...).
    """
    name = "sweep"
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        name = path.stem
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"sweep config: no such file {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"sweep config {path}: not valid TOML: {exc}") from None
    for table in raw:
        if table not in KEYS:
            raise _err(table, f"unknown table; known: {', '.join(sorted(KEYS))}")
        if not isinstance(raw[table], Mapping):
            raise _err(table, "must be a table ([" + table + "])")
    vals: dict[str, Any] = {}
    for table in ("sweep", "data", "grid"):
        for key, value in raw.get(table, {}).items():
            if key not in KEYS[table]:
                raise _err(f"{table}.{key}", "unknown key; known: "
                           + ", ".join(sorted(KEYS[table])))
            vals[f"{table}.{key}"] = _typed(f"{table}.{key}", value, KEYS[table][key][0])
    g = {k.split(".", 1)[1]: v for k, v in vals.items() if k.startswith("grid.")}
    s = {k.split(".", 1)[1]: v for k, v in vals.items() if k.startswith("sweep.")}
    data = {k.split(".", 1)[1]: v for k, v in vals.items() if k.startswith("data.")}
    if "algorithms" not in g or "layers" not in g:
        raise _err("grid", "needs algorithms = [...] and layers = [...]")
    from secagg.cli import LAYERS

    for i, layer in enumerate(g["layers"]):
        if layer not in LAYERS or layer == "homomorphic":
            raise _err(f"grid.layers[{i}]", f"unknown layer {layer!r}; use one of "
                       + ", ".join(PLAIN_LAYERS + DP_LAYERS))
    dp = any(layer in DP_LAYERS for layer in g["layers"])
    if dp and "epsilon" not in g:
        raise _err("grid.epsilon", "DP layers are in the grid but no epsilon is given")
    if not dp and "epsilon" in g:
        raise _err("grid.epsilon", "given, but no DP layer in grid.layers uses it")
    for i, e in enumerate(g.get("epsilon", [])):
        if e <= 0:
            raise _err(f"grid.epsilon[{i}]", f"must be > 0, got {e!r}")
    for i, d in enumerate(g.get("delta", [])):
        if not 0 < d < 1:
            raise _err(f"grid.delta[{i}]", f"must be in (0, 1), got {d!r}")
    for i, c in enumerate(g.get("clip", [])):
        if c <= 0:
            raise _err(f"grid.clip[{i}]", f"must be > 0, got {c!r}")
    for i, p in enumerate(g.get("dropout", [])):
        if not 0 <= p < 1:
            raise _err(f"grid.dropout[{i}]", f"must be in [0, 1), got {p!r}")
    for i, seed in enumerate(g.get("seeds", [])):
        if seed < 0:
            raise _err(f"grid.seeds[{i}]", f"must be >= 0, got {seed!r}")
    if "clip" in g:
        for algo in g["algorithms"]:
            if algo not in CLIP_ARGUMENT:
                raise _err("grid.clip", f"algorithm {algo!r} has no clipping-bound argument "
                           "the sweep knows; set the bound in [algorithm." + algo + "]")
    if s.get("rounds", 1) < 1:
        raise _err("sweep.rounds", f"must be >= 1, got {s['rounds']}")
    if not 0 < s.get("fraction", 1.0) <= 1:
        raise _err("sweep.fraction", f"must be in (0, 1], got {s['fraction']}")
    if s.get("threshold", 0.7) <= 0:
        raise _err("sweep.threshold", f"must be > 0, got {s['threshold']}")
    if s.get("adjacency", "record") not in ("record", "client"):
        raise _err("sweep.adjacency", f"must be 'record' or 'client', got {s['adjacency']!r}")
    if s.get("dp_rounds", "all") not in ("all", "last"):
        raise _err("sweep.dp_rounds", f"must be 'all' or 'last', got {s['dp_rounds']!r}")
    if s.get("workers", 0) < 0:
        raise _err("sweep.workers", f"must be >= 0, got {s['workers']}")
    if s.get("noise_seed", 0) < 0:
        raise _err("sweep.noise_seed", f"must be >= 0, got {s['noise_seed']}")
    from secagg.costs import PROFILES

    if s.get("device_profile", "phone-wifi") not in PROFILES:
        raise _err("sweep.device_profile", f"unknown profile {s['device_profile']!r}; known: "
                   + ", ".join(sorted(PROFILES)))
    if data.get("dataset", "digits") not in ("digits", "fashion-mnist", "mnist"):
        raise _err("data.dataset", f"unknown data set {data['dataset']!r}")
    if data.get("clients", 1) < 1:
        raise _err("data.clients", f"must be >= 1, got {data['clients']}")
    if data.get("alpha", 0.0) < 0:
        raise _err("data.alpha", f"must be >= 0 (0 means IID), got {data['alpha']}")
    if data.get("train_limit", 1) < 1:
        raise _err("data.train_limit", f"must be >= 1, got {data['train_limit']}")
    if not 0 <= data.get("local_test_fraction", 0.2) < 1:
        raise _err("data.local_test_fraction", "must be in [0, 1)")
    classes = _resolve(g["algorithms"])
    if data.get("local_test_fraction", 0.2) == 0:
        personal = [n for n, c in classes.items() if getattr(c, "personalized", False)]
        if personal:
            raise _err("data.local_test_fraction", f"0 leaves no local test sets, and "
                       f"{', '.join(personal)} is scored on them (personalized); give a "
                       "fraction in (0, 1), or sweep it separately")
    algo_args: dict[str, dict[str, Any]] = {}
    for algo, kwargs in raw.get("algorithm", {}).items():
        if algo not in g["algorithms"]:
            raise _err(f"algorithm.{algo}", "arguments for an algorithm not in grid.algorithms")
        if not isinstance(kwargs, Mapping):
            raise _err(f"algorithm.{algo}", "must be a table of constructor arguments")
        algo_args[algo] = dict(kwargs)
    _check_arguments(classes, algo_args, "clip" in g)
    out_dir = Path(out) if out is not None else Path(s.get("out", f"runs/sweep-{name}"))
    return SweepConfig(
        out=out_dir, rounds=s.get("rounds", 3), fraction=s.get("fraction", 1.0),
        threshold=s.get("threshold", 0.7), adjacency=s.get("adjacency"),
        dp_phases=tuple(s["dp_phases"]) if "dp_phases" in s else None,
        dp_rounds=s.get("dp_rounds", "all"), cache=s.get("cache", True),
        workers=s.get("workers"), device_profile=s.get("device_profile", "phone-wifi"),
        noise_seed=s.get("noise_seed"), plot=s.get("plot", True),
        data={"dataset": "digits", "clients": 10, "alpha": 0.5, "local_test_fraction": 0.2,
              **data},
        algorithms=tuple(g["algorithms"]), layers=tuple(g["layers"]),
        epsilon=tuple(g.get("epsilon", ())), delta=tuple(g.get("delta", (1e-5,))),
        clip=tuple(g.get("clip", (None,))), dropout=tuple(g.get("dropout", (0.0,))),
        seeds=tuple(g.get("seeds", (0,))), algorithm_args=algo_args,
    )


def _resolve(names: Sequence[str]) -> dict[str, type]:
    """The algorithm classes, through the CLI's entry-point resolution."""
    from secagg.cli import load_algorithm

    out = {}
    for i, name in enumerate(names):
        try:
            out[name] = load_algorithm(name)
        except SecaggError as exc:
            raise _err(f"grid.algorithms[{i}]", str(exc)) from None
    return out


def _check_arguments(classes: Mapping[str, type], args: Mapping[str, Mapping[str, Any]],
                     clip: bool) -> None:
    for name, cls in classes.items():
        params = inspect.signature(cls).parameters
        open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for key in args.get(name, {}):
            if key not in params and not open_kwargs:
                raise _err(f"algorithm.{name}.{key}", f"{name} takes no argument {key!r}")
        if "dpsgd" in args.get(name, {}):
            raise _err(f"algorithm.{name}.dpsgd", "DP-SGD is not a sweep axis yet")
        if clip and CLIP_ARGUMENT.get(name) in args.get(name, {}):
            raise _err(f"algorithm.{name}.{CLIP_ARGUMENT[name]}",
                       "set both here and by grid.clip; give it in one place")


# -- the staged layer: which releases are noised, recording and replay ----------------------


class _CacheMiss(Exception):
    """A replayed cell met a broadcast that differs from the recording."""


def _digest(payload: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(payload):
        a = np.ascontiguousarray(payload[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass
class _Tape:
    """What a recording cell stores and a replaying cell reads back."""

    digests: dict[tuple[int, str], str] = field(default_factory=dict)
    uploads: dict[tuple[int, str], dict[int, dict[str, np.ndarray]]] = field(
        default_factory=dict)
    aggregates: dict[tuple[int, str], Aggregate] = field(default_factory=dict)
    rows: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    records: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)
    history: list[float] = field(default_factory=list)
    states: list[dict[str, Any]] | None = None


class _Staged(Layer):
    """Routes each release to the DP layer (selected releases) or to its inner layer, and
    records or replays the inner layer's results for the statistics cache."""

    name: ClassVar[str] = "staged"

    def __init__(self, dp: Layer | None, inner: Layer, select: Any, algorithm: Any,
                 rounds: int, tape: _Tape | None = None, replay: bool = False) -> None:
        self.dp, self.inner, self.select = dp, inner, select
        self.algorithm, self.rounds = algorithm, rounds
        self.tape, self.replay = tape, replay
        self.name = (dp or inner).name  # type: ignore[misc]

    def check(self, spec: UploadSpec) -> None:
        """The inner layer's checks (the DP layer checks its releases when it makes them)."""
        self.inner.check(spec)

    def dropout_stages(self) -> tuple[str, ...]:
        """The inner layer's stages."""
        return self.inner.dropout_stages()

    def describe(self) -> dict[str, Any]:
        """The DP (or inner) layer's description."""
        return (self.dp or self.inner).describe()

    def plan_releases(self, releases: int) -> None:
        """Plan the DP layer for the releases it noises (not the engine's total)."""
        if self.dp is None:
            return
        n = sum(1 for r in range(self.rounds) for p in self.algorithm.phases(r, self.rounds)
                if self.select(r, p.name) and p.spec().fields)  # local phases release nothing
        if n == 0:
            names = sorted({p.name for r in range(self.rounds)
                            for p in self.algorithm.phases(r, self.rounds)})
            raise ConfigurationError(f"sweep config: sweep.dp_phases: selects no release; the "
                                     f"algorithm's phases are {names}")
        self.dp.plan_releases(n)  # type: ignore[attr-defined]

    def unnoised_fields(self, spec: UploadSpec) -> dict[str, str]:
        """The DP layer's answer (or the inner layer's without DP); a release the DP layer
        does not select is marked not private when it is made (:meth:`aggregate`)."""
        return (self.dp or self.inner).unnoised_fields(spec)

    def make_privacy_ledger(self) -> Any:
        """The DP layer's ledger (None without DP)."""
        return None if self.dp is None else self.dp.make_privacy_ledger()  # type: ignore

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """Noise a selected release through the DP layer; otherwise the inner layer (or its
        recorded result)."""
        key = (ctx.round, ctx.phase)
        if self.dp is not None and self.select(ctx.round, ctx.phase):
            return self.dp.aggregate(uploads, spec, ctx)
        if self.dp is not None and ctx.privacy is not None:
            ctx.privacy.mark_not_private(
                f"sweep: phase {ctx.phase!r} (round {ctx.round}) released through "
                f"{self.inner.name!r} without DP noise (sweep.dp_phases / sweep.dp_rounds); "
                "epsilon covers the noised releases only")
        if self.replay:
            assert self.tape is not None
            ctx.ledger.rows.extend(copy.deepcopy(self.tape.rows[key]))
            ctx.transcript.extend(copy.deepcopy(self.tape.records[key]))
            return copy.deepcopy(self.tape.aggregates[key])
        n_rows, n_rec = len(ctx.ledger.rows), len(ctx.transcript.records)
        agg = self.inner.aggregate(uploads, spec, ctx)
        if self.tape is not None:
            self.tape.rows[key] = copy.deepcopy(ctx.ledger.rows[n_rows:])
            self.tape.records[key] = copy.deepcopy(ctx.transcript.records[n_rec:])
            self.tape.aggregates[key] = copy.deepcopy(agg)
        return agg


class _TapedPhase:
    """A phase whose client steps are recorded, or replayed after a broadcast check."""

    def __init__(self, phase: Any, round: int, owner: _TapedAlgorithm) -> None:
        self._phase, self._round, self._owner = phase, round, owner
        self.name = phase.name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._phase, item)

    def client_step(self, client: Any, broadcast: Mapping[str, np.ndarray]) -> Any:
        o, key = self._owner, (self._round, self.name)
        if not self._phase.spec().fields:  # a local phase: no upload to record or replay
            if not o.replay:
                o.tape.digests[key] = _digest(broadcast)
                return self._phase.client_step(client, broadcast)
            if o.noised_yet or o.tape.digests.get(key) != _digest(broadcast):
                raise _CacheMiss(f"round {self._round}, local phase {self.name!r} follows a "
                                 "noised release (the clients' state depends on the noise)")
            return {}  # replayed like the uploads: the final states come from the tape
        selected = o.select(self._round, self.name)
        if selected:
            o.noised_yet = True
        if o.replay:
            if o.tape.digests.get(key) != _digest(broadcast):
                raise _CacheMiss(f"round {self._round}, phase {self.name!r}: broadcast differs")
            if selected:
                return o.tape.uploads[key][client.id]
            spec = self._phase.spec()
            return {f.name: np.zeros(f.shape, f.dtype) for f in spec.fields}
        o.tape.digests[key] = _digest(broadcast)
        values = self._phase.client_step(client, broadcast)
        if selected:
            o.tape.uploads.setdefault(key, {})[client.id] = {
                k: np.array(v, copy=True) for k, v in values.items()}
        return values


class _TapedAlgorithm:
    """Wraps an algorithm for recording (the real run, taped) or replay (client steps read
    back, evaluation before the first noised release read back too)."""

    def __init__(self, algorithm: Any, tape: _Tape, replay: bool, select: Any,
                 rounds: int) -> None:
        self._algo, self.tape, self.replay = algorithm, tape, replay
        self.select, self.rounds = select, rounds
        self.noised_yet = False
        self._evaluations = 0

    def __getattr__(self, item: str) -> Any:
        return getattr(self._algo, item)

    def phases(self, round: int, rounds: int) -> list[Any]:
        """The algorithm's phases, taped."""
        return [_TapedPhase(p, round, self) for p in self._algo.phases(round, rounds)]

    def evaluate(self, dataset: Any, clients: Sequence[Any]) -> float:
        """Evaluate (recording: also store the result, and the final client states)."""
        k = self._evaluations
        self._evaluations += 1
        last = k == self.rounds - 1
        if not self.replay:
            if last:
                self.tape.states = [copy.deepcopy(c.state) for c in clients]
            acc = float(self._algo.evaluate(dataset, clients))
            self.tape.history.append(acc)
            return acc
        if not self.noised_yet:
            return self.tape.history[k]
        if not last or self.tape.states is None:
            raise _CacheMiss(f"evaluation after round {k} follows a noised release")
        for c, st in zip(clients, self.tape.states, strict=True):
            c.state = copy.deepcopy(st)
        return float(self._algo.evaluate(dataset, clients))


# -- running one cell -------------------------------------------------------------------

_DATA: dict[str, Any] = {}


def _partition(data: Mapping[str, Any], seed: int) -> Any:
    """The cell's partition (the loaded data set is kept per process)."""
    from secagg.data import dirichlet_split, iid_split, load_dataset

    name = data.get("dataset", "digits")
    key = json.dumps([name, data.get("data_dir"), data.get("train_limit")])
    if key not in _DATA:
        ds = load_dataset(name, data.get("data_dir"))
        if data.get("train_limit"):
            n = data["train_limit"]
            ds = dataclasses.replace(ds, x_train=ds.x_train[:n], y_train=ds.y_train[:n])
        _DATA.clear()
        _DATA[key] = ds
    ds = _DATA[key]
    ltf = data.get("local_test_fraction", 0.2)
    if data.get("alpha", 0.5) == 0:
        return iid_split(ds, data["clients"], seed=seed, local_test_fraction=ltf)
    return dirichlet_split(ds, data["clients"], data["alpha"], seed=seed,
                           local_test_fraction=ltf)


def _layers(cfg: SweepConfig, cell: Cell) -> tuple[Layer | None, Layer]:
    from secagg.layers.plaintext import Plaintext

    th = cfg.threshold
    threshold: float | int = int(th) if th >= 1 and float(th).is_integer() else th
    if cell.layer in ("secure-sum", "distributed-dp"):
        from secagg.secure_sum import SecureSum

        inner: Layer = SecureSum(threshold=threshold)
    else:
        inner = Plaintext()
    if cell.layer not in DP_LAYERS:
        return None, inner
    from secagg import privacy

    kwargs: dict[str, Any] = {"epsilon": cell.epsilon, "delta": cell.delta}
    if cfg.adjacency is not None:
        kwargs["adjacency"] = cfg.adjacency
    if cfg.noise_seed is not None:
        kwargs["seed"] = cfg.noise_seed
    cls = {"central-dp": privacy.CentralDP, "local-dp": privacy.LocalDP,
           "distributed-dp": privacy.DistributedDP}[cell.layer]
    return cls(inner, **kwargs), inner


def _algorithm(cfg: SweepConfig, cell: Cell) -> Any:
    from secagg.cli import load_algorithm

    kwargs = dict(cfg.algorithm_args.get(cell.algorithm, {}))
    if cell.clip is not None:
        kwargs[CLIP_ARGUMENT[cell.algorithm]] = cell.clip
    return load_algorithm(cell.algorithm)(**kwargs)


def run_cell(cfg: SweepConfig, cell: Cell, mode: str = "off",
             tape_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Run one cell and return its results row.

    ``mode``: ``"off"`` (plain run), ``"record"`` (run and store the statistics tape at
    ``tape_path``) or ``"replay"`` (re-noise the tape; falls back to a plain run, reported
    as ``"miss"``, when the cell's uploads turn out to depend on earlier noise).
    """
    from secagg.costs import get_profile
    from secagg.federation import Federation

    if mode not in ("off", "record", "replay"):
        raise ConfigurationError(f"mode must be off, record or replay, got {mode!r}")
    t0 = time.perf_counter()
    part = _partition(cfg.data, cell.seed)

    def select(r: int, phase: str) -> bool:
        return ((cfg.dp_phases is None or phase in cfg.dp_phases)
                and (cfg.dp_rounds == "all" or r == cfg.rounds - 1))

    def once(how: str) -> Any:
        dp, inner = _layers(cfg, cell)
        algo = _algorithm(cfg, cell)
        tape = None
        if how == "replay":
            with open(tape_path, "rb") as fh:  # type: ignore[arg-type]
                tape = pickle.load(fh)
        elif how == "record":
            tape = _Tape()
        run_algo = algo if tape is None else _TapedAlgorithm(
            algo, tape, how == "replay", select, cfg.rounds)
        layer = _Staged(dp, inner, select, algo, cfg.rounds, tape, how == "replay")
        res = Federation(run_algo, layer, part, rounds=cfg.rounds, fraction=cfg.fraction,
                         dropout=cell.dropout, seed=cell.seed, progress=False).run()
        if how == "record" and tape is not None and tape.states is not None:
            tmp = Path(f"{tape_path}.tmp{os.getpid()}")
            with open(tmp, "wb") as fh:
                pickle.dump(tape, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, tape_path)  # type: ignore[arg-type]
        return res

    status = mode
    if mode == "replay":
        try:
            res = once("replay")
            status = "hit"
        except _CacheMiss:
            res, status = once("off"), "miss"
    else:
        res = once(mode)
    prof = get_profile(cfg.device_profile)
    est = res.costs.estimate(prof)
    row: dict[str, Any] = {
        "id": cfg.cell_id(cell), **dataclasses.asdict(cell),
        "accuracy": res.accuracy, "accuracy_kind": res.accuracy_kind, "rounds": res.rounds,
        "epsilon_spent": None, "private": None, "not_private_reasons": [],
        "uplink_bytes": int(res.costs.total("up")["wire_bytes"]),
        "downlink_bytes": int(res.costs.total("down")["wire_bytes"]),
        "energy_j": est["energy_j"], "latency_s_per_client_round":
            est["latency_s_per_client_round"],
        "device_profile": prof.name, "cache": status, "wall_s": time.perf_counter() - t0,
        "history": res.history, "status": "ok",
    }
    if res.privacy is not None:
        row["epsilon_spent"] = float(res.privacy.epsilon(cell.delta))
        row["private"] = bool(res.privacy.private)
        row["not_private_reasons"] = list(res.privacy.not_private_reasons)
    return row


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued cells and end the workers now (a plain shutdown would wait for the
    running cells, which can take an hour, and a killed parent would leave them running)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


def _task(cfg: SweepConfig, cell: Cell, mode: str, tape: str | None) -> dict[str, Any]:
    """Worker entry point: one cell, errors returned as an error row (never lost)."""
    try:
        import torch

        torch.set_num_threads(1)
        return run_cell(cfg, cell, mode, tape)
    except SecaggError as exc:
        return {"id": cfg.cell_id(cell), **dataclasses.asdict(cell), "status": "error",
                "error": f"{type(exc).__name__}: {exc}", "cache": mode}


# -- the sweep --------------------------------------------------------------------------

CSV_COLUMNS = ("id", "algorithm", "layer", "epsilon", "delta", "clip", "dropout", "seed",
               "accuracy", "accuracy_kind", "rounds", "epsilon_spent", "private",
               "uplink_bytes", "downlink_bytes", "energy_j", "latency_s_per_client_round",
               "device_profile", "cache", "wall_s", "status", "error")


@dataclass
class SweepResult:
    """What a sweep produced: every finished row (old and new), the paths written, and
    the ids of the cells run this time."""

    rows: list[dict[str, Any]]
    jsonl: Path
    csv: Path
    ran: list[str]
    skipped: list[str]
    plots: dict[str, Path] = field(default_factory=dict)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interruption: that cell runs again
    return rows


def _csv_line(row: Mapping[str, Any], header: bool = False) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    if header:
        w.writeheader()
    w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def sweep(config: SweepConfig | str | os.PathLike[str] | Mapping[str, Any], *,
          out: str | os.PathLike[str] | None = None, workers: int | None = None,
          cache: bool | None = None, progress: bool | None = None,
          limit: Sequence[Cell] | None = None) -> SweepResult:
    """Run (or resume) a sweep; return every finished row.

    Args:
        config: a :class:`SweepConfig`, a TOML path or a parsed mapping.
        out: output directory (overrides ``sweep.out``).
        workers: worker processes (overrides ``sweep.workers``; 0 runs in-process).
        cache: use the statistics cache (overrides ``sweep.cache``).
        progress: progress bar over cells (default: on a terminal, not in CI).
        limit: run only these cells of the grid (the rest stay pending).
    """
    cfg = config if isinstance(config, SweepConfig) else load_config(config, out)
    if out is not None:
        cfg.out = Path(out)
    use_cache = cfg.cache if cache is None else cache
    n_workers = cfg.workers if workers is None else workers
    if n_workers is None:
        n_workers = os.cpu_count() or 1
    cfg.out.mkdir(parents=True, exist_ok=True)
    jsonl, csv_path = cfg.out / "results.jsonl", cfg.out / "results.csv"
    old = [r for r in _read_jsonl(jsonl) if r.get("status") == "ok"]
    done = {r["id"] for r in old}
    # the CSV mirrors the finished JSONL rows (rewritten in case an interruption cut it)
    csv_path.write_text("".join(_csv_line(r, i == 0) for i, r in enumerate(old))
                        or _csv_line({}, True).splitlines(keepends=True)[0])
    cells = cfg.cells() if limit is None else list(limit)
    todo = [c for c in cells if cfg.cell_id(c) not in done]
    skipped = [cfg.cell_id(c) for c in cells if cfg.cell_id(c) in done]
    tapes = cfg.out / "cache"
    groups: dict[str, list[Cell]] = {}
    for c in todo:
        groups.setdefault(cfg.cache_key(c) if use_cache else cfg.cell_id(c), []).append(c)
    first: list[tuple[Cell, str, str | None]] = []
    waiting: dict[str, list[Cell]] = {}
    for key, members in groups.items():
        tape = tapes / f"{key}.pkl"
        if use_cache and len(members) > 1 or (use_cache and tape.exists()):
            tapes.mkdir(exist_ok=True)
            if tape.exists():
                first.extend((c, "replay", str(tape)) for c in members)
                continue
            # record with a non-DP cell when there is one (its run is needed anyway)
            members = sorted(members, key=lambda c: c.layer in DP_LAYERS)
            first.append((members[0], "record", str(tape)))
            waiting[str(tape)] = members[1:]
        else:
            first.extend((c, "off", None) for c in members)
    from secagg.federation import _progress_wanted

    bar = None
    if (progress if progress is not None else _progress_wanted()) and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="sweep", unit="cell", file=sys.stderr)
    new: list[dict[str, Any]] = []
    has_csv_header = True

    def finish(row: dict[str, Any], tape: str | None) -> list[tuple[Cell, str, str | None]]:
        _append(jsonl, json.dumps(row, default=float) + "\n")
        if row.get("status") == "ok":
            _append(csv_path, _csv_line(row, not has_csv_header))
        new.append(row)
        if bar is not None:
            bar.set_postfix(acc=f"{row.get('accuracy', float('nan')):.3f}")
            bar.update(1)
        if tape is None or tape not in waiting:
            return []
        rest = waiting.pop(tape)
        how = "replay" if Path(tape).exists() else "off"
        return [(c, how, tape if how == "replay" else None) for c in rest]

    try:
        if n_workers == 0:
            queue = list(first)
            while queue:
                c, how, tape = queue.pop(0)
                queue.extend(finish(_task(cfg, c, how, tape), tape if how == "record"
                                    else None))
        else:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            pool = ProcessPoolExecutor(n_workers, mp_context=ctx)
            try:
                running: dict[Future[dict[str, Any]], str | None] = {
                    pool.submit(_task, cfg, c, how, tape): (tape if how == "record" else None)
                    for c, how, tape in first}
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        tape = running.pop(fut)
                        for c, how, t in finish(fut.result(), tape):
                            running[pool.submit(_task, cfg, c, how, t)] = None
            except BaseException:
                _stop(pool)  # interrupted: the finished cells are on disk, the rest is dropped
                raise
            pool.shutdown()
    finally:
        if bar is not None:
            bar.close()
    rows = old + [r for r in new if r.get("status") == "ok"]
    result = SweepResult(rows, jsonl, csv_path, [r["id"] for r in new], skipped)
    if cfg.plot and rows:
        from secagg.plots import plot_results

        result.plots = plot_results(rows, cfg.out)
    return result
