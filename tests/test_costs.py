"""Cost ledger and hardware profiles."""

import csv
import io
import json

import pytest

from secagg.costs import PROFILES, CostRow, HardwareProfile, Ledger, get_profile


def ledger():
    lg = Ledger()
    lg.record(CostRow(0, "train", "broadcast", "server", 0, {"w": 400}, 400, 420, 0.01, 0.002))
    lg.record(CostRow(0, "train", "broadcast", "server", 1, {"w": 400}, 400, 420, 0.01, 0.002))
    lg.record(CostRow(0, "train", "upload", 0, "server", {"w": 400}, 400, 1000, 0.5, 0.1, 1e6))
    lg.record(CostRow(0, "train", "upload", 1, "server", {"w": 400}, 400, 1200, 0.7, 0.1, 2e6))
    lg.record(CostRow(1, "calib", "upload", 0, "server", {}, 10, 30, 0.0, 0.0))
    return lg


def test_summary_groups_by_phase_and_direction():
    s = {(r["phase"], r["direction"]): r for r in ledger().summary()}
    assert set(s) == {("train", "down"), ("train", "up"), ("calib", "up")}
    up = s[("train", "up")]
    assert up["messages"] == 2 and up["wire_bytes"] == 2200 and up["flops"] == 3e6
    assert up["wire_bytes_per_client_round"] == 1100
    assert s[("train", "down")]["wire_bytes"] == 840
    assert ledger().total("up")["wire_bytes"] == 2230


def test_csv_and_json_export_round_trip(tmp_path):
    lg = ledger()
    rows = list(csv.DictReader(io.StringIO(lg.to_csv(tmp_path / "c.csv"))))
    assert len(rows) == 5 and rows[2]["direction"] == "up" and rows[2]["wire_bytes"] == "1000"
    assert json.loads(rows[2]["fields"]) == {"w": 400}
    data = json.loads((tmp_path / "c.csv").read_text().split("\n", 1)[0] and lg.to_json())
    assert len(data["rows"]) == 5 and data["summary"]


def test_profile_estimate_by_hand():
    p = HardwareProfile("x", uplink_bps=8e6, downlink_bps=16e6, rtt_s=0.1, cpu_slowdown=2.0,
                        active_power_w=5.0, uplink_j_per_byte=1e-6, downlink_j_per_byte=5e-7)
    up = CostRow(0, "p", "upload", 3, "server", wire_bytes=1_000_000, client_cpu_s=0.5)
    e = p.estimate(up)
    assert e["latency_s"] == pytest.approx(1.0 + 0.1 + 1.0)   # 8e6 bits / 8e6 bps + rtt + 0.5*2
    assert e["energy_j"] == pytest.approx(1.0 + 1.0 * 5.0)     # 1e6 B * 1e-6 + 1 s * 5 W
    down = CostRow(0, "p", "broadcast", "server", 3, wire_bytes=2_000_000)
    assert p.estimate(down)["latency_s"] == pytest.approx(1.0 + 0.1)


def test_presets_have_sources_and_sane_order():
    assert {"rpi4-lte", "phone-wifi", "datacenter"} <= set(PROFILES)
    for prof in PROFILES.values():
        assert prof.sources, prof.name
    row = CostRow(0, "p", "upload", 0, "server", wire_bytes=10**6, client_cpu_s=0.1)
    lat = {n: p.estimate(row)["latency_s"] for n, p in PROFILES.items()}
    assert lat["rpi4-lte"] > lat["phone-wifi"] > lat["datacenter"]
    with pytest.raises(ValueError, match="unknown device profile"):
        get_profile("toaster")
