"""Sweep configuration: the TOML keys (:data:`KEYS`), their validation
(:func:`load_config`), and the grid of :class:`Cell` s a :class:`SweepConfig` spans."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from secagg.algorithm_registry import algorithm_arguments, load_algorithm
from secagg.errors import ConfigurationError, SecaggError
from secagg.layers.registry import get_layer, layer_names

#: Layers a sweep may put in ``grid.layers`` (the layer registry's sweepable ones).
DP_LAYERS = layer_names(dp=True, sweepable=True)
PLAIN_LAYERS = layer_names(dp=False, sweepable=True)
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
        "keep_cache": ("bool", "keep the statistics cache (the clients' raw, un-noised "
                       "statistics, in OUT/cache) after the sweep (default true)"),
        "workers": ("int", "worker processes (default: the cores this process may use; "
                    "0 runs in-process)"),
        "device_profile": ("str", "profile for energy/latency estimates (default phone-wifi)"),
        "noise_seed": ("int", "seed the DP noise (reproducible, NOT private; tests only)"),
        "plot": ("bool", "draw the plots beside the results when done (default true)"),
    },
    "data": {
        "dataset": ("str", "digits | fashion-mnist | mnist"),
        "data_dir": ("str", "directory of the IDX .gz files"),
        "clients": ("int", "number of clients"),
        "alpha": ("float", "Dirichlet concentration; 0 means IID"),
        "split": ("str", "dirichlet (default) | iid | shards (McMahan et al.'s label shards)"),
        "shards_per_client": ("int", "label shards per client with split = shards (default 2)"),
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
    keep_cache: bool = True
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

    def algorithm_kwargs(self, cell: Cell) -> dict[str, Any]:
        """The cell's algorithm constructor arguments: the config's, the cell's clip, and,
        under a DP layer, the algorithm's DP defaults for the arguments the config leaves
        out (:func:`~secagg.algorithm_registry.algorithm_arguments`; none when the sweep
        picks the DP rounds or phases itself)."""
        kwargs = dict(self.algorithm_args.get(cell.algorithm, {}))
        if cell.clip is not None:
            kwargs[CLIP_ARGUMENT[cell.algorithm]] = cell.clip
        dp = cell.layer in DP_LAYERS and self.dp_phases is None and self.dp_rounds == "all"
        return algorithm_arguments(load_algorithm(cell.algorithm), kwargs,
                                   (self.adjacency or "record") if dp else None)

    def _dp_defaults(self, cell: Cell) -> dict[str, Any]:
        """The arguments :meth:`algorithm_kwargs` adds for DP (hashed into the cell's id and
        cache key: a cell whose algorithm differs never shares a tape or a result)."""
        given = self.algorithm_args.get(cell.algorithm, {})
        return {k: v for k, v in self.algorithm_kwargs(cell).items()
                if k not in given and not (cell.clip is not None
                                           and k == CLIP_ARGUMENT[cell.algorithm])}

    def cell_id(self, cell: Cell) -> str:
        """Stable id: SHA-256 of the cell and the settings, 16 hex digits."""
        extra = self._dp_defaults(cell)
        blob = json.dumps({"cell": dataclasses.asdict(cell), **self._settings_for(cell.algorithm),
                           **({"dp_defaults": extra} if extra else {})},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def cache_key(self, cell: Cell) -> str:
        """Cells with the same key see the same client statistics (all but layer noise)."""
        inner = get_layer(cell.layer).inner or cell.layer
        s = self._settings_for(cell.algorithm)
        s.pop("noise_seed")
        extra = self._dp_defaults(cell)
        blob = json.dumps({"algorithm": cell.algorithm, "clip": cell.clip,
                           "dropout": cell.dropout, "seed": cell.seed, "inner": inner, **s,
                           **({"dp_defaults": extra} if extra else {})},
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
    for i, layer in enumerate(g["layers"]):
        if layer not in PLAIN_LAYERS + DP_LAYERS:
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
    if data.get("split", "dirichlet") not in ("dirichlet", "iid", "shards"):
        raise _err("data.split", f"unknown split {data['split']!r}; known: dirichlet, iid, "
                   "shards")
    if data.get("shards_per_client", 1) < 1:
        raise _err("data.shards_per_client", f"must be >= 1, got {data['shards_per_client']}")
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
        keep_cache=s.get("keep_cache", True),
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
    """The algorithm classes, through the entry-point resolution
    (:func:`secagg.algorithm_registry.load_algorithm`)."""
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
