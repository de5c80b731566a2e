"""Flower messages to the nodes, for :class:`~secagg.flower.server.FlowerFederation`: the
send-and-poll loop on the Grid (:func:`send_and_receive`), the table of bytes per stage (ours
beside Flower's), one message per client with its reply checked (``_exchange``), the release
a node's ledger charges, the closing exchange and the signed statements replies carry."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from secagg.engine import (
    node_release_event,
)
from secagg.errors import ProtocolError
from secagg.flower.node_evaluation import FederationAttributes
from secagg.flower.records import MESSAGE_TYPE, content, flower_bytes, read
from secagg.flower.records import field as rfield
from secagg.layers.base import RoundContext
from secagg.link import malformed
from secagg.stages import Key, Stage


def send_and_receive(grid: Grid, messages: Sequence[Message], timeout: float,
                     poll_interval: float = 0.2) -> list[Message]:
    """Push ``messages`` and pull their replies every ``poll_interval`` seconds until all
    have come or ``timeout`` seconds have passed (Flower's own ``Grid.send_and_receive``
    pulls every 3 s on a deployment, which adds up to 3 s to every protocol stage; this
    is the same loop on the public ``push_messages``/``pull_messages`` API)."""
    pending = set(grid.push_messages(messages))
    end = time.monotonic() + timeout
    out: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        out.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() >= end:
            break
        time.sleep(poll_interval)
    return out


@dataclass
class _Transport:
    """Bytes per stage: ours (secagg wire bytes) and Flower's serialized messages."""

    ours: dict[str, int] = field(default_factory=dict)
    flower: dict[str, int] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)

    def add(self, stage: str, ours: int = 0, flower: int = 0) -> None:
        """Add our wire bytes, or one Flower message (``flower`` > 0), to ``stage``."""
        self.ours[stage] = self.ours.get(stage, 0) + ours
        self.flower[stage] = self.flower.get(stage, 0) + flower
        self.messages[stage] = self.messages.get(stage, 0) + (1 if flower else 0)

    def to_dict(self) -> dict[str, Any]:
        return {s: {"messages": self.messages[s], "secagg_wire_bytes": self.ours[s],
                    "flower_message_bytes": self.flower[s]} for s in self.ours}


