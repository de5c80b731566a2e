"""The SecureSum layer's one server-side driver, over any link.

:class:`SecureSumServer` drives one secure-sum session per phase over a
:class:`~secagg.link.Link` -- advertise, share, masked input, consistency, unmask -- around
the :class:`~secagg.secure_sum.server.Server` state machine (constructed here only): over
Flower each client's part runs on its own node and every message crosses the link; in one
process :func:`~secagg.secure_sum.protocol.run_secure_sum` runs :meth:`SecureSumServer.session`
over a link of live in-process clients (seeded entropy, pinned identities and tamper hooks
included).

Each session starts at its share stage: its ADVERTISE (fresh keys for its own session id
and round) travels with the previous exchange -- the runtime's hello for the run's first
session (:meth:`SecureSumServer.hello`), the previous session's unmask for the others --
and its client step with its share instruction, so a session costs four exchanges instead
of five over a transport where every exchange costs seconds. A node whose unmask reply is
lost has therefore not advertised for the next session and drops out of it at
``advertise``. (When the cohort turns out other than announced, e.g. a node missed the
hello, the session advertises afresh.)

A node's complaints about the shares forwarded to it travel inside its ACK (the revealed key
and commitment per accused sender) and the server state machine judges them from that
evidence, exactly as in the embedded run: a lying node excludes only itself. The verdicts,
the cut pairs and the nodes the cuts cut off are in the aggregate's notes
(``secure_sum.verdicts`` / ``cut`` / ``cut_off``), and so are the lies the server attributed
(``faults``, one node per lie: a masked input whose integrity tag fails, refused and its node
dropped; a seed commitment its own shares contradict; an unmask reply whose share contradicts
its dealer's signed digest, the replying node; a share its dealer signed and dealt wrong,
which the Reed-Solomon decoding corrected, the dealer).

A wrapping layer may have the nodes encode their vectors themselves (its server part's
:class:`~secagg.layers.base.RingEncoding`, e.g. DistributedDP's noise shares added before
masking): the session then sums those vectors and hands the ring sum to the wrapper's
server part, which decodes it. The session never learns what wraps it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from secagg.costs import SERVER, secure_sum_client_flops
from secagg.errors import ProtocolError
from secagg.layers.base import Aggregate
from secagg.link import (
    PROTOCOL_REPLY,
    STEP_REPLY,
    Dropped,
    Link,
    Needs,
    PhaseCall,
    Reply,
    add_clips,
    book_drops,
    keep_live,
    malformed,
    only,
)
from secagg.link import reply_field as rfield
from secagg.messages import ClipReport
from secagg.secure_sum import wire as ss_wire
from secagg.secure_sum.graph import Graph, build
from secagg.secure_sum.server import Server
from secagg.stages import Key, Stage

# what a reply carries that advertised ahead for the next session
_ADVERT_REPLY: Needs = ((Key.NEXT_MSG, bytes), (Key.NEXT_CPU_S, float))


@dataclass
class _PreAdvertised:
    """The next secure-sum session's ADVERTISE, collected during the current session's
    unmask exchange (or the hello): its (round, phase), session id, cohort, and per node
    either (ADVERTISE bytes, the node's CPU seconds) or why it has none."""

    round: int
    phase: str
    session: bytes
    cohort: tuple[int, ...]
    adverts: dict[int, tuple[bytes, float]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)

    def take(self, client: int, rec: Reply) -> None:
        """Keep ``client``'s ADVERTISE from its reply ``rec`` (or why it has none)."""
        if (bad := malformed(rec, _ADVERT_REPLY)) is not None:
            self.failed[client] = bad
        else:
            self.adverts[client] = (rfield(rec, Key.NEXT_MSG, bytes),
                                    rfield(rec, Key.NEXT_CPU_S, float))


class SecureSumServer:
    """SecureSum's server side over a :class:`~secagg.link.Link` (a
    :class:`~secagg.link.LayerServer`); see the module docstring.

    Args:
        layer: the SecureSum layer (its ``identities``, private keys, never run here: a
            node holds its own key, and its peers' public keys, from its node config), or
            any object with its ``threshold``, ``graph``, ``k``, ``precision``,
            ``ring_bits`` (and ``layout`` / ``degree`` when :meth:`aggregate` is used).
        pinned: client id -> its pinned Ed25519 public key (32 bytes), the operator's copy
            of the keys the nodes pin (``FlowerFederation(pinned_keys=...)``). With them the
            server refuses an ADVERTISE signed by any other key (so one client advertising
            an unpinned key excludes only itself, where every pinned node would otherwise
            refuse the whole roster) and forwards every consistency signature, so a node
            can count the distinct pinned signers of the survivor set on any graph.
        entropy: where session ids come from (default: the OS CSPRNG;
            :func:`~secagg.secure_sum.protocol.run_secure_sum` passes a seeded stream for
            reproducible experiments).
        drop_rows: book a zero-byte ``dropped:<stage>`` ledger row per dropped client (as
            the runtimes do); :func:`~secagg.secure_sum.protocol.run_secure_sum`, whose
            ledger books one row per message sent, passes False (the drops stay in the
            notes).
        clients_pin: the clients were given the pinned keys by this process (the aggregate's
            ``server_model`` then claims the active server outright; otherwise it names the
            assumption that every node pins them).
    """

    #: whether the embedded engine runs this driver too (not yet over a LocalLink: in one
    #: process the layer's ``aggregate`` runs it through run_secure_sum's in-process link)
    local: ClassVar[bool] = False

    def __init__(self, *, layer: Any, pinned: Mapping[int, bytes] | None = None,
                 entropy: Callable[[int], bytes] | None = None, drop_rows: bool = True,
                 clients_pin: bool = False) -> None:
        self.layer = layer
        self.clients_pin = clients_pin
        self.drop_rows = drop_rows
        self.pinned = dict(pinned) if pinned is not None else None
        self._entropy = entropy if entropy is not None else secrets.token_bytes
        self._ahead: _PreAdvertised | None = None  # the first session's, on the hello
        self._pre: _PreAdvertised | None = None  # the next session's, advertised ahead

    def _server_model(self) -> str:
        """The server the session's privacy claim holds against. Only the clients' own pins
        resist a server that substitutes keys: with ``clients_pin`` (the clients here were
        given the pinned keys: :func:`~secagg.secure_sum.protocol.run_secure_sum`) the claim
        is the active server; with only the operator's copy (``pinned``) it names the
        assumption that every node pins the same keys, which this server cannot check."""
        if self.pinned is None:
            return "honest-but-curious"
        if self.clients_pin:
            return "active (pinned keys)"
        return "active, if every node pins these keys (the operator's copy is pinned here)"

    def params(self) -> str:
        """What a node needs to rebuild the SecureSum layer, as JSON (its identity keys, if
        any, never travel)."""
        return json.dumps({k: getattr(self.layer, k, None) for k in ("threshold", "graph", "k",
                                                               "precision", "ring_bits")})

    def hello(self, round: int, phase: str, n: int) -> dict[str, Any]:
        """The hello asks every node to advertise for the run's first session, sized for a
        cohort of ``n``."""
        self._ahead = _PreAdvertised(round, phase, self._entropy(ss_wire.SESSION_BYTES), ())
        return dict(next_session=self._ahead.session, next_round=round, next_n=n,
                    next_layer=self.params())

    def greeted(self, client: int, reply: Reply) -> None:
        """Keep the node's ADVERTISE for the first session."""
        if self._ahead is not None:
            self._ahead.take(client, reply)

    def start(self, cohort: Sequence[int], announced: int) -> None:
        """The first session uses the hello's ADVERTISEs when its cohort is the size the
        hello announced (else it advertises afresh)."""
        ahead, self._ahead, self._pre = self._ahead, None, None
        if ahead is not None and len(cohort) == announced:
            ahead.cohort = tuple(cohort)
            ahead.failed = {c: why for c, why in ahead.failed.items() if c in ahead.cohort}
            ahead.adverts = {c: a for c, a in ahead.adverts.items() if c in ahead.cohort}
            self._pre = ahead

    def aggregate(self, call: PhaseCall, link: Link) -> Aggregate:
        """One session and its decoding: the layer's fixed-point plan, or, when the wrapping
        layer's server part has the nodes encode for it (its ``encoding``), the ring sum
        handed to that part to decode."""
        rel, cohort = call.release, call.cohort
        enc = rel.encoding
        if enc is None:
            plans, bits, segments, fields = self.layer.layout(rel.carried, len(cohort))
        else:
            plans, bits, segments, fields = {}, enc.ring_bits, enc.segments, dict(enc.nbytes)
        layer = self.layer
        g = build(cohort, layer.threshold, layer.graph, layer.degree(len(cohort)), None)
        out = self.session(link, rel.ctx, cohort, g, bits, segments, fields, clips=call.clips,
                           common=call.instruction, wire=call.broadcast,
                           upcoming=call.upcoming)
        total, contributors, notes = out.total, out.contributors, out.notes
        ctx = call.ctx
        if enc is not None:
            agg = rel.finish(total, contributors, ctx)
            agg.notes.update(notes)
            return agg
        sums = {f.name: plans[f.name].decode_sum(total[segments[f.name]]).reshape(f.shape)
                for f in rel.carried.additive}
        notes["secure_sum"]["scale_bits"] = {n: p.scale_bits for n, p in plans.items()}
        return Aggregate(ctx.phase, ctx.round, sums, {}, contributors, notes)

    def session(self, link: Link, ctx: Any, cohort: Sequence[int], g: Graph, bits: int,
                segments: Mapping[str, slice], fields: Mapping[str, int], *,
                clips: ClipReport | None = None, common: Mapping[str, Any] | None = None,
                wire: bytes = b"", upcoming: Callable[[], Any] = lambda: None,
                late_costs: Mapping[int, tuple[float, float]] | None = None,
                plaintext_bytes: int | None = None, length: int | None = None,
                ) -> SessionOutcome:
        """One SecureSum session over ``link``, on the neighbour graph ``g``: five exchanges,
        or four when the previous session's unmask exchange carried this one's ADVERTISE
        (``upcoming`` names the phase after this one, to advertise for in stage 5); the
        client step then rides on the share instruction instead of the advertise one.

        The nodes' vectors are ``bits``-bit ring elements, one slice per field
        (``segments``; ``fields``: plaintext bytes per field, booked on the masked rows as
        ``plaintext_bytes``, by default their sum; ``length``: the vector length, by default
        the segments' total). ``common``: the fields every client-step
        instruction carries; ``wire``: the packed broadcast (counted on the link);
        ``clips``: the run's clip counts, added to from the step replies; ``late_costs``:
        client -> (CPU seconds, FLOPs) of work done for its vector when it was read (an
        in-process link reads it at masked input), read after its masked reply.

        Every reply is read once. A reply whose reading raises ProtocolError (a lazy
        in-process link's node step that failed) drops its client at that stage, as a
        reply that never came does."""
        cohort = list(cohort)
        common = dict(common or {})
        params = self.params()
        dropped: Dropped = {}
        word = (bits + 7) // 8
        off = sum(sl.stop - sl.start for sl in segments.values()) if length is None \
            else int(length)
        server_cpu = [0.0]
        pre, self._pre = self._pre, None
        if pre is not None and (pre.round, pre.phase, pre.cohort) != (
                ctx.round, ctx.phase, tuple(cohort)):
            pre = None  # not this session's (the nodes' parties are replaced below)

        def to_server(u: int, stage: str, msg: bytes, handler: Callable[[bytes], Any],
                      cpu: float, **row: Any) -> Any:
            t0 = time.process_time()
            try:
                out = handler(msg)
            except ProtocolError as exc:
                dropped.setdefault(stage, {})[u] = f"refused: {exc}"
                out = None
            dt = time.process_time() - t0
            server_cpu[0] += dt
            ctx.message(u, SERVER, stage, msg, client_cpu_s=cpu, server_cpu_s=dt, **row)
            link.count(stage, len(msg))
            return out

        def read(stage: str, u: int, get: Callable[..., Any], *args: Any) -> Any:
            """``get(*args)`` -- ``u``'s reply or a field of it, which a lazy in-process link
            computes now -- or None, ``u`` booked as dropped, when that raises ProtocolError."""
            try:
                return get(*args)
            except ProtocolError as exc:
                book_drops(link, ctx, stage, {u: f"ProtocolError: {exc}"}, dropped,
                           rows=self.drop_rows)
                return None

        def deliver(stage: str, got: Mapping[int, Any], handler: Callable[[bytes], Any],
                    flops: Callable[[int], float] = lambda u: 0.0) -> None:
            """Hand each reply's protocol message to the server, booked as it arrives."""
            for u in got:
                rec = read(stage, u, got.__getitem__, u)
                if rec is not None:
                    to_server(u, stage, rfield(rec, Key.MSG, bytes), handler,
                              rfield(rec, Key.CPU_S, float), flops=flops(u))

        def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
            t0 = time.process_time()
            out = fn()
            dt = time.process_time() - t0
            server_cpu[0] += dt
            return out, dt

        def book_out(stage: str, inbox: Mapping[int, bytes], close_s: float) -> None:
            share = close_s / max(len(inbox), 1)
            for v, m in inbox.items():
                ctx.message(SERVER, v, stage, m, server_cpu_s=share)
                link.count(stage, len(m))

        def survive(stage: str, got: Mapping[int, Reply], failed: dict[int, str]
                    ) -> Mapping[int, Reply]:
            return keep_live(link, ctx, stage, got, failed, dropped, rows=self.drop_rows)

        def round_trip(stage: str, inbox: Mapping[int, bytes], close_s: float,
                       needs: Needs = PROTOCOL_REPLY, step: bool = False,
                       per_node: Callable[[int], dict[str, Any]] = lambda v: {},
                       ) -> Mapping[int, Reply]:
            book_out(stage, inbox, close_s)
            got, failed = link.exchange(
                stage, ctx, {v: {**per_node(v), Key.STEP: stage, Key.MSG: m}
                             for v, m in inbox.items()}, needs=needs, step=step)
            return survive(stage, got, failed)

        def stepped(u: int, rec: Reply, cpu_field: str) -> None:
            """Keep a client step's costs (booked with its masked input) and clip counts."""
            costs[u] = (rfield(rec, cpu_field, float), rfield(rec, Key.FLOPS, float))
            if clips is not None:
                add_clips(clips, rec)

        # stage 1: ADVERTISE -- with the client step and encoding in one message, or
        # already collected during the previous session's unmask exchange
        costs: dict[int, tuple[float, float]] = {}
        if pre is None:
            session = self._entropy(ss_wire.SESSION_BYTES)
            if wire:
                link.count(Stage.ADVERTISE, len(wire) * len(cohort))
            got, failed = link.exchange(Stage.ADVERTISE, ctx, {
                c: {Key.STEP: Stage.ADVERTISE, Key.SESSION: session, Key.N: len(cohort),
                    Key.LAYER: params, **common}
                for c in cohort}, needs=STEP_REPLY, step=True)
            live = survive(Stage.ADVERTISE, got, failed)
            adverts: Mapping[int, tuple[bytes, float]] = {}
            for u in live:
                rec = read(Stage.ADVERTISE, u, live.__getitem__, u)
                if rec is None:
                    continue
                if Key.STEP_CPU_S in rec:  # the step's own CPU apart from the ADVERTISE's
                    stepped(u, rec, Key.STEP_CPU_S)
                    adverts[u] = (rfield(rec, Key.MSG, bytes), rfield(rec, Key.CPU_S, float))
                else:
                    stepped(u, rec, Key.CPU_S)
                    adverts[u] = (rfield(rec, Key.MSG, bytes), 0.0)
        else:
            session = pre.session
            adverts = survive(Stage.ADVERTISE, pre.adverts, dict(pre.failed))
        server = Server(session, ctx.round, g, bits, off, pinned=self.pinned,
                        forward_all_signatures=self.pinned is not None)
        for u, (msg, cpu) in adverts.items():
            to_server(u, Stage.ADVERTISE, msg, server.receive_advertise, cpu,
                      flops=secure_sum_client_flops(Stage.ADVERTISE, len(g.neighbours[u])))
        rosters, dt = timed(server.close_advertise)
        link.reached(ctx, Stage.ADVERTISE)

        # stage 2: share keys (with the client step when ADVERTISE came early)
        def share_flops(u: int) -> float:
            return secure_sum_client_flops(Stage.SHARE, len(g.neighbours[u]), g.share_threshold)

        if pre is None:
            deliver(Stage.SHARE, round_trip(Stage.SHARE, rosters, dt), server.receive_shares,
                    share_flops)
        else:
            if wire:
                link.count(Stage.SHARE, len(wire) * len(rosters))
            got = round_trip(
                Stage.SHARE, rosters, dt, needs=(*STEP_REPLY, (Key.STEP_CPU_S, float)), step=True,
                per_node=lambda v: dict(with_step=True, n=len(cohort), layer=params, **common))
            shared = {}
            for u in got:
                rec = read(Stage.SHARE, u, got.__getitem__, u)
                if rec is not None:
                    stepped(u, rec, Key.STEP_CPU_S)
                    shared[u] = rec
            deliver(Stage.SHARE, shared, server.receive_shares, share_flops)
        forwards, dt = timed(server.close_shares)
        link.reached(ctx, Stage.SHARE)

        # stage 3: every ACK, then the masked vectors (one Flower message carries both; an
        # in-process link computes a masked vector when it is read, one at a time)
        got = round_trip(Stage.MASKED_INPUT, forwards, dt,
                         needs=((Key.MSG, bytes), (Key.CPU_S, float), (Key.ACK, bytes),
                                (Key.ACK_CPU_S, float)))
        acked: list[tuple[int, Reply]] = []
        for u in got:
            rec = read(Stage.MASKED_INPUT, u, got.__getitem__, u)
            if rec is not None and to_server(
                    u, Stage.MASKED_INPUT, rfield(rec, Key.ACK, bytes), server.receive_ack,
                    rfield(rec, Key.ACK_CPU_S, float),
                    flops=secure_sum_client_flops("ack", len(g.neighbours[u]))) is not None:
                acked.append((u, rec))
        acked.reverse()
        pbytes = sum(fields.values()) if plaintext_bytes is None else int(plaintext_bytes)
        while acked:
            u, rec = acked.pop()  # not kept once booked: the masked vector is freed
            msg = read(Stage.MASKED_INPUT, u, rfield, rec, Key.MSG, bytes)
            if msg is None:
                continue
            extra_cpu, flops = costs.get(u, (0.0, 0.0))
            if late_costs is not None:
                late_cpu, late_flops = late_costs.get(u, (0.0, 0.0))
                extra_cpu, flops = extra_cpu + late_cpu, flops + late_flops
            res = to_server(u, Stage.MASKED_INPUT, msg, server.receive_masked,
                            rfield(rec, Key.CPU_S, float) + extra_cpu,
                            plaintext_bytes=pbytes, fields=dict(fields), step_flops=flops,
                            flops=flops + secure_sum_client_flops(
                                "masked", len(g.neighbours[u]), vector_bytes=off * word,
                                word_bytes=word))
            del rec, msg
            if res is not None:
                for name, sl in segments.items():
                    part = res[1][sl]
                    ctx.observe(SERVER, u, Stage.MASKED_INPUT, name, "masked", part,
                                nbytes=int(part.size) * word)
        survivors, dt = timed(server.close_masked)
        link.reached(ctx, Stage.MASKED_INPUT)

        # stage 4: consistency check (each survivor signs the survivor set it was shown;
        # Bonawitz et al.'s active-security round)
        deliver(Stage.CONSISTENCY, round_trip(Stage.CONSISTENCY, survivors, dt),
                server.receive_signature)
        requests, dt = timed(server.close_consistency)
        link.reached(ctx, Stage.CONSISTENCY)

        # stage 5: unmasking, with the next session's ADVERTISE in the same exchange (a node
        # of the next cohort that is not asked to unmask gets an instruction of its own,
        # sent alongside): the next session then starts at its share stage
        book_out(Stage.UNMASK, requests, dt)
        nxt = upcoming()
        ahead = None if nxt is None else _PreAdvertised(
            nxt[0], nxt[1], self._entropy(ss_wire.SESSION_BYTES), tuple(nxt[2]))
        payloads: dict[int, dict[str, Any]] = {v: {Key.STEP: Stage.UNMASK, Key.MSG: m}
                                               for v, m in requests.items()}
        if ahead is not None:
            nf = dict(next_session=ahead.session, next_round=ahead.round,
                      next_n=len(ahead.cohort), next_layer=params)
            for v in ahead.cohort:
                payloads[v] = ({Key.STEP: Stage.UNMASK, Key.MSG: requests[v], **nf} if v in requests
                               else {Key.STEP: Stage.ADVERTISE_NEXT, **nf})
        got, failed = link.exchange(Stage.UNMASK, ctx, payloads, needs=())
        why = {v: w for v, w in failed.items() if v in requests}
        replied: dict[int, Reply] = {}
        for v in survive(Stage.UNMASK, only(got, [v for v in got if v in requests]), why):
            rec = read(Stage.UNMASK, v, got.__getitem__, v)
            if rec is None:
                continue
            replied[v] = rec
            if (bad := malformed(rec, PROTOCOL_REPLY)) is not None:
                book_drops(link, ctx, Stage.UNMASK, {v: bad}, dropped, rows=self.drop_rows)
            else:
                to_server(v, Stage.UNMASK, rfield(rec, Key.MSG, bytes), server.receive_unmask,
                          rfield(rec, Key.CPU_S, float))
        if ahead is not None:
            for v in ahead.cohort:
                rec = replied[v] if v in replied else (
                    read(Stage.UNMASK, v, got.__getitem__, v) if v in got else None)
                if rec is None:
                    ahead.failed[v] = failed.get(v, "no reply")
                else:
                    ahead.take(v, rec)
            self._pre = ahead
        (total, contributors), _ = timed(server.finish)
        for name, sl in segments.items():
            part = total[sl]
            ctx.observe(SERVER, SERVER, Stage.UNMASK, name, "clear", part, what="sum",
                        nbytes=int(part.size) * word)
        notes = {"secure_sum": {
            "ring_bits": bits, "graph": g.kind, "k": g.k, "threshold": g.threshold,
            "share_threshold": g.share_threshold, "live": dict(server.live),
            "excluded": sorted(server.excluded), "recovered": sorted(server.dropped),
            "refused": dict(server.refused),
            "server_model": self._server_model(),
            "verdicts": [list(v) for v in server.verdicts],
            "cut": [list(e) for e in sorted(server.cut)], "cut_off": dict(server.cut_off),
            "faults": dict(server.faults),
        }, "dropped": dropped}
        return SessionOutcome(total, tuple(contributors), notes, server, server_cpu[0])


class SessionOutcome(NamedTuple):
    """What :meth:`SecureSumServer.session` returns: the ring sum, its contributors, the
    aggregate's notes (``secure_sum`` and ``dropped``), the closed server state machine
    (its live counts, verdicts, faults...) and the server's CPU seconds."""

    total: np.ndarray
    contributors: tuple[int, ...]
    notes: dict[str, Any]
    server: Server
    server_cpu_s: float
