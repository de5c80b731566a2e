"""Cost accounting: one row per message, and what it costs on a given device.

The :class:`Ledger` holds one :class:`CostRow` per message a run sends (broadcasts, uploads,
keys, shares, ciphertexts...), with its framed wire size (:func:`secagg.wire.message_size`,
the one definition of a message's bytes), a deterministic estimate of the client-side work
it took (``flops``: the client statistic's FLOPs plus FLOP-equivalents of the cryptography,
see :func:`crypto_flops`), and the host CPU seconds measured on the machine that ran the
simulation (``client_cpu_s``/``server_cpu_s``: a separate, measured column that never feeds
the device figures).

Parties: clients are integer ids; :data:`SERVER` and :data:`DECRYPTOR` (and any other named
party) are not clients. A message a client sends is ``up``, one a client receives is
``down``; traffic between non-client parties (server <-> decryptor, server bookkeeping) is
``internal``: reported in totals, never folded into per-client figures.

A :class:`HardwareProfile` turns a row into device latency and energy with a deterministic
model: compute = FLOPs / the device's FLOP rate (energy: x J per FLOP), radio = wire bytes /
link rate + one round trip (energy: x J per byte). Same seed -> identical device figures.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from secagg.errors import ConfigurationError
from secagg.stages import Stage

SERVER = "server"
#: The designated decryptor of the homomorphic layer: a party, never a client.
DECRYPTOR = "decryptor"
#: Message directions, as :attr:`CostRow.direction` reports them.
DIRECTIONS = ("up", "down", "internal")


def is_client(party: Any) -> bool:
    """Whether ``party`` is a client (an integer id; named parties are not clients)."""
    return isinstance(party, numbers.Integral) and not isinstance(party, bool)


def direction_of(sender: Any, receiver: Any) -> str:
    """``"up"`` (a client sends it), ``"down"`` (a client receives it) or ``"internal"``
    (between non-client parties: server, decryptor, key provisioner)."""
    if is_client(sender):
        return "up"
    if is_client(receiver):
        return "down"
    return "internal"


# ---------------------------------------------------------------------------------------------
# Deterministic work model of the cryptography (FLOP-equivalents)
#
# Crypto is costed in cycles of a reference x86-64 server core (3 GHz, AES-NI), from published
# cycle counts, then converted to FLOP-equivalents: one reference cycle is worth the FLOPs that
# core sustains per cycle on the clients' numeric work (REFERENCE_FLOPS_PER_CYCLE), so that on
# the reference core a crypto cycle and the same time spent on arithmetic cost the same. The
# model ignores that devices without crypto extensions (the Raspberry Pi 4's BCM2711 has
# none) run AES relatively slower than arithmetic: their crypto figures are optimistic.

#: Clock of the reference core (a current x86-64 server core).
REFERENCE_CLOCK_HZ = 3.0e9
#: FLOPs the reference core sustains per cycle on small dense float work: a quarter of the
#: AVX2 FMA peak of 16 double-precision FLOP/cycle (Intel 64 and IA-32 Architectures
#: Optimization Reference Manual, FMA throughput 2/cycle x 4 doubles x 2 FLOP); the quarter
#: is the usual efficiency of small layers (an assumption, good to ~2x).
REFERENCE_FLOPS_PER_CYCLE = 4.0

#: Reference-core cycles per cryptographic operation, with the source of each figure.
CRYPTO_CYCLES: dict[str, float] = {
    # X25519 scalar multiplication (key generation or agreement): ~1.2e5-1.6e5 cycles on
    # x86-64 (eBACS, ECRYPT Benchmarking of Cryptographic Systems, crypto_scalarmult/curve25519).
    "x25519": 1.4e5,
    # HKDF-SHA256 of a short key: ~4 SHA-256 compressions of 64 B at ~12 cycles/B.
    "hkdf": 4 * 64 * 12.0,
    # SHA-256 without SHA extensions: ~12 cycles per byte (eBACS crypto_hash/sha256).
    "sha256_byte": 12.0,
    # AES-256-GCM with AES-NI/PCLMULQDQ: ~1 cycle/B for AES-128-GCM (Gueron, "AES-GCM for
    # Efficient Authenticated Encryption", 2013), x1.4 for AES-256's 14 rounds.
    "aes_gcm_byte": 1.4,
    # Per-call overhead of AES-GCM (key schedule, GHASH key, tag): ~1e3 cycles (same source:
    # a few hundred cycles for the key schedule plus the tag blocks).
    "aes_gcm_call": 1.0e3,
    # AES-256-CTR keystream with AES-NI: ~0.65 cycles/B for AES-128 (Gueron, "Intel Advanced
    # Encryption Standard (AES) New Instructions Set", Intel white paper 2010), x1.4.
    "aes_ctr_byte": 0.9,
    # A multiplication modulo the Mersenne prime 2^127 - 1: four 64x64 -> 128-bit products plus
    # a shift-and-add reduction, ~20 cycles (Agner Fog, instruction tables: MUL r64 ~3 cycles).
    "mulmod127": 20.0,
    # One NTT butterfly mod a 60-bit prime with Harvey's lazy reduction: ~5 cycles including
    # memory traffic (Harvey, "Faster arithmetic for number-theoretic transforms", JSC 2014).
    "ntt_butterfly": 5.0,
    # Sampling one small-noise coefficient per modulus from a CSPRNG: ~20 cycles.
    "noise_coefficient": 20.0,
}


def crypto_flops(**counts: float) -> float:
    """FLOP-equivalents of the given counts of cryptographic operations.

    Keys are those of :data:`CRYPTO_CYCLES` (``x25519=2``, ``aes_ctr_byte=4096``...); each
    count multiplies that operation's reference cycles, then :data:`REFERENCE_FLOPS_PER_CYCLE`.

    Raises:
        ConfigurationError: an unknown operation or a negative count.
    """
    cycles = 0.0
    for op, n in counts.items():
        if op not in CRYPTO_CYCLES:
            raise ConfigurationError(
                f"unknown crypto operation {op!r}; known: {sorted(CRYPTO_CYCLES)}")
        if n < 0:
            raise ConfigurationError(f"negative count {n} of crypto operation {op!r}")
        cycles += CRYPTO_CYCLES[op] * n
    return cycles * REFERENCE_FLOPS_PER_CYCLE


#: Field elements one 32-byte secret is shared as (secagg.secure_sum.shamir: 3 per key); a
#: client shares two secrets (the self-mask seed and the mask private key).
_SHAMIR_ELEMENTS = 2 * 3
#: Plaintext bytes of one encrypted share entry (6 elements x 16 B).
_SHARE_ENTRY_BYTES = _SHAMIR_ELEMENTS * 16


def secure_sum_client_flops(
    step: str, degree: int, share_threshold: int = 0, vector_bytes: int = 0, word_bytes: int = 8
) -> float:
    """Deterministic client work (FLOP-equivalents) of one step of the secure-sum protocol
    (Bonawitz et al. 2017 / SecAgg+) for a client with ``degree`` neighbours.

    Steps: ``"advertise"`` (two X25519 key pairs), ``"share"`` (a channel key per neighbour,
    Shamir shares of two secrets for ``degree + 1`` holders at threshold ``share_threshold``,
    one AES-GCM share per neighbour, the seed commitment), ``"ack"`` (decrypt the forwarded
    shares), ``"masked"`` (one agreement per neighbour, ``degree + 1`` AES-CTR masks of
    ``vector_bytes`` added word by word, SHA-256 and a tag over the vector), ``"unmask"``
    (look-ups only: 0).
    """
    d = max(int(degree), 0)
    if step == Stage.ADVERTISE:
        return crypto_flops(x25519=2)
    if step == Stage.SHARE:
        return crypto_flops(
            x25519=d, hkdf=d, mulmod127=_SHAMIR_ELEMENTS * (d + 1) * max(share_threshold, 1),
            aes_gcm_call=d, aes_gcm_byte=d * _SHARE_ENTRY_BYTES, sha256_byte=64,
        )
    if step == "ack":
        return crypto_flops(aes_gcm_call=d, aes_gcm_byte=d * _SHARE_ENTRY_BYTES)
    if step == "masked":
        words = vector_bytes / max(word_bytes, 1)
        return crypto_flops(
            x25519=d, hkdf=d + 1, aes_ctr_byte=(d + 1) * vector_bytes,
            sha256_byte=vector_bytes + 64,
        ) + (d + 1) * words  # one modular add (or subtract) per word per mask
    if step == Stage.UNMASK:
        return 0.0
    raise ConfigurationError(
        f"unknown secure-sum step {step!r}; one of advertise, share, ack, masked, unmask")


def he_flops(op: str, poly_modulus_degree: int, n_moduli: int, n_ciphertexts: int = 1) -> float:
    """Deterministic work (FLOP-equivalents) of RLWE public-key encryption or decryption
    (BFV/CKKS, RNS form) of ``n_ciphertexts`` ciphertexts of degree ``poly_modulus_degree``
    over ``n_moduli`` coefficient primes.

    Encryption: sample u, e0, e1 (3 noise polynomials), one forward NTT of u and two inverse
    NTTs per prime; decryption: one forward and one inverse NTT per prime of the data modulus.
    An NTT of size N has N/2 log2 N butterflies.
    """
    n = int(poly_modulus_degree)
    if n < 2 or n_moduli < 1:
        raise ConfigurationError(f"bad HE parameters: N={n}, moduli={n_moduli}")
    butterflies = n / 2 * math.log2(n)
    if op == "encrypt":
        per = crypto_flops(ntt_butterfly=3 * butterflies * n_moduli,
                           noise_coefficient=3 * n * n_moduli)
    elif op == "decrypt":
        per = crypto_flops(ntt_butterfly=2 * butterflies * n_moduli)
    else:
        raise ConfigurationError(f"unknown HE operation {op!r}; 'encrypt' or 'decrypt'")
    return per * n_ciphertexts


@dataclass(frozen=True)
class CostRow:
    """One message, or one client's local work that sends nothing (stage ``"local"``,
    sender = receiver = that client, 0 bytes; see :class:`algorithms.base.LocalPhase`).

    Attributes:
        round, phase, stage: where in the run it was sent.
        sender, receiver: client ids (int) or a named party (:data:`SERVER`,
            :data:`DECRYPTOR`...).
        fields: plaintext bytes per field carried (empty for protocol messages).
        plaintext_bytes: size of the payload before any protection.
        wire_bytes: the framed size on the wire (:func:`secagg.wire.message_size`).
        client_cpu_s: host CPU seconds measured for the client's side (informative only).
        server_cpu_s: host CPU seconds measured for the server's side (informative only).
        flops: deterministic estimate of the client-side work this message took (the client
            statistic's FLOPs, plus FLOP-equivalents of its crypto); feeds the device model.
        step_flops: the part of ``flops`` that is the client step itself (computing the
            upload, identical under every layer); the rest is the layer's own work.
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
    step_flops: float = 0.0

    @property
    def direction(self) -> str:
        """``"up"``, ``"down"`` or ``"internal"`` (see :func:`direction_of`)."""
        return direction_of(self.sender, self.receiver)

    @property
    def client(self) -> Any:
        """The client this message belongs to (sender of ``up``, receiver of ``down``), or
        None for internal traffic."""
        d = self.direction
        return self.sender if d == "up" else self.receiver if d == "down" else None


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
    "flops",
    "step_flops",
    "client_cpu_s",
    "server_cpu_s",
)
#: Device columns added by :meth:`Ledger.to_csv` when given a profile (deterministic).
DEVICE_COLUMNS = ("device_compute_s", "device_radio_s", "device_latency_s", "device_energy_j")


