"""Sweep plots: files written, valid PNG/SVG, one series per layer."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from secagg.errors import DataError
from secagg.plots import load_results, plot_results, series_ids

LAYERS = ("central-dp", "distributed-dp", "local-dp")


def _rows():
    """Synthetic sweep rows: two seeds, three DP layers over three epsilons, one baseline."""
    rows = []
    for seed in (0, 1):
        rows.append({"id": f"p{seed}", "algorithm": "fedlog", "layer": "plaintext",
                     "epsilon": None, "seed": seed, "accuracy": 0.8 + 0.01 * seed,
                     "uplink_bytes": 5000, "energy_j": 1.0, "status": "ok",
                     "device_profile": "phone-wifi"})
        for i, layer in enumerate(LAYERS):
            for eps in (0.5, 1.0, 4.0):
                rows.append({"id": f"{layer}{eps}{seed}", "algorithm": "fedlog",
                             "layer": layer, "epsilon": eps, "seed": seed,
                             "accuracy": 0.7 - 0.1 * i + 0.02 * eps + 0.01 * seed,
                             "uplink_bytes": 5000 + 100 * i, "energy_j": 1.0 + i,
                             "status": "ok", "device_profile": "phone-wifi"})
    return rows


def test_plot_files_are_valid_with_one_series_per_layer(tmp_path):
    rows = _rows()
    paths = plot_results(rows, tmp_path)
    assert set(paths) == {"privacy_utility.png", "privacy_utility.svg",
                          "cost_utility.png", "cost_utility.svg"}
    for name, path in paths.items():
        data = path.read_bytes()
        if name.endswith(".png"):
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
            assert len(data) < 100_000
        else:
            ET.fromstring(data)  # well-formed XML
    svg = ET.fromstring(paths["privacy_utility.svg"].read_bytes())
    ids = {el.get("id") for el in svg.iter() if (el.get("id") or "").startswith("series-")}
    assert ids == set(series_ids(rows)) == {f"series-fedlog-{x}" for x in
                                           ("plaintext",) + LAYERS}
    spreads = {el.get("id") for el in svg.iter() if (el.get("id") or "").startswith("spread-")}
    assert spreads == {f"spread-fedlog-{x}" for x in LAYERS}  # two seeds: a band per layer
    cost = paths["cost_utility.svg"].read_text()
    for layer in ("plaintext",) + LAYERS:
        assert f'id="cost-bytes-{layer}"' in cost and f'id="cost-energy-{layer}"' in cost


def test_load_results_from_jsonl_csv_and_directory(tmp_path):
    rows = _rows()
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"cut mid-li')
    got = load_results(tmp_path)
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    keys = ["id", "algorithm", "layer", "epsilon", "seed", "accuracy", "status"]
    with open(tmp_path / "r.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r[k] is None else r[k] for k in keys})
    from_csv = load_results(tmp_path / "r.csv")
    assert [r["accuracy"] for r in from_csv] == pytest.approx([r["accuracy"] for r in rows])
    assert from_csv[0]["epsilon"] is None and from_csv[1]["epsilon"] == 0.5


def test_nothing_to_plot_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no sweep results"):
        load_results(tmp_path / "missing")
    (tmp_path / "results.jsonl").write_text(json.dumps({"status": "error"}) + "\n")
    with pytest.raises(DataError, match="no finished"):
        load_results(tmp_path)
    with pytest.raises(DataError):
        plot_results([], tmp_path)


def _capture_figures(monkeypatch):
    """The figures plot_results draws (each kept after it is saved)."""
    import secagg.plots as plots

    figs = []
    real = plots._figure

    def capture(w, h):
        fig = real(w, h)
        figs.append(fig)
        return fig

    monkeypatch.setattr(plots, "_figure", capture)
    return figs


def _assert_readable_ticks(fig):
    """On every axis of ``fig`` (x and y, as last drawn): at least one visible tick
    label, no two visible labels overlapping (rendered extents), no two alike, and no
    offset or scale text (``+1.57e5``, ``x10^5``) beside the axis."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis, lo, hi in ((ax.xaxis, "x0", "x1"), (ax.yaxis, "y0", "y1")):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            if not axis.get_ticklocs().size:
                continue  # an axis deliberately left without ticks (nothing to mark)
            texts = [t.get_text() for t in labels]
            where = (ax.get_title(), axis.get_label_text(), texts)
            assert labels, where
            assert len(set(texts)) == len(texts), where
            assert axis.get_offset_text().get_text() == "", where
            boxes = sorted((t.get_window_extent(renderer) for t in labels),
                           key=lambda b: getattr(b, lo))
            for a, b in zip(boxes, boxes[1:]):
                assert getattr(a, hi) <= getattr(b, lo), where


