"""Sweeps: config validation, resume, the statistics cache, the CLI."""

from __future__ import annotations

import json

import pytest

from secagg import safestore
from secagg.cli import main
from secagg.errors import ConfigurationError
from secagg.sweep import load_config, run_cell, sweep


def _cfg(**over):
    """A tiny grid on digits: FedLog, 4 clients, seeded (not private) noise, in-process."""
    cfg = {
        "sweep": {"rounds": 1, "workers": 0, "noise_seed": 3, "plot": False},
        "data": {"dataset": "digits", "clients": 4, "alpha": 0.5},
        "grid": {"algorithms": ["fedlog"], "layers": ["plaintext", "central-dp"],
                 "epsilon": [1.0, 4.0]},
        "algorithm": {"fedlog": {"local_epochs": 1}},
    }
    for table, values in over.items():
        cfg[table] = {**cfg.get(table, {}), **values}
        cfg[table] = {k: v for k, v in cfg[table].items() if v is not None}  # None: drop
    return cfg


# -- config validation -----------------------------------------------------------------


@pytest.mark.parametrize("table, values, key", [
    ("sweep", {"roundz": 2}, "sweep.roundz"),                       # unknown key
    ("sweep", {"rounds": "2"}, "sweep.rounds"),                     # wrong type
    ("sweep", {"cache": 1}, "sweep.cache"),                         # int is not a bool
    ("grid", {"epsilon": []}, "grid.epsilon"),                      # empty grid axis
    ("grid", {"epsilon": [1.0, -2.0]}, "grid.epsilon[1]"),          # bad epsilon
    ("grid", {"epsilon": [1.0, "two"]}, "grid.epsilon[1]"),
    ("grid", {"delta": [1.5]}, "grid.delta[0]"),
    ("grid", {"layers": ["plaintext", "dp"]}, "grid.layers[1]"),
    ("grid", {"dropout": [1.0]}, "grid.dropout[0]"),
    ("grid", {"algorithms": ["no-such-algorithm"]}, "grid.algorithms[0]"),
    ("grid", {"clip": [2.0], "algorithms": ["spherefed"]}, "grid.clip"),
    ("sweep", {"dp_rounds": "first"}, "sweep.dp_rounds"),
    ("data", {"clients": 0}, "data.clients"),
    ("data", {"local_test_fraction": 1.0}, "data.local_test_fraction"),
    ("data", {"local_test_fraction": 0.0}, "data.local_test_fraction"),  # fedlog: personal
    ("algorithm", {"fedlog": {"no_such_arg": 1}}, "algorithm.fedlog.no_such_arg"),
])
def test_config_errors_are_typed_and_name_the_key(table, values, key):
    with pytest.raises(ConfigurationError) as exc:
        load_config(_cfg(**{table: values}))
    assert f"{key}:" in str(exc.value)


def test_config_unknown_table_and_missing_epsilon():
    with pytest.raises(ConfigurationError, match="griid"):
        load_config({**_cfg(), "griid": {}})
    cfg = _cfg()
    del cfg["grid"]["epsilon"]
    with pytest.raises(ConfigurationError, match="grid.epsilon"):
        load_config(cfg)


def test_config_from_toml_and_bad_toml(tmp_path):
    good = tmp_path / "s.toml"
    good.write_text('[grid]\nalgorithms = ["fedlog"]\nlayers = ["plaintext", "local-dp"]\n'
                    'epsilon = [0.5, 2]\nseeds = [0, 1]\n')
    cfg = load_config(good)
    # plaintext once per seed, local-dp per (epsilon, seed)
    assert len(cfg.cells()) == 2 + 4
    assert cfg.out.name == "sweep-s"
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid\nalgorithms = 1\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_config(bad)


def test_cell_ids_are_stable_and_distinct():
    a, b = load_config(_cfg()), load_config(_cfg())
    ids = [a.cell_id(c) for c in a.cells()]
    assert ids == [b.cell_id(c) for c in b.cells()]
    assert len(set(ids)) == len(ids) == 3
    other = load_config(_cfg(data={"clients": 5}))
    assert not set(ids) & {other.cell_id(c) for c in other.cells()}