class NodeMessagesMixin(FederationAttributes):
    """The :class:`~secagg.flower.server.FlowerFederation`'s methods that message the nodes
    (moved here from it unchanged; they read its attributes)."""

    transport: _Transport
    _events: Any
    _grid: Any
    _round_drops: Any
    _run: Any
    _run_tag: Any

    def _exchange(
        self, grid: Grid, stage: str, ctx: RoundContext | None,
        payloads: Mapping[int, RecordDict], timeout: float | None = None,
        needs: Sequence[tuple[str, type]] = ((Key.MSG, bytes), (Key.CPU_S, float)),
        tag: str | None = None,
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Send one message per client, wait for the replies; returns (client -> reply
        record, client -> why it failed) for every addressed client that did not answer,
        answered with an error, or answered without the fields ``needs`` names (a
        malformed reply counts as that client dropping, never as a crash)."""
        if tag is None:
            tag = Stage.HELLO if ctx is None else f"{ctx.round}/{ctx.phase}/{stage}"
        msgs = []
        for c, rd in payloads.items():
            m = Message(rd, dst_node_id=self.nodes[c], message_type=MESSAGE_TYPE, group_id=tag)
            self.transport.add(stage, flower=flower_bytes(m))
            msgs.append(m)
        by_node = {n: c for c, n in self.nodes.items()}
        got: dict[int, Any] = {}
        failed: dict[int, str] = {}
        t0 = time.perf_counter()
        for rep in send_and_receive(grid, msgs, timeout or self.stage_timeout,
                                    self.poll_interval):
            c = by_node.get(rep.metadata.src_node_id)
            if c is None or c not in payloads:
                continue
            if rep.has_error():
                failed[c] = f"error reply: {rep.error.reason}"
                continue
            try:
                rec = read(rep)
                bad = malformed(rec, needs)
                if bad is None and Key.CLIPPED in rec:
                    clipped = json.loads(rfield(rec, Key.CLIPPED, str))
                    if not isinstance(clipped, dict) or not all(
                            isinstance(v, int) for v in clipped.values()):
                        bad = "malformed reply: 'clipped' is not a JSON object of counts"
            except (ProtocolError, ValueError) as exc:
                bad = f"malformed reply: {exc}"
            if bad is not None:
                failed[c] = bad
                continue
            got[c] = rec
            self.transport.add(stage, flower=flower_bytes(rep))
            self._statements(c, rec)
        for c in payloads:
            if c not in got and c not in failed:
                failed[c] = f"no reply within {timeout or self.stage_timeout:g} s"
        self.stage_wall_s[stage] = self.stage_wall_s.get(stage, 0.0) + (
            time.perf_counter() - t0)
        return got, failed

    def _node_event(self, client: int, ins: Mapping[str, Any], ctx: RoundContext,
                    sizing: Any = None, **kw: Any) -> dict[str, Any]:
        """The release ``ins`` asks node ``client`` for, as the node's ledger charges it
        (:func:`secagg.engine.node_release_event`, from the same fields, and ``sizing``:
        how the node says it sized a DistributedDP noise share)."""
        rnd, name = ins.get(Key.ROUND, ctx.round), ins.get(Key.PHASE, ctx.phase)
        sizing = sizing if sizing in ("server", "pinned", "alone") else "server"
        key = (self._run_tag, rnd, name, ins.get(Key.DP), ins.get(Key.LAYER), ins.get(Key.N),
               sizing)
        if key not in self._events:  # one event per release (its plan), not per node
            spec = None
            if Key.DP in ins:  # the release's spec: its un-noised fields, DistributedDP's plan
                phase = next(p for p in self.algorithm.phases(rnd, self.rounds)
                             if p.name == name)
                spec = phase.spec()
                if spec.max_records is None:
                    spec = replace(spec, max_records=int(ins["max_records"]))
            self._events = {key: node_release_event(
                client, self._run_tag, rnd, name, ins.get(Key.DP), spec=spec,
                cohort=ins.get(Key.N), layer=ins.get(Key.LAYER), sizing=sizing)}
        return replace(self._events[key], client=str(client), **kw).to_dict()

    def _close_nodes(self, terms: Mapping[str, Any] | None) -> dict[int, str]:
        """The run's last exchange (step ``close``): every node that said hello is sent
        the run's DP terms (``dp_terms``: :func:`secagg.attest.dp_terms` of the privacy
        ledger; none without DP) and answers with its signed closing statement (its
        statement count, and the terms, which it checks against the noise it applied
        itself). Returns why each node that did not answer failed (the Collector records
        it in the transcript, and the audit then names what it cannot check of it)."""
        if not self.nodes:
            return {}
        last = max(len(self.round_wall_s) - 1, 0)
        extra = {} if terms is None else {Key.DP_TERMS: json.dumps(terms, sort_keys=True)}
        payloads = {c: content(step=Stage.CLOSE, run=self._run_tag, round=last, **extra)
                    for c in sorted(self.nodes)}
        got, failed = self._exchange(self._grid, Stage.CLOSE, None,  # type: ignore[arg-type]
                                     payloads, needs=((Key.ATT, str),), tag=f"{last}/close")
        # our bytes: the terms to each node, the signed closing statements back (not on the
        # cost ledger: once per node per run, as in one process)
        self.transport.add(Stage.CLOSE, ours=len(extra.get(Key.DP_TERMS, "")) * len(payloads)
                           + sum(len(rec[Key.ATT]) for rec in got.values()))
        return failed

    def _statements(self, client: int, rec: Any) -> None:
        """Keep the signed statements a node's reply carries (``att``), for the transcript
        (:class:`secagg.attest.Collector`)."""
        if isinstance(rec.get(Key.ATT), str):
            cpu = rec.get(Key.ATT_CPU_S, 0.0)
            self.collector.received(client, rec[Key.ATT],
                                    float(cpu) if isinstance(cpu, float | int) else 0.0)