@pytest.mark.parametrize("bytes_range, accs, eps", [
    # the band the issue reported (1.57x10^5, 1.575x10^5, ... overlapping), then narrower
    ((157_000, 157_500), (0.5, 0.6), (0.5, 1.0, 4.0)),
    ((157_000, 157_020), (0.5, 0.6), (0.5, 1.0, 4.0)),
    ((157_000, 157_000.4), (0.8001, 0.8004), (1.0, 1.05, 1.1)),   # tiny relative ranges
    ((1e2, 1e9), (0.05, 0.95), (0.5, 0.6, 0.7, 0.8, 1.0, 2.0, 4.0, 8.0, 16.0)),  # huge
    ((42_000, 42_000), (0.7, 0.7), (2.0,)),                # a single point on each axis
    ((0, 3e4), (0.0, 0.2), (1e-3, 1e3)),                   # from zero; epsilons over decades
])
def test_tick_labels_are_distinct_and_never_overlap(tmp_path, monkeypatch, bytes_range,
                                                    accs, eps):
    """Render every figure for a data range and check the rendered tick labels of each
    axis: none overlap, none alike, no offset text. (The code before passed the reported
    band, 157,000..157,500 bytes, but printed 157,000..157,020 bytes as five labels
    "157.00k" and tiny accuracy ranges with an offset.)"""
    figs = _capture_figures(monkeypatch)
    lo, hi = bytes_range
    rows = []
    n = len(LAYERS) * len(eps)
    for i, layer in enumerate(LAYERS):
        for j, e in enumerate(eps):
            k = i * len(eps) + j
            x = lo + (hi - lo) * k / max(n - 1, 1)
            acc = accs[0] + (accs[1] - accs[0]) * k / max(n - 1, 1)
            rows.append({"id": f"{layer}{e}", "algorithm": "fedlog", "layer": layer,
                         "epsilon": e, "seed": 0, "accuracy": acc,
                         "accuracy_kind": "global test",
                         "uplink_bytes": x, "energy_j": x / 1e4, "status": "ok",
                         "device_profile": "phone-wifi"})
    plot_results(rows, tmp_path)
    assert len(figs) == 2
    for fig in figs:
        _assert_readable_ticks(fig)


@pytest.mark.parametrize("values", [
    (-1.0e6, 0.0), (-1e-3, 1e-3), (0.0, 0.0), (-7.5, -7.5), (1e-6, 1e6),
    (157_000.0, 157_000.02), (-3.0, 1e9), (123_456_789.0, 123_456_790.0), (3e-9, 5e-9),
    (0.0568, 0.056801),
])
def test_any_axis_range_gets_readable_ticks(values):
    """The tick plan alone, on both axes of a bare figure, for ranges the sweep plots do
    not reach (negative, zero, sub-unit, a spread of 12 decades)."""
    from secagg.plots import _AxisTicks, _figure, _fit_ticks

    fig = _figure(3.0, 2.4)
    ax = fig.subplots()
    lo, hi = values
    xs = [lo + (hi - lo) * i / 19 for i in range(20)]
    ax.plot(xs, xs, "o")
    _fit_ticks(fig, [_AxisTicks(ax.xaxis, xs), _AxisTicks(ax.yaxis, xs)])
    fig.canvas.draw()
    _assert_readable_ticks(fig)
    for axis in (ax.xaxis, ax.yaxis):
        assert axis.get_offset_text().get_text() == ""  # no offset or x10^k clutter
        wide = lo > 0 and hi / lo >= 10 ** 1.5
        assert axis.get_scale() == ("log" if wide else "linear")
        assert max(len(t.get_text()) for t in axis.get_ticklabels()) <= 12  # short
        locs = axis.get_ticklocs()
        for loc, label in zip(locs, axis.get_ticklabels(), strict=True):  # and exact
            text = label.get_text().replace("\u2212", "-")
            scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1:], 1.0)
            value = float(text[:-1] if scale != 1.0 else text) * scale
            step = min(np.diff(locs)) if len(locs) > 1 else abs(loc)
            assert value == pytest.approx(loc, rel=1e-9, abs=step * 1e-9), (text, loc)