def test_a_cells_id_depends_on_its_own_algorithms_arguments_only():
    """Adding an algorithm (with arguments) to a sweep must not re-run the others' cells."""
    base = load_config(_cfg())
    more = load_config(_cfg(grid={"algorithms": ["fedlog", "spherefed"]},
                            algorithm={"spherefed": {"feature_dim": 16}}))
    fedlog_ids = {more.cell_id(c) for c in more.cells() if c.algorithm == "fedlog"}
    assert fedlog_ids == {base.cell_id(c) for c in base.cells()}
    assert {more.cache_key(c) for c in more.cells() if c.algorithm == "fedlog"} == {
        base.cache_key(c) for c in base.cells()}
    changed = load_config(_cfg(algorithm={"fedlog": {"local_epochs": 2}}))
    assert not fedlog_ids & {changed.cell_id(c) for c in changed.cells()}


# -- resume ----------------------------------------------------------------------------


def test_resume_skips_finished_cells_and_results_equal(tmp_path):
    cfg = load_config(_cfg())
    cells = cfg.cells()
    part = sweep(cfg, out=tmp_path / "a", limit=cells[:2], progress=False)
    assert sorted(part.ran) == sorted(cfg.cell_id(c) for c in cells[:2])
    before = {r["id"]: r for r in part.rows}
    full = sweep(cfg, out=tmp_path / "a", progress=False)
    assert full.ran == [cfg.cell_id(cells[2])]          # only the missing cell ran
    assert sorted(full.skipped) == sorted(before)
    lines = (tmp_path / "a" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3                               # nothing appended twice
    again = sweep(cfg, out=tmp_path / "a", progress=False)
    assert again.ran == [] and len(again.rows) == 3
    # the same grid in one go gives the same results (seeded noise)
    fresh = sweep(cfg, out=tmp_path / "b", progress=False)
    acc = {r["id"]: r["accuracy"] for r in fresh.rows}
    assert acc == {r["id"]: r["accuracy"] for r in full.rows}
    csv_lines = (tmp_path / "a" / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("id,algorithm,layer") and len(csv_lines) == 4


def test_a_folder_holding_another_grid_is_refused_naming_the_difference(tmp_path):
    """Issue 38: a sweep rerun into its folder with a changed TOML mixed both grids in one
    results.jsonl (and a plot's "mean over 2 seeds" took a one-seed cell); now it is
    refused naming what differs, and --force keeps only the new grid's finished cells."""

    first = load_config(_cfg(grid={"layers": ["plaintext"], "epsilon": None}))
    sweep(first, out=tmp_path / "s", progress=False)
    changed = load_config(_cfg(grid={"layers": ["plaintext"], "epsilon": None}, sweep={"rounds": 2}))
    with pytest.raises(ConfigurationError, match="differs in rounds"):
        sweep(changed, out=tmp_path / "s", progress=False)
    rows = (tmp_path / "s" / "results.jsonl").read_text().splitlines()
    assert len(rows) == 1                                   # nothing ran, nothing mixed
    forced = sweep(changed, out=tmp_path / "s", progress=False, force=True)
    ids = {changed.cell_id(c) for c in changed.cells()}
    assert {r["id"] for r in forced.rows} == ids
    kept = [json.loads(x)["id"] for x in
            (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    assert set(kept) == ids and len(kept) == len(ids)        # the old grid's row is gone
    # a folder of results without a recorded configuration (an older secagg) is checked
    # by its cells
    (tmp_path / "s" / "grid.json").unlink()
    with pytest.raises(ConfigurationError, match="cell\\(s\\) outside this grid"):
        sweep(first, out=tmp_path / "s", progress=False)


def test_interrupted_line_is_rerun(tmp_path):
    cfg = load_config(_cfg(grid={"layers": ["plaintext"], "epsilon": None}))
    sweep(cfg, out=tmp_path, progress=False)
    path = tmp_path / "results.jsonl"
    row = json.loads(path.read_text())
    path.write_text(path.read_text()[:40])               # the write was cut mid-line
    res = sweep(cfg, out=tmp_path, progress=False)
    assert res.ran == [row["id"]]
    assert res.rows[0]["accuracy"] == row["accuracy"]


# -- the statistics cache --------------------------------------------------------------


def _same(a, b):
    for k in ("accuracy", "history", "epsilon_spent", "uplink_bytes", "downlink_bytes",
              "private", "rounds"):
        assert a[k] == b[k], k


@pytest.mark.parametrize("layer", ["central-dp", "distributed-dp", "local-dp"])
def test_cached_cell_equals_uncached_cell(tmp_path, layer):
    """FedLog, 2 rounds, DP on the last round's head: the statistics of the last round do
    not depend on noise, so the cell replays them; with the same noise seed the result is
    identical to running the cell for real."""
    cfg = load_config(_cfg(sweep={"rounds": 2, "dp_rounds": "last"},
                           grid={"layers": ["plaintext", "secure-sum", layer],
                                 "epsilon": [1.0]}))
    cells = {c.layer: c for c in cfg.cells()}
    recorder = cells["secure-sum" if layer == "distributed-dp" else "plaintext"]
    tape = tmp_path / "tape"
    rec = run_cell(cfg, recorder, "record", tape)
    assert rec["cache"] == "record" and safestore.exists(tape)
    _same(rec, run_cell(cfg, recorder, "off"))  # recording changes nothing
    cached = run_cell(cfg, cells[layer], "replay", tape)
    plain = run_cell(cfg, cells[layer], "off")
    assert cached["cache"] == "hit" and plain["cache"] == "off"
    _same(cached, plain)
    assert cached["private"] is False  # seeded noise and an un-noised first round


def test_cache_misses_when_uploads_depend_on_noise(tmp_path):
    """DP in every round: round 1's statistics follow the noised head of round 0, so the
    replay must notice the different broadcast and run the cell for real."""
    cfg = load_config(_cfg(sweep={"rounds": 2}, grid={"epsilon": [1.0]}))
    plain_cell, dp_cell = cfg.cells()
    run_cell(cfg, plain_cell, "record", tmp_path / "t.pkl")
    cached = run_cell(cfg, dp_cell, "replay", tmp_path / "t.pkl")
    assert cached["cache"] == "miss"
    _same(cached, run_cell(cfg, dp_cell, "off"))


def test_one_release_fedlog_whole_run_and_cache_falls_back(tmp_path):
    """FedLog with one release and two local rounds: the DP layer plans one release (local
    phases release nothing), so the cell's epsilon is the whole run's; its personalisation
    follows the noised head, so a replay must fall back to a real run (equal to it)."""
    cfg = load_config(_cfg(sweep={"rounds": 3},
                           grid={"epsilon": [1.0]},
                           algorithm={"fedlog": {"local_epochs": 1, "release_rounds": 1}}))
    plain_cell, dp_cell = cfg.cells()
    run_cell(cfg, plain_cell, "record", tmp_path / "t.pkl")
    cached = run_cell(cfg, dp_cell, "replay", tmp_path / "t.pkl")
    assert cached["cache"] == "miss"
    plain = run_cell(cfg, dp_cell, "off")
    _same(cached, plain)
    assert plain["epsilon_spent"] == pytest.approx(1.0, abs=1e-3)
    assert plain["uplink_bytes"] == run_cell(cfg, plain_cell, "off")["uplink_bytes"]


@pytest.mark.parametrize("layer", ["central-dp", "distributed-dp", "local-dp"])
def test_a_fully_noised_dp_cell_is_private(layer):
    """Every release through the DP layer, noise from the OS: the row says private, with no
    reason against it (the staged layer used to report every field as un-noised)."""
    cfg = load_config(_cfg(sweep={"noise_seed": None},
                           grid={"layers": [layer], "epsilon": [2.0]}))
    row = run_cell(cfg, cfg.cells()[0])
    assert row["not_private_reasons"] == [] and row["private"] is True
    assert row["epsilon_spent"] <= 2.0 + 1e-9


def test_sweep_reports_cache_use_and_unnoised_rounds(tmp_path):
    cfg = load_config(_cfg(sweep={"rounds": 2, "dp_rounds": "last", "noise_seed": None},
                           grid={"epsilon": [1.0, 4.0]}))
    assert cfg.noise_seed is None
    res = sweep(cfg, out=tmp_path, progress=False)
    by = sorted((r["layer"], r["cache"]) for r in res.rows)
    assert by == [("central-dp", "hit"), ("central-dp", "hit"), ("plaintext", "record")]
    for r in res.rows:
        if r["layer"] == "central-dp":
            assert r["private"] is False
            assert any("without DP noise" in why for why in r["not_private_reasons"])


def test_spherefed_ffc_is_cached(tmp_path):
    cfg = load_config(_cfg(
        sweep={"dp_phases": ["ffc"]},
        grid={"algorithms": ["spherefed"], "layers": ["plaintext", "central-dp"],
              "epsilon": [2.0]},
        algorithm={"spherefed": {"local_epochs": 1, "feature_dim": 16}, "fedlog": None}))
    plain_cell, dp_cell = cfg.cells()
    run_cell(cfg, plain_cell, "record", tmp_path / "t.pkl")
    cached = run_cell(cfg, dp_cell, "replay", tmp_path / "t.pkl")
    assert cached["cache"] == "hit"
    _same(cached, run_cell(cfg, dp_cell, "off"))


# -- worker processes and the CLI -------------------------------------------------------


def test_sweep_in_worker_processes(tmp_path):
    cfg = load_config(_cfg(grid={"epsilon": [1.0]}))
    res = sweep(cfg, out=tmp_path, workers=1, progress=False)
    inproc = sweep(cfg, out=tmp_path / "in", workers=0, progress=False)
    assert {r["id"]: r["accuracy"] for r in res.rows} == {
        r["id"]: r["accuracy"] for r in inproc.rows}


def test_cli_sweep_and_plot(tmp_path, capsys):
    toml = tmp_path / "s.toml"
    toml.write_text('[sweep]\nrounds = 1\nworkers = 0\n[data]\nclients = 4\n'
                    '[grid]\nalgorithms = ["fedlog"]\nlayers = ["plaintext", "local-dp"]\n'
                    'epsilon = [2.0]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(toml), "--out", str(out), "--quiet"]) == 0
    assert "2 cell(s) run" in capsys.readouterr().out
    assert (out / "privacy_utility.svg").exists()
    (out / "privacy_utility.svg").unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "privacy_utility.svg").exists()
    # two sweeps drawn together: each algorithm gets its series
    other = tmp_path / "other"
    other.mkdir()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    (other / "results.jsonl").write_text("".join(
        json.dumps({**r, "algorithm": "renamed"}) + "\n" for r in rows))
    both = tmp_path / "both"
    assert main(["plot", str(out), str(other), "--out", str(both)]) == 0
    svg = (both / "privacy_utility.svg").read_text()
    assert "series-fedlog-local-dp" in svg and "series-renamed-local-dp" in svg
    toml.write_text('[grid]\nalgorithms = ["fedlog"]\nlayers = ["local-dp"]\nepsilon = [0]\n')
    assert main(["sweep", str(toml), "--out", str(out)]) == 1
    assert "grid.epsilon[0]" in capsys.readouterr().err


def test_clip_axis_sets_the_algorithms_bound():
    from secagg.sweep import _algorithm

    cfg = load_config(_cfg(grid={"clip": [0.5, 2.0], "layers": ["plaintext"],
                                 "epsilon": None}))
    cells = cfg.cells()
    assert [c.clip for c in cells] == [0.5, 2.0]
    assert [_algorithm(cfg, c).feature_bound for c in cells] == [0.5, 2.0]
    assert cfg.cell_id(cells[0]) != cfg.cell_id(cells[1])


def _stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    import os

    out = set()
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry))
    return out


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs /proc")
def test_sigterm_stops_the_workers_and_exits_130(tmp_path):
    """A killed sweep must not leave its worker processes running its cells."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tmp_path / "slow.toml"
    cfg.write_text('[sweep]\nrounds = 500\nworkers = 2\nplot = false\n'
                   '[data]\ndataset = "digits"\nclients = 4\n'
                   '[grid]\nalgorithms = ["fedlog"]\nlayers = ["plaintext", "secure-sum"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "secagg.cli", "sweep", str(cfg), "--out",
                             str(tmp_path / "out"), "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    kids: set[int] = set()
    while time.monotonic() < deadline and len(kids) < 2:
        time.sleep(0.5)
        kids = _children(proc.pid) - {proc.pid}
        assert proc.poll() is None, proc.communicate()
    assert len(kids) >= 2, "the workers did not start"
    time.sleep(3)  # let them pick up the cells
    os.kill(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the sweep did not stop within 30 s of SIGTERM") from None
    assert proc.returncode == 130 and "interrupted" in err
    time.sleep(1)
    left = [pid for pid in kids if _running(pid)]
    for pid in left:  # do not leave a failing run's workers behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker(s) {left} still running after the sweep exited"



def test_no_local_test_split_trains_on_every_record():
    """A global-test algorithm may use every record (local_test_fraction = 0)."""
    from secagg.sweep import _partition

    cfg = load_config(_cfg(grid={"algorithms": ["spherefed"], "layers": ["plaintext"],
                                 "epsilon": None},
                           data={"local_test_fraction": 0.0}, algorithm={"fedlog": None}))
    part = _partition(cfg.data, 0)
    assert sum(len(c.y) for c in part) == len(part.dataset.y_train)
    assert all(c.y_test is None or len(c.y_test) == 0 for c in part)


# -- the cache cannot run code, is private to its owner, and can be deleted ------------------


class _Planted:
    """A pickle that, when loaded, writes a marker file (stands for arbitrary code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return (Path.write_text, (Path(self.marker), "code ran"))


def _cache_sweep(**over):
    return load_config(_cfg(sweep={"rounds": 2, "dp_rounds": "last", "noise_seed": 3,
                                   "workers": 0, "plot": False, **over},
                            grid={"epsilon": [1.0, 4.0]}))


def test_a_planted_pickle_in_the_cache_folder_is_never_loaded(tmp_path):
    import pickle

    cfg = _cache_sweep()
    out = tmp_path / "sweep"
    marker = tmp_path / "marker"
    key = cfg.cache_key(cfg.cells()[0])
    cache = out / "cache"
    cache.mkdir(parents=True)
    payload = pickle.dumps(_Planted(marker))
    for name in (f"{key}.pkl", f"{key}.npz", f"{key}.json", key):
        (cache / name).write_bytes(payload)
    res = sweep(cfg, out=out, progress=False)
    assert not marker.exists()  # the old cache ran pickle.load on <key>.pkl
    assert [r["status"] for r in res.rows] == ["ok"] * 3
    # the planted files do not check: every cell ran for real rather than replay them
    assert {r["cache"] for r in res.rows} <= {"miss", "record", "off"}


def test_cache_files_are_private_digest_checked_and_hold_no_pickle(tmp_path):
    cfg = _cache_sweep()
    res = sweep(cfg, out=tmp_path, progress=False)
    assert sorted(r["cache"] for r in res.rows) == ["hit", "hit", "record"]
    cache = tmp_path / "cache"
    assert cache.stat().st_mode & 0o777 == 0o700
    files = sorted(cache.iterdir())
    assert {f.suffix for f in files} == {".npz", ".json"}
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    npz = next(f for f in files if f.suffix == ".npz")
    import numpy as np

    with np.load(npz, allow_pickle=False) as z:  # plain arrays only
        assert all(z[k].dtype != object for k in z.files)
    # one flipped byte in the arrays: the digest refuses it, the cell runs for real
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    npz.write_bytes(bytes(raw))
    with pytest.raises(safestore.StoreError, match="digest"):
        safestore.load(npz.with_suffix(""))
    cell = next(c for c in cfg.cells() if c.layer == "central-dp")
    assert run_cell(cfg, cell, "replay", npz.with_suffix(""))["cache"] == "miss"


def test_keep_cache_false_deletes_the_cache_when_the_sweep_ends(tmp_path):
    res = sweep(_cache_sweep(keep_cache=False), out=tmp_path, progress=False)
    assert sorted(r["cache"] for r in res.rows) == ["hit", "hit", "record"]
    assert not (tmp_path / "cache").exists()
    kept = sweep(_cache_sweep(), out=tmp_path / "kept", progress=False, keep_cache=False)
    assert kept.rows and not (tmp_path / "kept" / "cache").exists()


def test_cli_no_keep_cache_deletes_the_cache(tmp_path, capsys):
    toml = tmp_path / "s.toml"
    toml.write_text('[sweep]\nrounds = 2\ndp_rounds = "last"\nworkers = 0\nnoise_seed = 3\n'
                    'plot = false\n[data]\nclients = 4\n[algorithm.fedlog]\nlocal_epochs = 1\n'
                    '[grid]\nalgorithms = ["fedlog"]\nlayers = ["plaintext", "central-dp"]\n'
                    'epsilon = [1.0, 4.0]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(toml), "--out", str(out), "--quiet", "--no-keep-cache"]) == 0
    assert "3 cell(s) run" in capsys.readouterr().out
    assert not (out / "cache").exists()
    rows = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["cache"] for r in rows) == ["hit", "hit", "record"]
