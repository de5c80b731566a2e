"""Sweep plots: files written, valid PNG/SVG, one series per layer."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET

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


@pytest.mark.parametrize("bytes_range, eps", [
    ((157_000, 157_500), (0.5, 1.0, 4.0)),                 # the narrow band that overlapped
    ((1e2, 1e9), (0.5, 0.6, 0.7, 0.8, 1.0, 2.0, 4.0, 8.0, 16.0)),   # wide, crowded epsilons
    ((3e4, 3.2e4), (1.0, 1.05, 1.1)),
])
def test_tick_labels_never_overlap(tmp_path, monkeypatch, bytes_range, eps):
    """Render both figures and check, per axes, that no two visible x tick labels overlap
    (their rendered extents), and that each axes keeps at least two labels."""
    import secagg.plots as plots

    figs = []
    real = plots._figure

    def capture(w, h):
        fig = real(w, h)
        figs.append(fig)
        return fig

    monkeypatch.setattr(plots, "_figure", capture)
    lo, hi = bytes_range
    rows = []
    for i, layer in enumerate(LAYERS):
        for j, e in enumerate(eps):
            x = lo + (hi - lo) * (i * len(eps) + j) / (len(LAYERS) * len(eps))
            rows.append({"id": f"{layer}{e}", "algorithm": "fedlog", "layer": layer,
                         "epsilon": e, "seed": 0, "accuracy": 0.5 + 0.01 * j,
                         "uplink_bytes": x, "energy_j": x / 1e4, "status": "ok",
                         "device_profile": "phone-wifi"})
    plot_results(rows, tmp_path)
    assert len(figs) == 2
    for fig in figs:
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels()
                            if t.get_visible() and t.get_text()), key=lambda b: b.x0)
            assert len(boxes) >= 2, [t.get_text() for t in ax.get_xticklabels()]
            for a, b in zip(boxes, boxes[1:]):
                assert a.x1 <= b.x0, (ax.get_xlabel(), [t.get_text() for t in
                                                        ax.get_xticklabels()])