def test_privacy_plot_names_the_accuracy_and_draws_a_reference(tmp_path, monkeypatch):
    figs = _capture_figures(monkeypatch)
    rows = _rows()
    for r in rows:
        r["accuracy_kind"] = "global test"
    plot_results(rows, tmp_path)
    ax = figs[0].axes[0]
    assert ax.get_ylabel() == "accuracy (global test)"
    ref = [ln for ln in ax.get_lines() if ln.get_gid() == "series-fedlog-plaintext"]
    assert len(ref) == 1 and ref[0].get_linestyle() == "--"
    assert ref[0].get_ydata()[0] == pytest.approx((0.80 + 0.81) / 2)  # mean of the seeds
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("min-max over 2 seeds" in t for t in labels)


# -- per-client epsilons (issue 28): the sweep's spread and the histogram ---------------

def _result_json(tmp_path, release, server, epsilon=5.0):
    """A result.json with privacy.clients in the per-client schema, read back from disk."""
    clients = {str(i): {"epsilon": {"release": r, "server": s}, "participations": i + 1,
                        "eligible_rounds": 10, "refusals": 0, "status": "active"}
               for i, (r, s) in enumerate(zip(release, server, strict=True))}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"accuracy": 0.8, "accuracy_kind": "global test",
                                "privacy": {"epsilon": epsilon, "delta": 1e-5,
                                            "clients": clients}}))
    return json.loads(path.read_text())


def test_sweep_records_the_per_client_spread(tmp_path):
    from secagg.sweep.report import CSV_COLUMNS, _csv_line, client_spread

    res = _result_json(tmp_path, release=[0.5, 4.0, 1.0, 2.0, 3.0],
                       server=[2.0, None, 1.0, 8.0, 4.0])
    got = client_spread(res["privacy"])
    assert got["client_eps_global"] == 5.0
    assert got["client_eps_release_min"] == 0.5
    assert got["client_eps_release_median"] == 2.0
    assert got["client_eps_release_max"] == 4.0
    assert got["client_eps_release_none"] == 0
    # the client without a figure is counted, not taken for a number
    assert (got["client_eps_server_min"], got["client_eps_server_median"],
            got["client_eps_server_max"], got["client_eps_server_none"]) == (1.0, 3.0, 8.0, 1)
    assert got["client_epsilons"]["server"] == [2.0, None, 1.0, 8.0, 4.0]  # client-id order
    line = _csv_line({"id": "c", **got})
    row = dict(zip(CSV_COLUMNS, next(csv.reader([line])), strict=True))
    assert row["client_eps_server_median"] == "3.0" and row["client_eps_server_none"] == "1"
    # clients 10 and 9 sort as numbers, not as strings
    ten = client_spread({"clients": {"10": {"epsilon": {"release": 1.0}},
                                     "9": {"epsilon": {"release": 2.0}}}})
    assert ten["client_epsilons"]["release"] == [2.0, 1.0]
    assert ten["client_eps_server_none"] == 2  # no server figure at all: both counted
    assert ten["client_eps_global"] is None  # no global figure in that privacy section
    assert client_spread(None) == {} and client_spread({"epsilon": 1.0}) == {}
    hidden = client_spread(res["privacy"], unprotected=("server",))
    assert hidden["client_epsilons"]["server"] == [None] * 5
    assert hidden["client_eps_server_none"] == 5 and hidden["client_eps_release_max"] == 4.0