class Ledger:
    """The cost ledger of a run: one :class:`CostRow` per message."""

    def __init__(self, rows: Iterable[CostRow] = ()) -> None:
        self.rows: list[CostRow] = list(rows)

    def record(self, row: CostRow) -> None:
        """Append one message's row.

        Raises:
            ConfigurationError: a negative byte count or FLOP estimate.
        """
        if row.wire_bytes < 0 or row.plaintext_bytes < 0 or row.flops < 0:
            raise ConfigurationError(
                f"message {row.sender}->{row.receiver} at stage {row.stage!r}: byte counts "
                "and FLOPs must be non-negative")
        self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def total(self, direction: str | None = None, phase: str | None = None) -> dict[str, float]:
        """Totals (messages, bytes, FLOPs, host CPU) over rows matching ``direction``/``phase``."""
        out = {
            "messages": 0.0,
            "plaintext_bytes": 0.0,
            "wire_bytes": 0.0,
            "flops": 0.0,
            "client_cpu_s": 0.0,
            "server_cpu_s": 0.0,
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

    def client_rounds(self) -> int:
        """How many (round, client) pairs exchanged at least one message (clients only:
        the server and the decryptor never count)."""
        return len({(r.round, r.client) for r in self.rows if r.client is not None})

    def summary(self) -> list[dict[str, Any]]:
        """One dict per (phase, direction): messages, bytes, FLOPs, host CPU, and for client
        traffic the mean wire bytes per client per round (None for internal traffic)."""
        keys: dict[tuple[str, str], None] = {}
        for r in self.rows:
            keys[(r.phase, r.direction)] = None
        out = []
        for phase, direction in keys:
            t = self.total(direction=direction, phase=phase)
            per = None
            if direction != "internal":
                n = len({(r.round, r.client) for r in self.rows
                         if r.phase == phase and r.direction == direction})
                per = t["wire_bytes"] / max(1, n)
            out.append({"phase": phase, "direction": direction, **t,
                        "wire_bytes_per_client_round": per})
        return out

    def format_summary(self) -> str:
        """The summary as an aligned text table."""
        rows = self.summary()
        head = (
            f"{'phase':<14}{'dir':<10}{'msgs':>8}{'plain B':>14}{'wire B':>14}"
            f"{'client FLOPs':>14}{'host cpu s':>11}"
        )
        lines = [head, "-" * len(head)]
        for r in rows:
            lines.append(
                f"{r['phase']:<14}{r['direction']:<10}{int(r['messages']):>8}"
                f"{int(r['plaintext_bytes']):>14}{int(r['wire_bytes']):>14}"
                f"{r['flops']:>14.3g}{r['client_cpu_s'] + r['server_cpu_s']:>11.3f}"
            )
        return "\n".join(lines)

    def _dicts(self, profile: HardwareProfile | None = None) -> list[dict[str, Any]]:
        out = []
        for r in self.rows:
            d = asdict(r)
            d["direction"] = r.direction
            if profile is not None:
                est = profile.estimate(r)
                for col in DEVICE_COLUMNS:
                    d[col] = est[col.removeprefix("device_")]
            out.append(d)
        return out

    def to_csv(self, path: str | Path | None = None,
               profile: HardwareProfile | str | None = None) -> str:
        """Write the rows as CSV (``fields`` as a JSON object) and return the text; with a
        ``profile``, add the deterministic device columns (:data:`DEVICE_COLUMNS`)."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        cols = list(_COLUMNS) + (list(DEVICE_COLUMNS) if prof is not None else [])
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for d in self._dicts(prof):
            d["fields"] = json.dumps(d["fields"], sort_keys=True)
            w.writerow({k: d[k] for k in cols})
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

    def estimate(self, profile: HardwareProfile | str) -> dict[str, float]:
        """Deterministic client-side device figures of all rows on ``profile``: totals
        (``flops``, ``compute_s``, ``radio_s``, ``latency_s``, ``energy_j``) and the same
        per client-round (``*_per_client_round``, over clients only)."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        tot = {"flops": 0.0, "compute_s": 0.0, "radio_s": 0.0, "latency_s": 0.0, "energy_j": 0.0}
        for r in self.rows:
            if r.client is None:
                continue
            est = prof.estimate(r)
            tot["flops"] += r.flops
            for k in ("compute_s", "radio_s", "latency_s", "energy_j"):
                tot[k] += est[k]
        n = max(1, self.client_rounds())
        return {**tot, **{f"{k}_per_client_round": v / n for k, v in tot.items()}}


@dataclass(frozen=True)
class HardwareProfile:
    """A client device: link speeds, compute speed and energy figures.

    Attributes:
        name: preset name.
        uplink_bps, downlink_bps: link throughput in bits per second.
        rtt_s: round-trip time added once per message.
        flops_per_s: sustained FLOP rate of the device on the client's work.
        active_power_w: device power while computing (W); energy per FLOP is
            ``active_power_w / flops_per_s``.
        uplink_j_per_byte, downlink_j_per_byte: marginal radio/NIC energy per byte.
        sources: where each figure comes from.
    """

    name: str
    uplink_bps: float
    downlink_bps: float
    rtt_s: float
    flops_per_s: float
    active_power_w: float
    uplink_j_per_byte: float
    downlink_j_per_byte: float
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def j_per_flop(self) -> float:
        """Energy per FLOP (J): active power over the sustained FLOP rate."""
        return self.active_power_w / self.flops_per_s

    def estimate(self, row: CostRow) -> dict[str, float]:
        """Deterministic latency (s) and energy (J) of one message for its client on this
        device: ``compute_s`` = FLOPs / FLOP rate; ``radio_s`` = wire bits / link rate + one
        round trip; energy = FLOPs x J/FLOP + wire bytes x J/byte. Internal rows (no client)
        cost the device nothing."""
        d = row.direction
        if d == "internal":
            return {"compute_s": 0.0, "radio_s": 0.0, "latency_s": 0.0, "energy_j": 0.0}
        compute_s = row.flops / self.flops_per_s
        if d == "up":
            radio_s = row.wire_bytes * 8 / self.uplink_bps + self.rtt_s
            radio_j = row.wire_bytes * self.uplink_j_per_byte
        else:
            radio_s = row.wire_bytes * 8 / self.downlink_bps + self.rtt_s
            radio_j = row.wire_bytes * self.downlink_j_per_byte
        return {
            "compute_s": compute_s,
            "radio_s": radio_s,
            "latency_s": compute_s + radio_s,
            "energy_j": row.flops * self.j_per_flop + radio_j,
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
        # HPL (LINPACK) on a Raspberry Pi 4 B at 1.5 GHz: ~12 GFLOPS over its 4 Cortex-A72
        # cores (Jeff Geerling, geerlingguy/top500-benchmark results, 2021-2023); one
        # core's share, 3 GFLOP/s, since small layers do not scale across cores.
        flops_per_s=3e9,
        # Raspberry Pi 4 B under full CPU load draws ~6.4 W (Tom's Hardware Pi 4 review).
        active_power_w=6.4,
        # Huang et al. 2012 LTE power model: uplink 438 mW per Mbit/s -> 0.438 uJ/bit,
        # downlink 52 mW per Mbit/s -> 0.052 uJ/bit.
        uplink_j_per_byte=8 * 0.438e-6,
        downlink_j_per_byte=8 * 0.052e-6,
        sources={
            "links": "Ookla Speedtest Global Index 2023 (mobile medians)",
            "rtt, radio energy": "Huang et al., MobiSys 2012 (LTE power model)",
            "flops": "HPL on Raspberry Pi 4 B (geerlingguy/top500-benchmark), one core's share",
            "power": "Tom's Hardware Raspberry Pi 4 B review (load power)",
            "crypto": "CRYPTO_CYCLES in secagg/costs.py (reference-core cycle counts)",
        },
    ),
    "phone-wifi": HardwareProfile(
        name="phone-wifi",
        # Ookla Speedtest Global Index (2023): median fixed broadband ~40 up / ~90 down.
        uplink_bps=40e6,
        downlink_bps=90e6,
        # Home Wi-Fi to a cloud region: ~20 ms (Huang et al. 2012 measured Wi-Fi RTTs of
        # the same order).
        rtt_s=0.02,
        # A mid-range 2023 phone big core (Cortex-A78 class, ~2.4 GHz, two 128-bit NEON FMA
        # pipes: 8 double FLOP/cycle peak, Arm Cortex-A78 Software Optimization Guide) at
        # the same quarter-of-peak efficiency as the reference core: ~5 GFLOP/s.
        flops_per_s=5e9,
        # A phone SoC under sustained CPU load: ~3 W (AnandTech SoC power measurements).
        active_power_w=3.0,
        # Huang et al. 2012 Wi-Fi power model: uplink 283 mW per Mbit/s, downlink 137.
        uplink_j_per_byte=8 * 0.283e-6,
        downlink_j_per_byte=8 * 0.137e-6,
        sources={
            "links": "Ookla Speedtest Global Index 2023 (fixed medians)",
            "radio energy": "Huang et al., MobiSys 2012 (Wi-Fi power model)",
            "flops": "Arm Cortex-A78 Software Optimization Guide (NEON FMA throughput)",
            "power": "AnandTech smartphone SoC power measurements",
            "crypto": "CRYPTO_CYCLES in secagg/costs.py (reference-core cycle counts)",
        },
    ),
    "datacenter": HardwareProfile(
        name="datacenter",
        # 10 GbE server NIC; intra-region RTT ~0.5 ms.
        uplink_bps=10e9,
        downlink_bps=10e9,
        rtt_s=0.0005,
        # The reference core: REFERENCE_CLOCK_HZ x REFERENCE_FLOPS_PER_CYCLE = 12 GFLOP/s.
        flops_per_s=REFERENCE_CLOCK_HZ * REFERENCE_FLOPS_PER_CYCLE,
        # Per active core share of a ~300 W two-socket server with ~48 cores: ~6 W/core
        # (SPECpower_ssj2008 published results, 100% load).
        active_power_w=6.0,
        # 10 GbE NIC ~5 W at line rate (Intel X710 datasheet): ~4 nJ per byte.
        uplink_j_per_byte=4e-9,
        downlink_j_per_byte=4e-9,
        sources={
            "links": "10 GbE NIC",
            "flops": "Intel 64 and IA-32 Optimization Reference Manual (AVX2 FMA peak) / 4",
            "power": "SPECpower_ssj2008 results (per-core share)",
            "nic energy": "Intel Ethernet X710 datasheet typical power",
            "crypto": "CRYPTO_CYCLES in secagg/costs.py (reference-core cycle counts)",
        },
    ),
}


def get_profile(name: str) -> HardwareProfile:
    """The preset named ``name`` (see :data:`PROFILES`).

    Raises:
        ConfigurationError: no such preset (the message lists them).
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown device profile {name!r}; choose from {sorted(PROFILES)}"
        ) from None
