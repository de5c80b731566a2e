"""Cost ledger and hardware profiles."""

import csv
import io
import json

import pytest

from algorithms.fedlog import FedLog
from secagg.cli import main
from secagg.costs import (
    CRYPTO_CYCLES,
    DEVICE_COLUMNS,
    PROFILES,
    REFERENCE_FLOPS_PER_CYCLE,
    CostRow,
    HardwareProfile,
    Ledger,
    crypto_flops,
    direction_of,
    get_profile,
    he_flops,
    secure_sum_client_flops,
)
from secagg.errors import ConfigurationError
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum


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
    p = HardwareProfile("x", uplink_bps=8e6, downlink_bps=16e6, rtt_s=0.1, flops_per_s=1e6,
                        active_power_w=5.0, uplink_j_per_byte=1e-6, downlink_j_per_byte=5e-7)
    up = CostRow(0, "p", "upload", 3, "server", wire_bytes=1_000_000, client_cpu_s=0.5,
                 flops=2e6)
    e = p.estimate(up)
    assert e["compute_s"] == pytest.approx(2.0)                # 2e6 FLOP / 1e6 FLOP/s
    assert e["latency_s"] == pytest.approx(1.0 + 0.1 + 2.0)    # 8e6 bits / 8e6 bps + rtt + 2
    assert e["energy_j"] == pytest.approx(1.0 + 2e6 * 5e-6)    # 1e6 B * 1e-6 + 2e6 * 5 W/1e6
    down = CostRow(0, "p", "broadcast", "server", 3, wire_bytes=2_000_000)
    assert p.estimate(down)["latency_s"] == pytest.approx(1.0 + 0.1)
    internal = CostRow(0, "p", "decrypt", "server", "decryptor", wire_bytes=10**6, flops=1e9)
    assert p.estimate(internal) == {"compute_s": 0.0, "radio_s": 0.0, "latency_s": 0.0,
                                    "energy_j": 0.0}


def test_device_figures_ignore_measured_host_cpu():
    p = get_profile("rpi4-lte")
    a = CostRow(0, "p", "upload", 0, "server", wire_bytes=5000, client_cpu_s=0.001, flops=1e7)
    b = CostRow(0, "p", "upload", 0, "server", wire_bytes=5000, client_cpu_s=9.0, flops=1e7)
    assert p.estimate(a) == p.estimate(b)


def test_presets_have_sources_and_sane_order():
    assert {"rpi4-lte", "phone-wifi", "datacenter"} <= set(PROFILES)
    for prof in PROFILES.values():
        assert prof.sources, prof.name
        assert prof.j_per_flop == prof.active_power_w / prof.flops_per_s
    row = CostRow(0, "p", "upload", 0, "server", wire_bytes=10**6, flops=1e9)
    lat = {n: p.estimate(row)["latency_s"] for n, p in PROFILES.items()}
    assert lat["rpi4-lte"] > lat["phone-wifi"] > lat["datacenter"]
    with pytest.raises(ConfigurationError, match="unknown device profile"):
        get_profile("toaster")


def test_parties_and_directions():
    assert direction_of(3, "server") == "up"
    assert direction_of("server", 3) == "down"
    assert direction_of("decryptor", 3) == "down"      # key contexts reach clients: downlink
    assert direction_of("server", "decryptor") == "internal"
    assert direction_of("decryptor", "server") == "internal"
    lg = Ledger([CostRow(0, "p", "keys", "decryptor", c, wire_bytes=100) for c in (0, 1)]
                + [CostRow(0, "p", "upload", c, "server", wire_bytes=50) for c in (0, 1)]
                + [CostRow(0, "p", "decrypt", "server", "decryptor", wire_bytes=999)])
    assert lg.client_rounds() == 2
    s = {r["direction"]: r for r in lg.summary()}
    assert s["down"]["wire_bytes_per_client_round"] == 100
    assert s["internal"]["wire_bytes"] == 999 and s["internal"]["wire_bytes_per_client_round"] is None


def test_crypto_work_model():
    assert crypto_flops(x25519=2) == 2 * CRYPTO_CYCLES["x25519"] * REFERENCE_FLOPS_PER_CYCLE
    with pytest.raises(ConfigurationError, match="unknown crypto operation"):
        crypto_flops(rsa=1)
    with pytest.raises(ConfigurationError, match="negative"):
        crypto_flops(x25519=-1)
    # the masked upload grows with the vector and the neighbours
    small = secure_sum_client_flops("masked", 3, vector_bytes=1000)
    assert secure_sum_client_flops("masked", 3, vector_bytes=2000) > small
    assert secure_sum_client_flops("masked", 9, vector_bytes=1000) > small
    with pytest.raises(ConfigurationError, match="unknown secure-sum step"):
        secure_sum_client_flops("dance", 3)
    assert he_flops("encrypt", 8192, 3, 2) == 2 * he_flops("encrypt", 8192, 3)
    assert he_flops("encrypt", 8192, 3) > he_flops("decrypt", 8192, 3)


def _fedlog(layer, partition):
    return Federation(FedLog(feature_dim=16, local_epochs=1), layer, partition, rounds=1,
                      seed=0, progress=False).run()


def test_secure_sum_costs_the_device_more_than_plaintext(digits):
    from secagg.data import dirichlet_split

    part = dirichlet_split(digits, 4, 0.5, seed=0, local_test_fraction=0.2)
    plain, secure = _fedlog(Plaintext(), part), _fedlog(SecureSum(threshold=0.7), part)
    for prof in PROFILES:
        p, s = plain.costs.estimate(prof), secure.costs.estimate(prof)
        assert s["flops_per_client_round"] > p["flops_per_client_round"]
        assert s["compute_s_per_client_round"] > p["compute_s_per_client_round"]


def _device_columns(path):
    with open(path) as fh:
        return [tuple(row[c] for c in ("round", "stage", "sender", "receiver", "wire_bytes",
                                        "flops", *DEVICE_COLUMNS))
                for row in csv.DictReader(fh)]


def test_same_seed_gives_identical_device_columns(tmp_path, capsys):
    argv = ["run", "--rounds", "2", "--clients", "4", "--local-epochs", "1", "--quiet",
            "--layer", "secure-sum", "--device-profile", "rpi4-lte"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    a, b = _device_columns(tmp_path / "a" / "costs.csv"), _device_columns(tmp_path / "b" / "costs.csv")
    assert a == b and len(a) > 20
    assert any(float(r[-1]) > 0 for r in a)  # energy booked