def test_a_sweep_cell_records_the_spread_of_its_result(tmp_path, monkeypatch):
    """run_cell takes the per-client figures from the run's result (result.json's
    privacy.clients) into its row; the figures here are injected into real runs. A
    central-DP cell records no figure against the server, and a cell whose run is not
    private (noise seed fixed) none at all, whatever the result says."""
    from secagg.result import Result
    from secagg.sweep import load_config, run_cell

    injected = _result_json(tmp_path, [1.0, 3.0, 2.0], [0.5, 1.5, 1.0])["privacy"]
    real = Result.to_dict

    def with_clients(self, *a, **k):
        d = real(self, *a, **k)
        d["privacy"]["clients"] = injected["clients"]  # beside the run's own epsilon
        return d

    monkeypatch.setattr(Result, "to_dict", with_clients)
    spec = {"sweep": {"rounds": 1, "workers": 0, "plot": False},
            "data": {"clients": 3, "train_limit": 300},
            "algorithm": {"fedlog": {"local_epochs": 1}},
            "grid": {"algorithms": ["fedlog"], "layers": ["local-dp", "central-dp"],
                     "epsilon": [2.0]}}
    cfg = load_config(spec)
    rows = {c.layer: run_cell(cfg, c) for c in cfg.cells()}
    row = rows["local-dp"]
    assert row["client_epsilons"] == {"release": [1.0, 3.0, 2.0], "server": [0.5, 1.5, 1.0]}
    assert (row["client_eps_release_min"], row["client_eps_release_median"],
            row["client_eps_release_max"]) == (1.0, 2.0, 3.0)
    assert (row["client_eps_server_max"], row["client_eps_server_none"]) == (1.5, 0)
    assert row["client_eps_global"] == pytest.approx(row["epsilon_spent"])
    central = rows["central-dp"]
    assert central["client_epsilons"]["server"] == [None] * 3
    assert central["client_eps_server_max"] is None and central["client_eps_server_none"] == 3
    assert central["client_eps_release_max"] == 3.0
    spec["sweep"]["noise_seed"] = 3  # reproducible noise: the run says it is not private
    seeded = load_config(spec)
    row = run_cell(seeded, seeded.cells()[0])
    assert row["private"] is False
    assert row["client_epsilons"] == {"release": [None] * 3, "server": [None] * 3}
    assert row["client_eps_release_none"] == 3 and row["client_eps_release_max"] is None


def _client_rows(tmp_path):
    """Sweep rows, two layers x two epsilons x two seeds, with per-client figures;
    central DP has none against the server."""
    from secagg.sweep.report import client_spread

    rows = []
    for layer in ("central-dp", "distributed-dp"):
        for eps in (1.0, 4.0):
            for seed in (0, 1):
                rel = [eps * (0.2 + 0.1 * i) for i in range(8)]
                srv = [None] * 8 if layer == "central-dp" else [eps * 0.1 * (i + 1)
                                                                for i in range(8)]
                res = _result_json(tmp_path, rel, srv, epsilon=eps)
                rows.append({"id": f"{layer}{eps}{seed}", "algorithm": "fedlog",
                             "layer": layer, "epsilon": eps, "delta": 1e-5, "seed": seed,
                             "accuracy": 0.7, "accuracy_kind": "global test",
                             "epsilon_spent": eps, "uplink_bytes": 1000, "energy_j": 1.0,
                             "status": "ok", "device_profile": "phone-wifi",
                             **client_spread(res["privacy"])})
    return rows


