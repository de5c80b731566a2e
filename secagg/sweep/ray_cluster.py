"""Running a sweep's cells as Ray tasks: on a local Ray instance or on an existing cluster
(``secagg sweep CONFIG --ray [ADDRESS]``, ``sweep(..., ray=ADDRESS)``).

The driver (the process that runs :func:`secagg.sweep.sweep`) keeps everything that makes a
sweep resumable: it decides which cells are still to run, and it appends each finished
cell's row to ``results.jsonl``/``results.csv`` (with fsync) as soon as its task returns.
A task only computes a row; it writes nothing to the output directory. So a worker node
that dies loses at most the cells running on it: Ray resubmits them (``max_retries``), and
a cell still lost after the retries is written as an ``error`` row and named on stderr --
an error row is not a finished cell, so running the sweep again runs it (and only it).

The statistics cache on a cluster. The nodes need not share a file system, so tapes do not
travel as paths: a recording task returns its tape's two files (the
:mod:`secagg.safestore` ``.npz`` + ``.json``, digests inside) with its row, the driver
writes them into ``OUT/cache`` (mode 0600), and a replaying task receives them through
Ray's object store and loads them from a private temporary folder, digests checked as
always. The tapes hold the clients' raw, un-noised statistics: on a cluster they sit in
the nodes' object stores (memory, possibly spilled to the nodes' disks) while the sweep
runs. Run with ``--no-cache`` on a cluster you would not trust with those statistics.

Every node needs the same secagg (and Ray, and Python) as the driver, and the data set:
``digits`` ships with scikit-learn; ``fashion-mnist``/``mnist`` need ``data.data_dir`` at
the same path on every node.

Ray is an optional dependency (``pip install -e ".[ray]"``); it is imported only here and
only when a sweep asks for it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from secagg.errors import ConfigurationError
from secagg.sweep.config import Cell, SweepConfig

#: How often Ray resubmits a cell whose worker or node died (Ray's own default is 3).
MAX_RETRIES = 3

_TAPE_SUFFIXES = (".npz", ".json")

#: What the scheduler hands over: (cell, mode, driver-side tape path or None).
Job = tuple[Cell, str, "str | None"]


def import_ray() -> ModuleType:
    """Import Ray, or raise a :class:`ConfigurationError` that names the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigurationError(
            "secagg sweep --ray needs Ray, which is optional: install it with "
            "`pip install -c constraints.txt -e \".[ray]\"` (or the \"flower\" extra, which "
            f"brings it too) on the driver and on every node ({exc})") from None
    return ray


def _read_tape(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """The two files of a stored tape, as bytes (read on the driver)."""
    base = Path(path)
    return {s: base.with_suffix(s).read_bytes() for s in _TAPE_SUFFIXES}


def _write_tape(path: str | os.PathLike[str], files: dict[str, bytes]) -> None:
    """Write a tape's two files at ``path`` (mode 0600, each replaced atomically; the
    ``.json`` last, so that :func:`secagg.safestore.exists` never sees half a tape)."""
    base = Path(path)
    for s in _TAPE_SUFFIXES:
        target = base.with_suffix(s)
        tmp = target.with_name(target.name + ".part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(files[s])
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, target)


def run_cell_task(cfg: SweepConfig, cell: Cell, mode: str, tape: dict[str, bytes] | None,
                  tape_name: str | None) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """What a Ray task runs: one cell on the worker, its tape (if any) in a private
    temporary folder. Returns the row and, for a recording, the tape's files (None when
    the recording stored no tape)."""
    from secagg import safestore
    from secagg.sweep.cells import cell_task

    with tempfile.TemporaryDirectory(prefix="secagg-sweep-") as tmp:
        path = None if tape_name is None else Path(tmp) / tape_name
        if mode == "replay" and path is not None and tape is not None:
            _write_tape(path, tape)
        row = cell_task(cfg, cell, mode, None if path is None else str(path))
        out = None
        if mode == "record" and path is not None and safestore.exists(path):
            out = _read_tape(path)
    return row, out


def _lost_row(cfg: SweepConfig, cell: Cell, mode: str, exc: BaseException) -> dict[str, Any]:
    import dataclasses

    return {"id": cfg.cell_id(cell), **dataclasses.asdict(cell), "status": "error",
            "error": f"ray: task lost after {MAX_RETRIES} retries: {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0] if str(exc) else ''}", "cache": mode}


def run_on_ray(cfg: SweepConfig, first: Sequence[Job],
               finish: Callable[[dict[str, Any], str | None], list[Job]],
               address: str | None) -> None:
    """Run ``first`` (and the jobs each ``finish`` call hands back) as Ray tasks.

    Args:
        cfg: the sweep.
        first: the jobs that can start now.
        finish: the scheduler's bookkeeping for one returned row (appends it to the
            results files) and the recording's tape path, or None; returns the jobs it
            unblocks (the replays of that recording).
        address: a cluster's address (``HOST:PORT``, ``auto``, ``ray://...``); None or
            ``""`` starts a local Ray instance (or uses the one this process already has).

    Raises:
        ConfigurationError: Ray is not installed.
        ray.exceptions.RayTaskError: a cell raised an error that is not a
            :class:`~secagg.errors.SecaggError` (as the process pool would).
    """
    ray = import_ray()
    from ray.exceptions import RayError, RayTaskError

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": "WARNING"}
        if address:
            kwargs["address"] = address
        else:
            kwargs["include_dashboard"] = False
        ray.init(**kwargs)
        started = True
    remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                        retry_exceptions=False)(run_cell_task)
    blobs: dict[str, Any] = {}  # driver-side tape path -> object ref of its files
    running: dict[Any, Job] = {}

    def submit(job: Job) -> None:
        cell, mode, tape = job
        blob = None
        if mode == "replay" and tape is not None:
            if tape not in blobs:
                blobs[tape] = ray.put(_read_tape(tape))
            blob = blobs[tape]
        name = None if tape is None else Path(tape).name
        running[remote.remote(cfg, cell, mode, blob, name)] = job

    try:
        for job in first:
            submit(job)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                cell, mode, tape = running.pop(ref)
                try:
                    row, files = ray.get(ref)
                except RayTaskError:
                    raise  # the cell's own error: the sweep stops, as with processes
                except RayError as exc:  # worker/node lost, retries spent
                    row, files = _lost_row(cfg, cell, mode, exc), None
                    print(f"secagg sweep: cell {row['id']} {row['error']}; it stays "
                          "pending (rerun the sweep to run it)", file=sys.stderr)
                if mode == "record" and tape is not None and files is not None:
                    _write_tape(tape, files)
                for nxt in finish(row, tape if mode == "record" else None):
                    submit(nxt)
    except BaseException:
        for ref in running:  # interrupted: finished cells are on disk, drop the rest
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 -- best effort, the driver is leaving
                pass
        raise
    finally:
        blobs.clear()
        if started:
            ray.shutdown()
