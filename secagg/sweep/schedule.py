"""Scheduling a sweep: which cells are still to run, which record or replay the statistics
cache, and the worker pool that runs them (:func:`sweep`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from secagg import safestore
from secagg.cores import available_cores
from secagg.sweep.cells import cell_task
from secagg.sweep.config import DP_LAYERS, Cell, SweepConfig, load_config
from secagg.sweep.report import SweepResult, _append, _csv_line, _read_jsonl


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


#: the sweep's configuration as it decides results, kept in its output folder
STAMP = "grid.json"
#: SweepConfig fields that change how a sweep runs, not what its cells give
_HOW = ("out", "workers", "cache", "keep_cache", "plot")


def grid_fingerprint(cfg: SweepConfig) -> dict[str, Any]:
    """What of ``cfg`` decides the rows of its results (the settings and the grid; not the
    output folder, workers, cache or plots), as JSON values."""
    import dataclasses

    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _HOW}
    return json.loads(json.dumps(d, sort_keys=True, default=list))


def _check_folder(cfg: SweepConfig, old: list[dict[str, Any]], force: bool
                  ) -> list[dict[str, Any]]:
    """Refuse to mix two grids in one folder: a folder whose recorded configuration
    (:data:`STAMP`) differs from ``cfg``, or whose results hold cells outside ``cfg``'s
    grid, is refused naming the difference, unless ``force``; with ``force`` the rows
    outside the grid are dropped (results.jsonl/.csv are rewritten with the grid's rows).
    Returns the finished rows that belong to the grid."""
    from secagg.errors import ConfigurationError

    mine = grid_fingerprint(cfg)
    stamp = cfg.out / STAMP
    ids = {cfg.cell_id(c) for c in cfg.cells()}
    outside = [r for r in old if r.get("id") not in ids]
    diff: list[str] = []
    if stamp.exists():
        try:
            before = json.loads(stamp.read_text())
        except ValueError:
            before = {}
        diff = sorted(k for k in set(mine) | set(before) if mine.get(k) != before.get(k))
    if (diff or outside) and not force:
        what = (f"its recorded configuration differs in {', '.join(diff)}" if diff else
                f"its results hold {len(outside)} cell(s) outside this grid")
        raise ConfigurationError(
            f"{cfg.out} holds another sweep ({what}): rerunning into it would mix two grids "
            "in one set of results and plots; give a new --out, or --force to keep only "
            "this grid's finished cells there")
    stamp.write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
    return [r for r in old if r.get("id") in ids]


def sweep(config: SweepConfig | str | os.PathLike[str] | Mapping[str, Any], *,
          out: str | os.PathLike[str] | None = None, workers: int | None = None,
          cache: bool | None = None, progress: bool | None = None,
          limit: Sequence[Cell] | None = None, keep_cache: bool | None = None,
          ray: str | None = None, force: bool = False) -> SweepResult:
    """Run (or resume) a sweep; return every finished row.

    Args:
        config: a :class:`SweepConfig`, a TOML path or a parsed mapping.
        out: output directory (overrides ``sweep.out``).
        workers: worker processes (overrides ``sweep.workers``; 0 runs in-process).
        cache: use the statistics cache (overrides ``sweep.cache``).
        progress: progress bar over cells (default: on a terminal, not in CI).
        limit: run only these cells of the grid (the rest stay pending).
        keep_cache: keep the statistics cache (``<out>/cache``: the clients' raw,
            un-noised statistics) after the sweep (overrides ``sweep.keep_cache``); False
            deletes it when the sweep ends, finished or not.
        ray: run the cells as Ray tasks (:mod:`secagg.sweep.ray_cluster`): ``""`` on a
            local Ray instance, ``"HOST:PORT"`` (or ``"auto"``) on that cluster; ``workers``
            is then ignored (the cluster's CPUs decide). None (default): processes here.
        force: reuse a folder that holds another sweep's configuration or cells, keeping
            only this grid's finished cells (else that is refused, naming the difference).

    Raises:
        ConfigurationError: the output folder holds another sweep (without ``force``).
    """
    cfg = config if isinstance(config, SweepConfig) else load_config(config, out)
    if out is not None:
        cfg.out = Path(out)
    use_cache = cfg.cache if cache is None else cache
    n_workers = cfg.workers if workers is None else workers
    if n_workers is None:
        n_workers = available_cores()
    cfg.out.mkdir(parents=True, exist_ok=True)
    jsonl, csv_path = cfg.out / "results.jsonl", cfg.out / "results.csv"
    old = _check_folder(cfg, [r for r in _read_jsonl(jsonl) if r.get("status") == "ok"],
                        force)
    if force:  # the rows outside the grid leave the results too
        jsonl.write_text("".join(json.dumps(r, default=float) + "\n" for r in old))
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
        tape = tapes / key  # <key>.npz + <key>.json (secagg.safestore), never a pickle
        if use_cache and len(members) > 1 or (use_cache and safestore.exists(tape)):
            tapes.mkdir(mode=0o700, exist_ok=True)
            if safestore.exists(tape):
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
        how = "replay" if safestore.exists(tape) else "off"
        return [(c, how, tape if how == "replay" else None) for c in rest]

    try:
        if ray is not None:
            if first:  # nothing to run: no Ray to start (or to need)
                from secagg.sweep.ray_cluster import run_on_ray

                run_on_ray(cfg, first, finish, ray)
        elif n_workers == 0:
            queue = list(first)
            while queue:
                c, how, tape = queue.pop(0)
                queue.extend(finish(cell_task(cfg, c, how, tape), tape if how == "record"
                                    else None))
        else:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            pool = ProcessPoolExecutor(n_workers, mp_context=ctx)
            try:
                running: dict[Future[dict[str, Any]], str | None] = {
                    pool.submit(cell_task, cfg, c, how, tape): (tape if how == "record" else None)
                    for c, how, tape in first}
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        tape = running.pop(fut)
                        for c, how, t in finish(fut.result(), tape):
                            running[pool.submit(cell_task, cfg, c, how, t)] = None
            except BaseException:
                _stop(pool)  # interrupted: the finished cells are on disk, the rest is dropped
                raise
            pool.shutdown()
    finally:
        if bar is not None:
            bar.close()
        if not (cfg.keep_cache if keep_cache is None else keep_cache) and tapes.exists():
            shutil.rmtree(tapes)  # the raw client statistics do not outlive the sweep
    rows = old + [r for r in new if r.get("status") == "ok"]
    result = SweepResult(rows, jsonl, csv_path, [r["id"] for r in new], skipped)
    if cfg.plot and rows:
        from secagg.plots import plot_results
        from secagg.report import write_sweep_report

        svgs: dict[str, str] = {}
        result.plots = plot_results(rows, cfg.out, inline=svgs)
        _write_info(cfg, config)
        result.report = write_sweep_report(cfg.out, rows, svgs)
    return result


def _write_info(cfg: SweepConfig, config: Any) -> None:
    """``sweep.json`` beside the results: the command that resumes the sweep (when it was
    read from a file) and its configuration, for the report (:mod:`secagg.report`)."""
    import dataclasses

    command = None
    if isinstance(config, (str, os.PathLike)):
        command = ["secagg", "sweep", str(config)]
        if Path(str(config)).stem and cfg.out != Path(f"runs/sweep-{Path(str(config)).stem}"):
            command += ["--out", str(cfg.out)]
    try:
        conf: Any = dataclasses.asdict(cfg)
    except TypeError:
        conf = None
    (cfg.out / "sweep.json").write_text(json.dumps({"command": command, "config": conf},
                                                   indent=2, default=str) + "\n")