def test_client_epsilon_histogram_has_a_panel_per_cell_group_and_observer(tmp_path,
                                                                           monkeypatch):
    figs = _capture_figures(monkeypatch)
    rows = _client_rows(tmp_path)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from secagg.cli import main

    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "plots")]) == 0  # secagg plot
    paths = {p.name: p for p in (tmp_path / "plots").iterdir()}
    assert {"client_epsilon.png", "client_epsilon.svg"} <= set(paths)
    assert paths["client_epsilon.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = ET.fromstring(paths["client_epsilon.svg"].read_bytes())
    panels = {el.get("id") for el in svg.iter() if (el.get("id") or "").startswith("clients-")}
    # (2 layers x 2 epsilons, seeds pooled) x (release, server), less central DP against
    # the server: no client has a figure there, so that panel would carry nothing
    assert panels == {f"clients-fedlog-{ly}-{e}-{o}" for ly in ("central-dp", "distributed-dp")
                      for e in ("1", "4") for o in ("release", "server")} - {
        "clients-fedlog-central-dp-1-server", "clients-fedlog-central-dp-4-server"}
    hist = figs[-1]
    assert len(hist.axes) == 6
    _assert_readable_ticks(hist)
    by_gid = {ax.get_gid(): ax for ax in hist.axes}
    ax = by_gid["clients-fedlog-distributed-dp-4-release"]
    counts = sum(p.get_height() for p in ax.patches)
    assert counts == 16  # 8 clients x 2 seeds
    glob = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(glob) == 1 and glob[0].get_xdata()[0] == 4.0  # the run's global figure


def test_no_per_client_data_draws_no_histogram(tmp_path):
    from secagg.plots import plot_client_epsilons

    rows = _rows()
    assert plot_client_epsilons(rows, tmp_path) == {}
    paths = plot_results(rows, tmp_path)
    assert not any(n.startswith("client_epsilon") for n in paths)
    assert not list(tmp_path.glob("client_epsilon*"))
    # a CSV keeps the spread columns but not the per-client lists: no histogram either
    rows = _client_rows(tmp_path)
    from secagg.sweep.report import _csv_line

    (tmp_path / "results.csv").write_text("".join(_csv_line(r, i == 0)
                                                  for i, r in enumerate(rows)))
    got = load_results(tmp_path / "results.csv")
    assert got[0]["client_eps_release_max"] == pytest.approx(0.9)
    assert plot_client_epsilons(got, tmp_path) == {}


def test_client_epsilon_histogram_keeps_clip_settings_apart(tmp_path):
    """Cells that differ in the clipping bound are not pooled into one histogram."""
    from secagg.plots import plot_client_epsilons

    rows = [dict(r, clip=c) for r in _client_rows(tmp_path)
            if r["layer"] == "distributed-dp" and r["epsilon"] == 1.0 for c in (1.0, 2.0)]
    paths = plot_client_epsilons(rows, tmp_path, formats=("svg",))
    svg = ET.fromstring(paths["client_epsilon.svg"].read_bytes())
    panels = {el.get("id") for el in svg.iter() if (el.get("id") or "").startswith("clients-")}
    assert panels == {f"clients-fedlog-distributed-dp-1-clip{c}-{o}" for c in ("1", "2")
                      for o in ("release", "server")}


# -- figures people read (issue 39): measured on the rendered figures --------------------

def _png_size(data):
    """Width and height (pixels) and resolution (dots per inch) of a PNG, from its IHDR and
    pHYs chunks."""
    import struct

    width, height = struct.unpack(">II", data[16:24])
    i = data.find(b"pHYs")
    ppm = struct.unpack(">I", data[i + 4:i + 8])[0] if i > 0 else 0
    return width, height, round(ppm * 0.0254)


def test_an_epsilon_grid_one_decade_wide_gets_a_log_axis(tmp_path, monkeypatch):
    """[1, 4, 16] spans 1.2 decades: read by ratios, it goes on a log axis (the code before
    switched only from 1.5 decades, crushing the low-epsilon end)."""
    figs = _capture_figures(monkeypatch)
    rows = [dict(r, epsilon=None if r["epsilon"] is None else {0.5: 1.0, 1.0: 4.0, 4.0: 16.0}
                 [r["epsilon"]]) for r in _rows()]
    plot_results(rows, tmp_path, formats=("svg",))
    ax = figs[0].axes[0]
    assert ax.get_xscale() == "log"
    _assert_readable_ticks(figs[0])
    ticks = [t.get_text() for t in ax.xaxis.get_ticklabels() if t.get_text()]
    assert ticks == ["1", "4", "16"]
    # under one decade (1..8) stays linear
    figs.clear()
    plot_results([dict(r, epsilon=None if r["epsilon"] is None else 2 * r["epsilon"])
                  for r in _rows()], tmp_path, formats=("svg",))
    assert figs[0].axes[0].get_xscale() == "linear"


def test_png_exports_are_at_least_1000_pixels_wide_at_150_dpi(tmp_path):
    """Every PNG, the one-panel privacy-utility plot included (345 x 259 px before)."""
    rows = _client_rows(tmp_path)
    paths = plot_results(rows, tmp_path, formats=("png",))
    pngs = [p for n, p in paths.items() if n.endswith(".png")]
    assert {p.name for p in pngs} == {"privacy_utility.png", "cost_utility.png",
                                      "client_epsilon.png"}
    for p in pngs:
        width, height, dpi = _png_size(p.read_bytes())
        assert width >= 1000 and dpi == 150, (p.name, width, height, dpi)
        assert height >= 400, (p.name, height)


def test_no_client_epsilon_panel_carries_a_single_value(tmp_path, monkeypatch):
    """Every client with the same epsilon: no histogram at all (the code before drew one
    panel of one bar per cell group and observer); where some groups differ, only theirs
    get a panel, each with at least two bars."""
    from secagg.plots import plot_client_epsilons

    figs = _capture_figures(monkeypatch)
    rows = _client_rows(tmp_path)
    same = [dict(r, client_epsilons={o: [r["epsilon"]] * 8 for o in ("release", "server")})
            for r in rows]
    assert plot_client_epsilons(same, tmp_path) == {}
    assert not list(tmp_path.glob("client_epsilon*")) and not figs
    mixed = same[:4] + rows[4:]  # central DP uniform, distributed DP differs
    paths = plot_client_epsilons(mixed, tmp_path)
    assert "client_epsilon.png" in paths
    fig = figs[-1]
    assert fig.axes and {ax.get_gid() for ax in fig.axes} == {
        f"clients-fedlog-distributed-dp-{e}-{o}" for e in ("1", "4")
        for o in ("release", "server")}
    for ax in fig.axes:
        bars = [p for p in ax.patches if p.get_height() > 0 and p.get_width() > 0]
        assert len(bars) >= 2, ax.get_gid()
    _assert_readable_ticks(fig)


def test_cost_utility_never_mixes_accuracy_kinds_on_one_axis(tmp_path, monkeypatch):
    """FedLog's mean local test accuracy and SphereFed's global test accuracy: each axis
    names one kind and holds only that kind's points (before: one axis for both)."""
    figs = _capture_figures(monkeypatch)
    rows = _rows()
    for r in rows:
        r["accuracy_kind"] = "mean local test"
    other = [dict(r, algorithm="spherefed", accuracy_kind="global test",
                  accuracy=r["accuracy"] - 0.3) for r in _rows()]
    plot_results(rows + other, tmp_path, formats=("svg",))
    cost = figs[1]
    kinds = {"accuracy (mean local test)": {r["accuracy"] for r in rows},
             "accuracy (global test)": {r["accuracy"] for r in other}}
    seen = set()
    for ax in cost.axes:
        label = ax.get_ylabel()
        assert label in kinds, label
        seen.add(label)
        ys = {float(y) for c in ax.collections for y in c.get_offsets()[:, 1]}
        assert ys, label
        assert all(any(abs(y - v) < 1e-9 for v in kinds[label]) for y in ys), label
    assert seen == set(kinds)
    _assert_readable_ticks(cost)


def test_plaintext_reference_is_drawn_above_every_other_series(tmp_path, monkeypatch):
    """The plaintext markers (cost plot) and the reference line (privacy plot) are drawn
    last, so no other series hides them (before: plaintext's markers were drawn first
    with the same z-order, under the others'); the cost markers are hollow, so they hide
    nothing either."""
    figs = _capture_figures(monkeypatch)
    plot_results(_rows(), tmp_path, formats=("svg",))
    for fig in figs:
        for ax in fig.axes:
            data = [a for a in ax.get_children() if (a.get_gid() or "").startswith(
                ("series-", "spread-", "cost-"))]
            ref = [a for a in data if "plaintext" in a.get_gid()]
            others = [a for a in data if "plaintext" not in a.get_gid()]
            assert ref and others, ax
            assert min(a.get_zorder() for a in ref) > max(a.get_zorder() for a in others)
            for a in ref:
                if hasattr(a, "get_facecolor") and a.get_gid().startswith("cost-"):
                    assert a.get_facecolor().size == 0 or a.get_facecolor()[0][3] == 0
