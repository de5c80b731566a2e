"""Sweeps on a Ray cluster (secagg.sweep.ray_cluster): a head and a worker started as
separate processes on loopback, a worker killed mid-sweep, no finished cell lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from secagg.sweep import load_config, run_cell, sweep
from secagg.sweep.ray_cluster import run_cell_task

ROOT = Path(__file__).resolve().parents[1]

_CONFIG = """
[sweep]
rounds = 2
cache = false
plot = false

[data]
dataset = "digits"
clients = 4
alpha = 0.5

[grid]
algorithms = ["fedlog"]
layers = ["plaintext"]
seeds = [0, 1, 2, 3]

[algorithm.fedlog]
local_epochs = 4
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _kill_group(proc: subprocess.Popen) -> None:
    """End a `ray start --block` we started and every process it started (its session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Cluster:
    """A Ray head (no CPUs: it schedules nothing) and worker nodes, all on 127.0.0.1, each
    `ray start --block` in its own session so that it can be killed with its children."""

    def __init__(self, tmp: Path) -> None:
        # Ray's socket paths must stay under ~107 bytes: a short temp dir, not tmp_path
        self.ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.logs = tmp
        self.env = {**os.environ, "RAY_TMPDIR": self.ray_tmp, "RAY_USAGE_STATS_ENABLED": "0",
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.head = self._start("head", "--head", f"--port={self.port}", "--num-cpus=0",
                                "--include-dashboard=false", f"--temp-dir={self.ray_tmp}",
                                f"--ray-client-server-port={_free_port()}")

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}-{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
             "--node-ip-address=127.0.0.1", "--object-store-memory=80000000",
             "--disable-usage-stats", "--include-log-monitor=false",
             f"--dashboard-agent-listen-port={_free_port()}", *args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def worker(self) -> subprocess.Popen:
        """Start a worker node with one CPU."""
        _wait_port(self.port, 60)
        return self._start("worker", f"--address={self.address}", "--num-cpus=1")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _kill_group(proc)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (the optional ray extra)")
    c = _Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_ray_sweep_survives_a_killed_worker(cluster, tmp_path):
    t0 = time.monotonic()
    config = tmp_path / "s.toml"
    config.write_text(_CONFIG)
    out = tmp_path / "out"
    cells = load_config(config).cells()
    n = len(cells)
    worker = cluster.worker()
    driver = subprocess.Popen(
        [sys.executable, "-m", "secagg.cli", "sweep", str(config), "--out", str(out),
         "--quiet", "--ray", cluster.address],
        env=cluster.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        jsonl = out / "results.jsonl"
        deadline = time.monotonic() + 180
        while not (jsonl.exists() and jsonl.read_text().count("\n") >= 1):
            assert driver.poll() is None, driver.communicate()[0]
            assert time.monotonic() < deadline, "no cell finished in 180 s"
            time.sleep(0.05)
        _kill_group(worker)  # the only node with a CPU dies mid-sweep
        before = jsonl.read_bytes()
        finished = _rows(jsonl)
        assert 1 <= len(finished) < n, "the worker was not killed mid-sweep"
        assert driver.poll() is None  # no node to run on: the driver waits
        cluster.worker()  # a new node joins; Ray resubmits the lost cell there
        output = driver.communicate(timeout=240)[0]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, output
    assert f"{n} cell(s) run, 0 already done" in output, output
    after = jsonl.read_bytes()
    assert after.startswith(before)  # the rows written before the kill are untouched
    rows = _rows(jsonl)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == n  # every cell once: none lost, none run twice
    assert set(ids) == {load_config(config).cell_id(c) for c in cells}
    assert all(r["status"] == "ok" for r in rows)
    assert (out / "results.csv").read_text().count("\n") == n + 1
    # a rerun through the cluster runs nothing (it does not even need a worker)
    again = sweep(config, out=out, ray=cluster.address, progress=False)
    assert again.ran == [] and len(again.skipped) == n
    assert jsonl.read_bytes() == after
    print(f"ray sweep with a killed worker: {time.monotonic() - t0:.1f} s")


def test_task_carries_the_tape_through_bytes(tmp_path):
    """The statistics cache without a shared file system: a recording task returns its tape
    as bytes, a replaying task gets them back, and the replay equals an in-process one."""
    cfg = load_config({
        "sweep": {"rounds": 1, "noise_seed": 3, "plot": False, "out": str(tmp_path / "o")},
        "data": {"dataset": "digits", "clients": 4, "alpha": 0.5},
        "grid": {"algorithms": ["fedlog"], "layers": ["plaintext", "central-dp"],
                 "epsilon": [1.0]},
        "algorithm": {"fedlog": {"local_epochs": 1}},
    })
    plain, dp = sorted(cfg.cells(), key=lambda c: c.layer != "plaintext")
    row, files = run_cell_task(cfg, plain, "record", None, "tape")
    assert row["cache"] == "record" and files is not None and set(files) == {".npz", ".json"}
    replayed, none = run_cell_task(cfg, dp, "replay", files, "tape")
    assert none is None and replayed["cache"] == "hit"
    tape = tmp_path / "local"
    run_cell(cfg, plain, "record", tape)
    local = run_cell(cfg, dp, "replay", tape)
    assert local["cache"] == "hit"
    assert replayed["accuracy"] == local["accuracy"]
    assert replayed["epsilon_spent"] == local["epsilon_spent"]
    # a tampered tape is not loaded: the replay falls back to a real run
    bad = {**files, ".npz": files[".npz"][:-1] + bytes([files[".npz"][-1] ^ 1])}
    fallback, _ = run_cell_task(cfg, dp, "replay", bad, "tape")
    assert fallback["cache"] == "miss"


def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    cfg = {"sweep": {"rounds": 1, "plot": False},
           "data": {"dataset": "digits", "clients": 4, "alpha": 0.5},
           "grid": {"algorithms": ["fedlog"], "layers": ["plaintext"]}}
    from secagg.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r'\.\[ray\]'):
        sweep(cfg, out=tmp_path / "o", ray="", progress=False)
    assert not (tmp_path / "o" / "results.jsonl").exists() or \
        (tmp_path / "o" / "results.jsonl").read_text() == ""
