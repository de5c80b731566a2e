"""Cost accounting: one row per message, and what it costs on a given device.

The :class:`Ledger` holds one :class:`CostRow` per message a run sends (broadcasts, uploads,
keys, shares, ciphertexts...), with its true wire size and the CPU time each side spent on
it. :meth:`Ledger.summary` groups rows by phase and direction; :meth:`Ledger.to_csv` and
:meth:`Ledger.to_json` export them. A :class:`HardwareProfile` converts a row into an
estimated latency and energy on a device (see :data:`PROFILES` for the presets and the
source of every figure).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SERVER = "server"


def direction_of(sender: Any, receiver: Any) -> str:
    """``"up"`` (client to server), ``"down"`` (server to client) or ``"other"``."""
    if receiver == SERVER and sender != SERVER:
        return "up"
    if sender == SERVER and receiver != SERVER:
        return "down"
    return "other"


@dataclass(frozen=True)
class CostRow:
    """One message.

    Attributes:
        round, phase, stage: where in the run it was sent.
        sender, receiver: client ids (int) or a named party ("server", "decryptor").
        fields: plaintext bytes per field carried (empty for protocol messages).
        plaintext_bytes: size of the payload before any protection.
        wire_bytes: the true serialized size on the wire.
        client_cpu_s: CPU seconds the client spent producing / consuming it.
        server_cpu_s: CPU seconds the server spent on it.
        flops: estimated floating-point operations of the client statistic it carries.
    """

    round: int
    phase: str
    stage: str
    sender: Any
    receiver: Any
    fields: dict[str, int] = field(default_factory=dict)
    plaintext_bytes: int = 0
    wire_bytes: int = 0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    flops: float = 0.0

    @property
    def direction(self) -> str:
        """``"up"``, ``"down"`` or ``"other"``."""
        return direction_of(self.sender, self.receiver)


_COLUMNS = (
    "round",
    "phase",
    "stage",
    "sender",
    "receiver",
    "direction",
    "fields",
    "plaintext_bytes",
    "wire_bytes",
    "client_cpu_s",
    "server_cpu_s",
    "flops",
)


class Ledger:
    """The cost ledger of a run: one :class:`CostRow` per message."""

    def __init__(self, rows: Iterable[CostRow] = ()) -> None:
        self.rows: list[CostRow] = list(rows)

    def record(self, row: CostRow) -> None:
        """Append one message's row."""
        if row.wire_bytes < 0 or row.plaintext_bytes < 0:
            raise ValueError("byte counts must be non-negative")
        self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def total(self, direction: str | None = None, phase: str | None = None) -> dict[str, float]:
        """Totals (messages, bytes, CPU, FLOPs) over rows matching ``direction``/``phase``."""
        out = {
            "messages": 0.0,
            "plaintext_bytes": 0.0,
            "wire_bytes": 0.0,
            "client_cpu_s": 0.0,
            "server_cpu_s": 0.0,
            "flops": 0.0,
        }
        for r in self.rows:
            if direction is not None and r.direction != direction:
                continue
            if phase is not None and r.phase != phase:
                continue
            out["messages"] += 1
            out["plaintext_bytes"] += r.plaintext_bytes
            out["wire_bytes"] += r.wire_bytes
            out["client_cpu_s"] += r.client_cpu_s
            out["server_cpu_s"] += r.server_cpu_s
            out["flops"] += r.flops
        return out

    def summary(self) -> list[dict[str, Any]]:
        """One dict per (phase, direction): messages, bytes, CPU seconds, FLOPs, and the
        mean wire bytes per client per round for client traffic."""
        keys: dict[tuple[str, str], None] = {}
        for r in self.rows:
            keys[(r.phase, r.direction)] = None
        out = []
        for phase, direction in keys:
            t = self.total(direction=direction, phase=phase)
            rows = [r for r in self.rows if r.phase == phase and r.direction == direction]
            clients = {(r.round, r.sender if direction == "up" else r.receiver) for r in rows}
            out.append(
                {
                    "phase": phase,
                    "direction": direction,
                    **t,
                    "wire_bytes_per_client_round": t["wire_bytes"] / max(1, len(clients)),
                }
            )
        return out

    def format_summary(self) -> str:
        """The summary as an aligned text table."""
        rows = self.summary()
        head = (
            f"{'phase':<14}{'dir':<7}{'msgs':>8}{'plain B':>14}{'wire B':>14}"
            f"{'client s':>10}{'server s':>10}"
        )
        lines = [head, "-" * len(head)]
        for r in rows:
            lines.append(
                f"{r['phase']:<14}{r['direction']:<7}{int(r['messages']):>8}"
                f"{int(r['plaintext_bytes']):>14}{int(r['wire_bytes']):>14}"
                f"{r['client_cpu_s']:>10.3f}{r['server_cpu_s']:>10.3f}"
            )
        return "\n".join(lines)

    def _dicts(self) -> list[dict[str, Any]]:
        out = []
        for r in self.rows:
            d = asdict(r)
            d["direction"] = r.direction
            out.append(d)
        return out

    def to_csv(self, path: str | Path | None = None) -> str:
        """Write the rows as CSV (``fields`` as a JSON object) and return the text."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(_COLUMNS))
        w.writeheader()
        for d in self._dicts():
            d["fields"] = json.dumps(d["fields"], sort_keys=True)
            w.writerow({k: d[k] for k in _COLUMNS})
        text = buf.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    def to_json(self, path: str | Path | None = None) -> str:
        """Write ``{"rows": [...], "summary": [...]}`` as JSON and return the text."""
        text = json.dumps({"rows": self._dicts(), "summary": self.summary()}, default=str)
        if path is not None:
            Path(path).write_text(text)
        return text

    def estimate(self, profile: HardwareProfile) -> dict[str, float]:
        """Estimated client-side latency (s) and energy (J) of all rows on ``profile``,
        summed, plus the per-client-per-round mean latency."""
        lat = energy = 0.0
        per: dict[tuple[int, Any], float] = {}
        for r in self.rows:
            est = profile.estimate(r)
            lat += est["latency_s"]
            energy += est["energy_j"]
            who = r.sender if r.direction == "up" else r.receiver
            if r.direction in ("up", "down"):
                per[(r.round, who)] = per.get((r.round, who), 0.0) + est["latency_s"]
        mean = sum(per.values()) / len(per) if per else 0.0
        return {"latency_s": lat, "energy_j": energy, "latency_s_per_client_round": mean}


@dataclass(frozen=True)
class HardwareProfile:
    """A client device: link speeds, compute speed and energy figures.

    Attributes:
        name: preset name.
        uplink_bps, downlink_bps: link throughput in bits per second.
        rtt_s: round-trip time added once per message.
        cpu_slowdown: how many times slower than the machine the CPU times were measured on
            (a current x86 desktop/server core = 1.0).
        active_power_w: device power while computing (W).
        uplink_j_per_byte, downlink_j_per_byte: marginal radio/NIC energy per byte.
        sources: where each figure comes from.
    """

    name: str
    uplink_bps: float
    downlink_bps: float
    rtt_s: float
    cpu_slowdown: float
    active_power_w: float
    uplink_j_per_byte: float
    downlink_j_per_byte: float
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def estimate(self, row: CostRow) -> dict[str, float]:
        """Latency (s) and energy (J) of one message for a client on this device.

        Upload rows cost uplink transfer + the client's CPU; download rows cost downlink
        transfer + the client's CPU; other rows only the client's CPU (if any).
        """
        compute_s = row.client_cpu_s * self.cpu_slowdown
        if row.direction == "up":
            xfer = row.wire_bytes * 8 / self.uplink_bps + self.rtt_s
            radio_j = row.wire_bytes * self.uplink_j_per_byte
        elif row.direction == "down":
            xfer = row.wire_bytes * 8 / self.downlink_bps + self.rtt_s
            radio_j = row.wire_bytes * self.downlink_j_per_byte
        else:
            xfer = radio_j = 0.0
        return {
            "latency_s": xfer + compute_s,
            "energy_j": radio_j + compute_s * self.active_power_w,
        }


# Figures are typical published values, good to a factor of ~2; each cites its source.
PROFILES: dict[str, HardwareProfile] = {
    "rpi4-lte": HardwareProfile(
        name="rpi4-lte",
        # Ookla Speedtest Global Index (2023): median mobile upload ~10 Mbit/s, download ~40.
        uplink_bps=10e6,
        downlink_bps=40e6,
        # LTE RTT ~50-70 ms (Huang et al., "A Close Examination of Performance and Power
        # Characteristics of 4G LTE Networks", MobiSys 2012, Table 3).
        rtt_s=0.06,
        # Geekbench 5 single-core: Raspberry Pi 4 (Cortex-A72 1.5 GHz) ~300 vs ~1500 for a
        # current x86 core.
        cpu_slowdown=5.0,
        # Raspberry Pi 4 B under full CPU load draws ~6.4 W (Tom's Hardware Pi 4 review).
        active_power_w=6.4,
        # Huang et al. 2012 LTE power model: uplink 438 mW per Mbit/s -> 0.438 uJ/bit,
        # downlink 52 mW per Mbit/s -> 0.052 uJ/bit.
        uplink_j_per_byte=8 * 0.438e-6,
        downlink_j_per_byte=8 * 0.052e-6,
        sources={
            "links": "Ookla Speedtest Global Index 2023 (mobile medians)",
            "rtt, radio energy": "Huang et al., MobiSys 2012 (LTE power model)",
            "cpu": "Geekbench 5 single-core, Raspberry Pi 4 vs x86 desktop",
            "power": "Tom's Hardware Raspberry Pi 4 B review (load power)",
        },
    ),
    "phone-wifi": HardwareProfile(
        name="phone-wifi",
        # Ookla Speedtest Global Index (2023): median fixed broadband ~40 up / ~90 down.
        uplink_bps=40e6,
        downlink_bps=90e6,
        # Home Wi-Fi to a cloud region: ~20 ms.
        rtt_s=0.02,
        # Geekbench 6 single-core: mid-range 2023 phone SoC ~1200-1500, ~1.3x slower.
        cpu_slowdown=1.3,
        # A phone SoC under sustained CPU load: ~3 W (AnandTech SoC power measurements).
        active_power_w=3.0,
        # Huang et al. 2012 Wi-Fi power model: uplink 283 mW per Mbit/s, downlink 137.
        uplink_j_per_byte=8 * 0.283e-6,
        downlink_j_per_byte=8 * 0.137e-6,
        sources={
            "links": "Ookla Speedtest Global Index 2023 (fixed medians)",
            "radio energy": "Huang et al., MobiSys 2012 (Wi-Fi power model)",
            "cpu": "Geekbench 6 single-core, mid-range phone vs x86 desktop",
            "power": "AnandTech smartphone SoC power measurements",
        },
    ),
    "datacenter": HardwareProfile(
        name="datacenter",
        # 10 GbE server NIC; intra-region RTT ~0.5 ms.
        uplink_bps=10e9,
        downlink_bps=10e9,
        rtt_s=0.0005,
        # The reference: a current x86 server core.
        cpu_slowdown=1.0,
        # Per active core share of a ~300 W two-socket server with ~48 cores: ~6 W/core
        # (SPECpower_ssj2008 published results, 100% load).
        active_power_w=6.0,
        # 10 GbE NIC ~5 W at line rate (Intel X710 datasheet): ~4 nJ per byte.
        uplink_j_per_byte=4e-9,
        downlink_j_per_byte=4e-9,
        sources={
            "links": "10 GbE NIC",
            "power": "SPECpower_ssj2008 results (per-core share)",
            "nic energy": "Intel Ethernet X710 datasheet typical power",
        },
    ),
}


def get_profile(name: str) -> HardwareProfile:
    """The preset named ``name`` (see :data:`PROFILES`)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown device profile {name!r}; choose from {sorted(PROFILES)}"
        ) from None
