"""Running one cell of a sweep: its data partition, its layers (from the layer registry),
its algorithm, and the results row (:func:`run_cell`)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from secagg.algorithm_registry import load_algorithm
from secagg.errors import ConfigurationError, SecaggError
from secagg.layers.base import Layer
from secagg.layers.registry import LayerOptions, get_layer, make_layer
from secagg.safestore import StoreError
from secagg.sweep.cache import (
    _CacheMiss,
    _Staged,
    _Tape,
    _TapedAlgorithm,
    load_tape,
    save_tape,
)
from secagg.sweep.config import Cell, SweepConfig
from secagg.sweep.report import CLIENT_OBSERVERS, client_spread

# -- running one cell -------------------------------------------------------------------

_DATA: dict[str, Any] = {}


def _partition(data: Mapping[str, Any], seed: int) -> Any:
    """The cell's partition (the loaded data set is kept per process)."""
    from secagg.data import load_dataset, make_split

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
    return make_split(ds, data.get("split", "dirichlet"), data["clients"],
                      alpha=data.get("alpha", 0.5),
                      shards_per_client=data.get("shards_per_client", 2), seed=seed,
                      local_test_fraction=ltf)


def _layers(cfg: SweepConfig, cell: Cell) -> tuple[Layer | None, Layer]:
    """(the DP layer or None, the inner layer) of a cell, built through the layer registry;
    the DP layer wraps that same inner layer."""
    th = cfg.threshold
    threshold: float | int = int(th) if th >= 1 and float(th).is_integer() else th
    dp_kwargs: dict[str, Any] = {}
    if cfg.adjacency is not None:
        dp_kwargs["adjacency"] = cfg.adjacency
    if cfg.noise_seed is not None:
        dp_kwargs["seed"] = cfg.noise_seed
    options = LayerOptions(threshold=threshold, epsilon=cell.epsilon, delta=cell.delta,
                           dp=dp_kwargs)
    entry = get_layer(cell.layer)
    inner = make_layer(entry.inner or cell.layer, options)
    if not entry.dp:
        return None, inner
    return make_layer(cell.layer, options, inner=inner), inner


def _algorithm(cfg: SweepConfig, cell: Cell) -> Any:
    """A fresh instance of the cell's algorithm, with the config's arguments, its clip and
    (under a DP layer) the algorithm's DP defaults (:meth:`SweepConfig.algorithm_kwargs`)."""
    return load_algorithm(cell.algorithm)(**cfg.algorithm_kwargs(cell))


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

    built: list[Layer | None] = []  # the DP layer of the run that gave the result

    def once(how: str) -> Any:
        dp, inner = _layers(cfg, cell)
        built.append(dp)
        algo = _algorithm(cfg, cell)
        tape = None
        if how == "replay":  # the safe format: arrays and JSON, digests checked
            try:
                tape = load_tape(tape_path)  # type: ignore[arg-type]
            except StoreError as exc:
                raise _CacheMiss(str(exc)) from None
        elif how == "record":
            tape = _Tape()
        run_algo = algo if tape is None else _TapedAlgorithm(
            algo, tape, how == "replay", select, cfg.rounds)
        layer = _Staged(dp, inner, select, algo, cfg.rounds, tape, how == "replay")
        # a sweep keeps no transcript: its cells are not attested (a replay would copy
        # the recording's statements, signed for another run); the sweep spreads its cells
        # over the cores, so each cell's clients run in its own process (workers=1)
        res = Federation(run_algo, layer, part, rounds=cfg.rounds, fraction=cfg.fraction,
                         dropout=cell.dropout, seed=cell.seed, progress=False,
                         attest=False, workers=1).run()
        if how == "record" and tape is not None and tape.states is not None:
            try:
                save_tape(tape, tape_path)  # type: ignore[arg-type]
            except StoreError:
                pass  # a state the safe format does not hold: this group is not cached
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
    # per-client epsilons, where the run reports them (result.json's privacy.clients)
    row.update(client_spread(res.to_dict(prof).get("privacy"),
                             unprotected=_unprotected_observers(built[-1], row["private"])))
    return row


def _unprotected_observers(dp: Layer | None, private: bool | None) -> tuple[str, ...]:
    """The observers a cell gives no guarantee against, whatever a per-client figure
    says: every one when the run's ledger says the run is not private (a release without
    noise, a noise seed fixed by the user), and the server under central DP, which adds
    the noise after seeing the un-noised sums. (The engine sees the sweep's routing
    layer, not the DP layer itself, so the sweep states this from the layer it built.)"""
    if private is False:
        return CLIENT_OBSERVERS
    return ("server",) if dp is not None and dp.aggregator_noises else ()


def cell_task(cfg: SweepConfig, cell: Cell, mode: str, tape: str | None) -> dict[str, Any]:
    """One cell as a worker (a process or a Ray task) runs it: torch on one thread, a
    secagg error returned as an error row (never lost)."""
    try:
        import torch

        torch.set_num_threads(1)
        return run_cell(cfg, cell, mode, tape)
    except SecaggError as exc:
        return {"id": cfg.cell_id(cell), **dataclasses.asdict(cell), "status": "error",
                "error": f"{type(exc).__name__}: {exc}", "cache": mode}
