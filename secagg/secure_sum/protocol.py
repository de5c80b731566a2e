"""Running one secure-sum session in one process: a thin facade over the one driver.

:func:`run_secure_sum` runs the five stages of Bonawitz et al. (2017), active variant --
advertise keys, share keys, masked input collection, consistency check, unmasking -- with
the same server-side driver that runs them over Flower
(:meth:`~secagg.secure_sum.remote.SecureSumServer.session`), over an in-process link whose
nodes are :class:`~secagg.secure_sum.client.Client` objects holding the given vectors
(kept live, never frozen between stages; in this process or in forked workers,
:mod:`~secagg.secure_sum.parties`). The driver applies ``ctx.dropouts`` at each stage,
books one ledger row per message with its true wire size and the CPU seconds each side
spent on it, and transcripts what the server saw: each masked vector (form "masked"), then
the unmasked sum (form "clear", what="sum").

A client whose message the server cannot accept (malformed, replayed, misaddressed), or who
cannot accept the server's message, is counted as dropped at that stage; complaints about
shares are judged from their evidence by the server (:mod:`.server`), so one client's lie
excludes only that client -- the run goes on if
enough clients remain, and otherwise raises :class:`~secagg.errors.SecureSumAborted`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.errors import ConfigurationError, ProtocolError
from secagg.link import Reply
from secagg.secure_sum import wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.graph import Graph, GraphKind, build
from secagg.secure_sum.keys import sign_public
from secagg.secure_sum.parties import Deferred, Forked, Inline, Outcome, parties
from secagg.secure_sum.prg import SeededEntropy
from secagg.secure_sum.remote import SecureSumServer
from secagg.stages import Key, Stage

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
        notes: the driver's aggregate notes (``secure_sum``: ring, graph, live counts,
            verdicts, cut, faults...; ``dropped``: stage -> client -> why), as on Flower.
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
    notes: dict[str, Any] = field(default_factory=dict)


def _flat(vector: Any) -> Any:
    """A client's vector as one 1-D array, or a :class:`Deferred` one as it is (the client's
    process computes it: :mod:`secagg.secure_sum.parties`)."""
    return vector if isinstance(vector, Deferred) else np.asarray(vector).reshape(-1)


#: the Client method that answers each protocol stage (masked input: the ACK first)
_METHOD = {Stage.ADVERTISE: Client.advertise.__name__, Stage.SHARE: Client.share_keys.__name__,
           Stage.MASKED_INPUT: Client.receive_forward.__name__,
           Stage.CONSISTENCY: Client.sign_survivors.__name__,
           Stage.UNMASK: Client.unmask.__name__}
_ORDER = tuple(_METHOD)

Answer = tuple[int, "Reply | ProtocolError"]
"""(client, its reply, or the ProtocolError that stands for it)."""


class _VectorNodes:
    """The clients of one :func:`run_secure_sum` call as the nodes of a
    :class:`~secagg.link.Link`: each a live :class:`Client` (in this process or a forked
    worker) answering the driver's instructions, with its vector read when it masks, and
    ``tamper`` on every message's bytes (sender ``"server"`` for an instruction, receiver
    ``"server"`` for a reply). The replies of a stage are computed when the driver reads
    them (those the run's dropouts keep are computed ahead, spread over the workers), so a
    dropped client does no work; a masked vector is computed when the driver reads it,
    after every ACK, one at a time."""

    def __init__(self, cohort: list[int], make: Callable[[int, bytes], Client],
                 vectors: Mapping[int, Any], workers: int, tamper: Tamper | None) -> None:
        self._cohort = tuple(cohort)
        self._make, self._vectors, self._workers = make, vectors, workers
        self._deliver: Tamper = tamper or (lambda stage, s, r, m: m)
        self.party: Inline | Forked | None = None
        self.failures: list[tuple[str, int, str]] = []
        self.up: dict[int, int] = {}
        self.down: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self._open: _Replies | None = None  # the stage whose calls may still be in flight
        self._acked: list[int] = []  # clients that sent an ACK, in order
        self._masked: Iterator[Outcome] | None = None
        self._masked_done: dict[int, Outcome] = {}

    @property
    def clients(self) -> tuple[int, ...]:
        """The cohort."""
        return self._cohort

    def count(self, stage: str, nbytes: int) -> None:
        """Nothing to count (the report's bytes are per client)."""

    def lost(self, dropped: Mapping[str, Mapping[int, str]]) -> None:
        """Nothing to do (the driver's notes name the drops)."""

    def reached(self, ctx: Any, stage: str) -> None:
        """Nothing to do."""

    def close(self) -> None:
        """End the workers (they hold the session's secrets)."""
        if self.party is not None:
            self.party.close()

    def exchange(self, stage: str, ctx: Any, instructions: Mapping[int, Mapping[str, Any]],
                 *, needs: Any = (), step: bool = False,
                 ) -> tuple[Mapping[int, Reply], dict[int, str]]:
        """Deliver each instruction's message; the replies are computed when read."""
        failed: dict[int, str] = {}
        inbox: dict[int, Any] = {}
        for c, ins in instructions.items():
            msg = ins.get(Key.MSG)
            if msg is not None:
                self.down[c] = self.down.get(c, 0) + len(msg)
                msg = self._deliver(stage, "server", c, msg)
                if msg is None:
                    failed[c] = "instruction lost"
                    continue
            inbox[c] = msg
        if stage == Stage.ADVERTISE:
            self.party = parties({c: self._make(c, instructions[c][Key.SESSION])
                                  for c in inbox}, self._workers)
        self._drain()
        self._open = _Replies(self, stage, inbox, ctx.dropouts.survivors(stage, sorted(inbox)))
        return self._open, failed

    def _drain(self) -> None:
        if self._open is not None:
            self._open.drain()
            self._open = None

    def answers(self, stage: str, ids: list[int], inbox: Mapping[int, Any]
                ) -> Iterator[Answer]:
        """The replies of ``ids`` to their stage-``stage`` messages, in order."""
        assert self.party is not None
        calls = ((u, inbox[u]) for u in ids)
        for u, out, dt, err in self.party.run(_METHOD[stage], calls):
            self.cpu[u] = self.cpu.get(u, 0.0) + dt
            if err is not None:
                self.failures.append((stage, u, err))
                yield u, ProtocolError(err)
                continue
            assert out is not None
            self.up[u] = self.up.get(u, 0) + len(out)
            got = self._deliver(stage, u, "server", out)
            if got is None:
                yield u, ProtocolError(f"client {u}'s {stage} message lost")
            elif stage == Stage.ADVERTISE:  # its step (the vector) is read when it masks
                yield u, {Key.MSG: got, Key.CPU_S: dt, Key.STEP_CPU_S: 0.0, Key.FLOPS: 0.0,
                          Key.CLIPPED: "{}"}
            elif stage == Stage.MASKED_INPUT:
                self._acked.append(u)
                yield u, _Masked(self, u, {Key.ACK: got, Key.ACK_CPU_S: dt})
            else:
                yield u, {Key.MSG: got, Key.CPU_S: dt}

    def masked(self, u: int) -> dict[str, Any]:
        """Client ``u``'s masked vector (its vector read now), as delivered.

        Raises:
            ProtocolError: the client failed to mask, or its message was lost.
        """
        if self._masked is None:
            assert self.party is not None
            self._drain()  # every ACK is in: one batch of calls in flight at a time
            vecs = ((v, _flat(self._vectors[v])) for v in self._acked)
            self._masked = self.party.run("masked_input", vecs, batch=16)
        while u not in self._masked_done:
            out = next(self._masked, None)
            if out is None:
                raise ProtocolError(f"client {u} was not asked to mask")
            self._masked_done[out[0]] = out
        _, msg, dt, err = self._masked_done.pop(u)
        stage = Stage.MASKED_INPUT
        self.cpu[u] = self.cpu.get(u, 0.0) + dt
        if err is not None:
            self.failures.append((stage, u, err))
            raise ProtocolError(err)
        assert msg is not None
        self.up[u] = self.up.get(u, 0) + len(msg)
        got = self._deliver(stage, u, "server", msg)
        if got is None:
            raise ProtocolError(f"client {u}'s masked vector lost")
        return {Key.MSG: got, Key.CPU_S: dt}


class _Replies(Mapping[int, Reply]):
    """A stage's replies, each computed when first read and not kept after (those of the
    ``ahead`` clients -- the ones the dropouts keep -- computed in one pass, spread over the
    workers; any other alone)."""

    def __init__(self, link: _VectorNodes, stage: str, inbox: dict[int, Any],
                 ahead: list[int]) -> None:
        self._link, self._stage, self._inbox = link, stage, inbox
        self._pending: Iterator[Answer] | None = link.answers(stage, ahead, inbox)
        self._ready: dict[int, Any] = {}

    def drain(self) -> None:
        """Finish the pass in flight (its replies kept for reading)."""
        if self._pending is not None:
            self._ready.update(self._pending)
            self._pending = None

    def __getitem__(self, u: int) -> Reply:
        if u not in self._inbox:
            raise KeyError(u)
        while u not in self._ready and self._pending is not None:
            nxt = next(self._pending, None)
            if nxt is None:
                self._pending = None
            else:
                self._ready[nxt[0]] = nxt[1]
        if u not in self._ready:
            self._link._drain()
            self._ready.update(self._link.answers(self._stage, [u], self._inbox))
        rep = self._ready.pop(u)
        if isinstance(rep, ProtocolError):
            raise rep
        return rep

    def __contains__(self, u: object) -> bool:
        return u in self._inbox

    def __iter__(self) -> Iterator[int]:
        return iter(self._inbox)

    def __len__(self) -> int:
        return len(self._inbox)


class _Masked(Mapping[str, Any]):
    """A masked-input reply: its ACK now, its masked vector when that is read (once)."""

    def __init__(self, link: _VectorNodes, u: int, ack: dict[str, Any]) -> None:
        self._link, self._u, self._fields = link, u, ack
        self._late = False

    def __getitem__(self, name: str) -> Any:
        if name in (Key.MSG, Key.CPU_S) and not self._late:
            self._late = True
            self._fields.update(self._link.masked(self._u))
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter((Key.ACK, Key.ACK_CPU_S, Key.MSG, Key.CPU_S))

    def __len__(self) -> int:
        return 4


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
    """Run one secure-sum session over already-encoded vectors, with the one server driver
    (:meth:`~secagg.secure_sum.remote.SecureSumServer.session`) over an in-process link.

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
        identities: client id -> its long-term Ed25519 key (simulated clients' private keys);
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
    pins = None
    if identities is not None:
        missing = [u for u in cohort if u not in identities]
        if missing:
            raise ConfigurationError(
                f"identities: clients {missing[:5]} have no Ed25519 key; pinning needs one for "
                "every client of the cohort"
            )
        pins = {u: sign_public(identities[u]) for u in cohort}
    rnd = int(ctx.round)

    def make(u: int, session: bytes) -> Client:
        entropy = os.urandom if entropy_seed is None else SeededEntropy(entropy_seed, u)
        return Client(u, session, rnd, entropy, threshold=g.threshold, length=length,
                      ring_bits=ring_bits, pinned=pins,
                      min_holders=g.threshold if g.kind == "complete" else None,
                      signing=identities[u] if identities is not None else None)

    params = SimpleNamespace(threshold=threshold, graph=graph, k=k, precision=None,
                             ring_bits=ring_bits)
    driver = SecureSumServer(layer=params, pinned=pins, drop_rows=False,
                             clients_pin=pins is not None,  # every client here pins them
                             entropy=None if entropy_seed is None
                             else SeededEntropy(entropy_seed, "session"))
    segs = dict(segments) if segments is not None else {label: slice(0, length)}
    link = _VectorNodes(cohort, make, vectors, workers, tamper)
    try:
        out = driver.session(link, ctx, cohort, g, ring_bits, segs, dict(fields or {}),
                             late_costs=upload_costs, plaintext_bytes=plaintext_bytes,
                             length=length)
    finally:
        link.close()
    server = out.server
    refusals = [(st, u, why[len("refused: "):]) for st, per in out.notes["dropped"].items()
                for u, why in per.items() if why.startswith("refused: ")]
    failures = sorted(link.failures + refusals, key=lambda f: _ORDER.index(f[0]))
    cpu = dict(link.cpu)
    for u, (extra, _) in (upload_costs or {}).items():
        if u in cpu:
            cpu[u] += extra
    return SessionReport(
        out.total, out.contributors, g, ring_bits, server.live, tuple(sorted(server.excluded)),
        failures=failures, refused=server.refused, pinned=pins is not None,
        bytes_up=link.up, bytes_down=link.down, client_cpu_s=cpu,
        server_cpu_s=out.server_cpu_s, verdicts=list(server.verdicts),
        cut=tuple(sorted(server.cut)), cut_off=dict(server.cut_off),
        check_cpu_s=dict(server.check_cpu_s), faults=dict(server.faults), notes=out.notes)
