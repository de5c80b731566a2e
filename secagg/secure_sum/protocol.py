"""Running one secure-sum session: the clients and the server exchange real bytes.

:func:`run_secure_sum` plays the five stages of Bonawitz et al. (2017), active variant --
advertise keys, share keys, masked input collection, consistency check, unmasking --
between :class:`~secagg.secure_sum.client.Client` objects and a
:class:`~secagg.secure_sum.server.Server`, in one process. At each stage
it asks ``ctx.dropouts.survivors(stage, ...)`` who stays live, books one ledger row per message
with its true wire size and the CPU seconds each side spent on it, and transcripts what the
server saw: each masked vector (form "masked"), then the unmasked sum (form "clear",
what="sum").

A client whose message the server cannot accept (malformed, replayed, misaddressed), or who
cannot accept the server's message, is counted as dropped at that stage; complaints about
shares are judged from their evidence by the server (:mod:`.server`), so one client's lie
excludes only that client -- the run goes on if
enough clients remain, and otherwise raises :class:`~secagg.errors.SecureSumAborted`.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.costs import secure_sum_client_flops
from secagg.errors import ConfigurationError, ProtocolError
from secagg.secure_sum import wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.graph import Graph, GraphKind, build
from secagg.secure_sum.keys import sign_public
from secagg.secure_sum.parties import Call, Deferred, Outcome, parties
from secagg.secure_sum.prg import SeededEntropy
from secagg.secure_sum.server import Server
from secagg.stages import Stage

Tamper = Callable[[str, Any, Any, bytes], bytes | None]
"""Fault injection: (stage, sender, receiver, message) -> the bytes delivered (None: lost)."""


@dataclass
class SessionReport:
    """The outcome of one session.

    Attributes:
        total: the ring sum (uint64, reduced mod 2^ring_bits) of the contributors' vectors.
        contributors: clients whose input is in ``total``.
        graph: the neighbour graph and thresholds used.
        ring_bits: k.
        live: stage -> live clients the server counted when closing it.
        excluded: clients excluded by a complaint's verdict (the accused when the complaint is
            upheld, the complainer when it is false).
        verdicts: (complainer, accused, verdict) for every complaint the server judged
            ("upheld", "false" or "uncommitted key"; :mod:`.server`).
        cut: pairs whose two ends disagreed on their share keys (edge cut, no one excluded).
        cut_off: client -> why the cuts left it too few share holders (dropped at share).
        check_cpu_s: the server's CPU seconds on the complaint machinery (share signatures,
            pair digests, complaint verdicts).
        failures: (stage, client, error text) for every message that could not be processed.
        refused: client -> why the server refused its ADVERTISE (it was left out).
        faults: client -> the lies the server attributed to it from evidence, one party per
            lie (a masked input whose integrity tag does not verify: refused, the client
            counted as dropped; a seed commitment its own shares contradict: named, its
            decoded seed used; a share returned at unmask that contradicts its dealer's
            signed digest: the holder, none of its shares used; a share that matches the
            dealer's signed digest but that the decoder corrected: the dealer, named and
            corrected, its input still in the sum; see :mod:`.server`).
        pinned: whether the clients checked keys and signatures against pinned keys (the
            run then resists an actively malicious server; see :mod:`.client`).
        bytes_up, bytes_down: wire bytes per client, sent and received.
        client_cpu_s: CPU seconds per client; server_cpu_s: the server's total.
    """

    total: np.ndarray
    contributors: tuple[int, ...]
    graph: Graph
    ring_bits: int
    live: dict[str, int]
    excluded: tuple[int, ...]
    failures: list[tuple[str, int, str]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    pinned: bool = False
    bytes_up: dict[int, int] = field(default_factory=dict)
    bytes_down: dict[int, int] = field(default_factory=dict)
    client_cpu_s: dict[int, float] = field(default_factory=dict)
    server_cpu_s: float = 0.0
    verdicts: list[tuple[int, int, str]] = field(default_factory=list)
    cut: tuple[tuple[int, int], ...] = ()
    cut_off: dict[int, str] = field(default_factory=dict)
    check_cpu_s: dict[str, float] = field(default_factory=dict)
    faults: dict[int, str] = field(default_factory=dict)


def _flat(vector: Any) -> Any:
    """A client's vector as one 1-D array, or a :class:`Deferred` one as it is (the client's
    process computes it: :mod:`secagg.secure_sum.parties`)."""
    return vector if isinstance(vector, Deferred) else np.asarray(vector).reshape(-1)


def run_secure_sum(
    vectors: Mapping[int, np.ndarray],
    ring_bits: int,
    ctx: Any,
    *,
    threshold: float | int = 0.7,
    graph: GraphKind = "complete",
    k: int | None = None,
    label: str = Stage.UPLOAD,
    segments: Mapping[str, slice] | None = None,
    length: int | None = None,
    plaintext_bytes: int = 0,
    fields: Mapping[str, int] | None = None,
    upload_costs: Mapping[int, tuple[float, float]] | None = None,
    graph_seed: int | None = None,
    entropy_seed: int | None = None,
    tamper: Tamper | None = None,
    identities: Mapping[int, Ed25519PrivateKey] | None = None,
    workers: int = 1,
) -> SessionReport:
    """Run one secure-sum session over already-encoded vectors.

    Args:
        vectors: client id -> 1-D array of ring elements (uint64 < 2^ring_bits), all of one
            length, or a :class:`~secagg.secure_sum.parties.Deferred` that the client's own
            process turns into one (then pass ``length``). A lazy mapping is fine: each
            vector is read once, when its client masks.
            Reading it is not timed here: a client's work for it belongs in
            ``upload_costs``.
        ring_bits: k in 1..64; arithmetic is modulo 2^k.
        ctx: a :class:`secagg.layers.base.RoundContext` (dropouts, ledger, transcript).
        threshold: fraction of the cohort (float) or count (int) that must stay live.
        graph: "complete", "harary" (SecAgg+) or "auto".
        k: the Harary degree (None: chosen for the cohort size).
        label: the transcript field name when ``segments`` is None.
        segments: field name -> slice of the vector, to transcript each field separately.
        length: the vector length (None: read from the first vector).
        plaintext_bytes, fields: what the MASKED rows carry in plaintext terms (ledger).
        upload_costs: client -> (CPU seconds, FLOPs) of computing its vector (its step, the
            encoding, any noise), added to its MASKED row; read after the vector, so a lazy
            ``vectors`` may fill it as it goes.
        graph_seed: seeds the SecAgg+ relabelling (experiments); None uses the OS CSPRNG.
        entropy_seed: makes every party's randomness (keys, seeds, Shamir coefficients,
            session id) a deterministic function of this seed -- for reproducible experiments
            and tests only; None (the default) uses the OS CSPRNG.
        tamper: fault injection on every delivered message (tests).
        identities: client -> its long-term Ed25519 key (simulated clients' private keys);
            every client then pins all the cohort's public keys and checks the roster's keys
            and the consistency signatures against them. None: per-session keys, nothing
            pinned (secure against an honest-but-curious server only).
        workers: processes the simulated clients' work is spread over
            (:mod:`secagg.secure_sum.parties`; 1: all in this process). The messages and
            the sum do not depend on it.

    Raises:
        SecureSumAborted: fewer than the threshold stayed live at some stage.
    """
    cohort = sorted(int(u) for u in vectors)
    if any(not 0 <= u <= wire.MAX_ID for u in cohort):
        raise ConfigurationError(f"client ids must be in 0..{wire.MAX_ID}")
    if not 1 <= ring_bits <= 64:
        raise ConfigurationError(f"ring_bits must be in 1..64, got {ring_bits}")
    if length is None:
        first = vectors[cohort[0]] if cohort else np.zeros(0)
        if isinstance(first, Deferred):
            raise ConfigurationError("vectors computed in the clients' processes (Deferred) "
                                     "need the vector length: pass length")
        length = int(np.asarray(first).size)
    g = build(cohort, threshold, graph, k, graph_seed)
    if entropy_seed is None:
        session = secrets.token_bytes(wire.SESSION_BYTES)

        def entropy_of(u: int) -> Callable[[int], bytes]:
            return os.urandom
    else:
        session = SeededEntropy(entropy_seed, "session")(wire.SESSION_BYTES)

        def entropy_of(u: int) -> Callable[[int], bytes]:
            return SeededEntropy(entropy_seed, u)
    rnd = int(ctx.round)
    pins = None
    if identities is not None:
        missing = [u for u in cohort if u not in identities]
        if missing:
            raise ConfigurationError(
                f"identities: clients {missing[:5]} have no Ed25519 key; pinning needs one for "
                "every client of the cohort"
            )
        pins = {u: sign_public(identities[u]) for u in cohort}
    server = Server(session, rnd, g, ring_bits, length, forward_all_signatures=pins is not None,
                    pinned=pins)
    segs = dict(segments) if segments is not None else {label: slice(0, length)}
    report = SessionReport(np.zeros(0, np.uint64), (), g, ring_bits, server.live, (),
                           refused=server.refused, pinned=pins is not None)
    up = report.bytes_up
    down = report.bytes_down
    cpu = report.client_cpu_s
    server_cpu = [0.0]
    deliver = tamper or (lambda stage, s, r, m: m)

    def stepped(outcomes: Iterator[Outcome]) -> Iterator[tuple[int, bytes, float]]:
        """The clients' outcomes of this stage: CPU booked, failures recorded; yields
        (client, message, CPU seconds) for those that sent one."""
        for u, out, dt, err in outcomes:
            cpu[u] = cpu.get(u, 0.0) + dt
            if err is not None:
                report.failures.append((stage, u, err))
            elif out is not None:
                yield u, out, dt

    def replies(inbox: Mapping[int, bytes | None]) -> Iterator[Call]:
        """(client, the message it got) for the clients still live at this stage."""
        return ((u, inbox[u]) for u in ctx.dropouts.survivors(stage, sorted(inbox))
                if inbox[u] is not None)

    def to_server(u: int, msg: bytes, handler: Callable[[bytes], Any], dt_client: float,
                  **row: Any) -> Any:
        got = deliver(stage, u, "server", msg)
        t0 = time.thread_time()
        result = None
        if got is not None:
            try:
                result = handler(got)
            except ProtocolError as exc:
                report.failures.append((stage, u, str(exc)))
                result = None
        dt = time.thread_time() - t0
        server_cpu[0] += dt
        up[u] = up.get(u, 0) + len(msg)
        ctx.message(u, "server", stage, msg, client_cpu_s=dt_client, server_cpu_s=dt, **row)
        return result

    def to_clients(msgs: dict[int, bytes], close_dt: float) -> dict[int, bytes | None]:
        share = close_dt / max(len(msgs), 1)
        out = {}
        for v, m in msgs.items():
            down[v] = down.get(v, 0) + len(m)
            ctx.message("server", v, stage, m, server_cpu_s=share)
            out[v] = deliver(stage, "server", v, m)
        return out

    def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.thread_time()
        try:
            return fn(), time.thread_time() - t0
        finally:
            server_cpu[0] += time.thread_time() - t0

    # ---- stage 1: advertise keys
    stage = Stage.ADVERTISE
    clients = {u: Client(u, session, rnd, entropy_of(u), threshold=g.threshold, length=length,
                         ring_bits=ring_bits, pinned=pins,
                         min_holders=g.threshold if g.kind == "complete" else None,
                         signing=identities[u] if identities is not None else None)
               for u in cohort}
    party = parties(clients, workers)
    try:
        calls = ((u, None) for u in ctx.dropouts.survivors(stage, cohort))
        for u, msg, dt in stepped(party.run(Stage.ADVERTISE, calls)):
            to_server(u, msg, server.receive_advertise, dt,
                      flops=secure_sum_client_flops(stage, len(g.neighbours[u])))
        rosters, dt_close = timed(server.close_advertise)

        # ---- stage 2: share keys
        stage = Stage.SHARE
        inbox = to_clients(rosters, dt_close)
        for u, msg, dt in stepped(party.run("share_keys", replies(inbox))):
            to_server(u, msg, server.receive_shares, dt, flops=secure_sum_client_flops(
                stage, len(g.neighbours[u]), g.share_threshold))
        forwards, dt_close = timed(server.close_shares)

        # ---- stage 3: masked input collection (ACK of the forwarded shares, then the vector)
        stage = Stage.MASKED_INPUT
        inbox = to_clients(forwards, dt_close)
        live3 = []
        for u, msg, dt in stepped(party.run("receive_forward", replies(inbox))):
            if to_server(u, msg, server.receive_ack, dt, flops=(
                    secure_sum_client_flops("ack", len(g.neighbours[u])))) is not None:
                live3.append(u)
        word_bytes = (ring_bits + 7) // 8
        costs = upload_costs if upload_costs is not None else {}  # may fill as vectors are read
        # each vector is read here when its client's turn comes (a streamed upload is computed
        # then); the client's work for it (its step, encoding, noise) is in ``costs``
        vecs = ((u, _flat(vectors[u])) for u in live3)
        for u, msg, dt in stepped(party.run("masked_input", vecs, batch=16)):
            extra_cpu, flops = costs.get(u, (0.0, 0.0))
            cpu[u] += extra_cpu
            got = to_server(u, msg, server.receive_masked, dt + extra_cpu,
                            plaintext_bytes=plaintext_bytes, fields=dict(fields or {}),
                            step_flops=flops, flops=flops + secure_sum_client_flops(
                                "masked", len(g.neighbours[u]),
                                vector_bytes=length * word_bytes, word_bytes=word_bytes))
            if got is not None:
                _, y = got
                for name, sl in segs.items():
                    part = y[sl]
                    ctx.observe("server", u, stage, name, "masked", part,
                                nbytes=int(part.size) * word_bytes)
        survivors, dt_close = timed(server.close_masked)

        # ---- stage 4: consistency check (each survivor signs the survivor set it was shown)
        stage = Stage.CONSISTENCY
        inbox = to_clients(survivors, dt_close)
        for u, msg, dt in stepped(party.run("sign_survivors", replies(inbox))):
            to_server(u, msg, server.receive_signature, dt)
        requests, dt_close = timed(server.close_consistency)

        # ---- stage 5: unmasking
        stage = Stage.UNMASK
        inbox = to_clients(requests, dt_close)
        for u, msg, dt in stepped(party.run(Stage.UNMASK, replies(inbox))):
            to_server(u, msg, server.receive_unmask, dt)
    finally:
        party.close()
    (total, contributors), _ = timed(server.finish)
    for name, sl in segs.items():
        part = total[sl]
        ctx.observe("server", "server", stage, name, "clear", part, what="sum",
                    nbytes=int(part.size) * word_bytes)
    report.total = total
    report.contributors = contributors
    report.excluded = tuple(sorted(server.excluded))
    report.server_cpu_s = server_cpu[0]
    report.verdicts = list(server.verdicts)
    report.cut = tuple(sorted(server.cut))
    report.cut_off = dict(server.cut_off)
    report.check_cpu_s = dict(server.check_cpu_s)
    report.faults = dict(server.faults)
    return report
