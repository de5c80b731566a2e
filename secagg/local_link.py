"""The embedded runtime's :class:`~secagg.link.Link`: the clients of this process as nodes.

A layer's server driver (:class:`~secagg.link.LayerServer`) runs over a
:class:`LocalLink` exactly as it runs over Flower's: it sends each client one instruction
per stage and reads the replies. Here each instruction is answered in this process by the
node steps a Flower node runs (:mod:`secagg.node`), with each client's private store kept
in memory (a :class:`~secagg.link.LiveStore` per client, never serialised between stages:
a node step keeps its live objects there).

What differs from a remote runtime is the client step: it is the engine's own, on the
client state of this process (:meth:`LocalLink.serve` hands over the phase's
:class:`~secagg.stream.UploadStream`). The replies of a stage that runs the client step
are therefore computed when the driver reads them, in the order it reads them, so a
streaming layer holds one upload at a time however large the cohort; :meth:`LocalLink.settle`
then runs the steps the driver never read (clients that dropped first), as the engine
always has.

Failures: a node step that raises :class:`~secagg.errors.ProtocolError` (a message its
party refuses) is that client's failed reply, named with the error, never a crash; reading
a lazily computed reply that failed raises the ProtocolError, which the driver books as
that client's drop. An error of the client step itself (an upload that breaks its spec,
with ``on_violation="raise"``) is the caller's and propagates, as in one process it always
has. The run's injected dropouts (``ctx.dropouts``) are applied by the drivers at each
stage, with the same calls on both runtimes (:func:`~secagg.link.keep_live`, or the inner
layer's own stage), so the link adds none of its own.

Tests reach every message through ``tamper(stage, sender, receiver, message)``: it gets
each instruction (sender ``"server"``) and each reply (receiver ``"server"``) as a mapping
and returns what is delivered, or None for a message lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from secagg.client_step import reply_fields
from secagg.errors import ProtocolError
from secagg.layers.base import RoundContext
from secagg.link import (
    PROTOCOL_REPLY,
    Dropped,
    LiveStore,
    Needs,
    Reply,
    malformed,
    reply_field,
)
from secagg.messages import UploadSpec
from secagg.node import leave, protocol_step, runs_client_step
from secagg.stages import Key
from secagg.stream import UploadStream

LinkTamper = Callable[[str, Any, Any, Mapping[str, Any]], "Mapping[str, Any] | None"]
"""Fault injection: (stage, sender, receiver, message) -> the message delivered (None:
lost). An instruction's sender is ``"server"``; a reply's receiver is ``"server"``."""


class LocalLink:
    """The clients of this process as the nodes of a :class:`~secagg.link.Link` (see the
    module docstring).

    Args:
        clients: the ids of the clients in this process.
        tamper: fault injection on every instruction and reply (tests).

    Attributes:
        stores: client id -> its node's private store (kept for the run).
        transport: stage -> secagg wire bytes the drivers counted (:meth:`count`).
        dropped: the last phase's drops, as the driver reported them (:meth:`lost`).
        reached_stages: (round, phase, stage) of every secure-sum stage closed.
    """

    def __init__(self, clients: Sequence[int], *, tamper: LinkTamper | None = None) -> None:
        self._clients = tuple(int(c) for c in clients)
        self.tamper = tamper
        self.stores: dict[int, MutableMapping[str, Any]] = {}
        self.transport: dict[str, int] = {}
        self.dropped: Dropped = {}
        self.reached_stages: list[tuple[int, str, str]] = []
        self._uploads: UploadStream | None = None
        self._spec: UploadSpec | None = None

    # -- the phase's client step

    def serve(self, uploads: UploadStream, spec: UploadSpec) -> None:
        """The phase's client steps: an instruction that runs the client step gets client
        c's upload from ``uploads`` (its step runs when the reply is read), checked
        against ``spec``."""
        self._uploads, self._spec = uploads, spec

    def settle(self) -> None:
        """Run the client steps the driver never read (see the module docstring)."""
        if self._uploads is not None:
            self._uploads.finish()
        self._uploads, self._spec = None, None

    # -- the Link protocol

    @property
    def clients(self) -> Collection[int]:
        """The ids of the clients in this process."""
        return self._clients

    def store(self, client: int) -> MutableMapping[str, Any]:
        """Client ``client``'s private store (made on first use)."""
        return self.stores.setdefault(int(client), LiveStore())

    def _deliver(self, stage: str, sender: Any, receiver: Any,
                 message: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return message if self.tamper is None else self.tamper(stage, sender, receiver,
                                                               message)

    def exchange(
        self, stage: str, ctx: RoundContext, instructions: Mapping[int, Mapping[str, Any]],
        *, needs: Needs = PROTOCOL_REPLY, step: bool = False,
    ) -> tuple[dict[int, Reply], dict[int, str]]:
        """Answer each instruction with its client's node step (see
        :meth:`~secagg.link.Link.exchange`). Instructions that run the client step are
        answered when their reply is read (a lazy mapping; reading a failed reply raises
        ProtocolError with why); the others here, in instruction order."""
        got: dict[int, Reply] = {}
        failed: dict[int, str] = {}
        lazy: dict[int, Mapping[str, Any]] = {}
        for c, sent in instructions.items():
            # a field set to None is not sent (as a Flower record leaves it out)
            ins = self._deliver(stage, "server", c,
                                {k: v for k, v in sent.items() if v is not None})
            if ins is None:
                failed[c] = "instruction lost"
                continue
            name = reply_field(ins, Key.STEP, str)
            if runs_client_step(name, ins):
                lazy[c] = ins
                continue
            try:
                rep = self._deliver(stage, c, "server", protocol_step(name, ins, self.store(c),
                                                                      c))
            except ProtocolError as exc:
                failed[c] = f"ProtocolError: {exc}"
                continue
            if rep is None:
                failed[c] = "no reply"
            elif (bad := malformed(rep, needs)) is not None:
                failed[c] = bad
            else:
                got[c] = rep
        if lazy:
            replies = _StepReplies(self, stage, lazy, needs)
            if got:  # a mix: the lazy replies first read here, in instruction order
                got.update({c: replies[c] for c in replies})
                return got, failed
            return replies, failed  # type: ignore[return-value]
        return got, failed

    def count(self, stage: str, nbytes: int) -> None:
        """Keep the driver's count of wire bytes per stage."""
        self.transport[stage] = self.transport.get(stage, 0) + int(nbytes)

    def lost(self, dropped: Dropped) -> None:
        """Keep the phase's drops (for tests and the caller)."""
        self.dropped = dropped

    def reached(self, ctx: RoundContext, stage: str) -> None:
        """Note that a secure-sum stage closed."""
        self.reached_stages.append((int(ctx.round), str(ctx.phase), stage))

    # -- one client-step reply

    def step_reply(self, stage: str, client: int, ins: Mapping[str, Any],
                   needs: Needs) -> Reply:
        """Client ``client``'s reply to the instruction ``ins`` that runs its step: the
        engine's step (its upload), the wrapping DP layer's node part when the instruction
        carries one (``dp``: e.g. LocalDP's noise), then the layer's node part
        (:func:`secagg.node.leave`).

        Raises:
            ProtocolError: the node part refused, or the reply was lost or malformed.
        """
        if self._uploads is None or self._spec is None:
            raise ProtocolError(f"client {client}: a client-step instruction at {stage!r} "
                                "outside a phase served by this link")
        up, spec, part = self._uploads[client], self._spec, None
        out = reply_fields(up)
        if Key.DP in ins:  # the wrapping DP layer's node part, rebuilt as a Flower node does
            from secagg.privacy.release import node_part

            t0 = time.process_time()
            part = node_part(ins, client, str(self.store(client).get(Key.DP_SIZING, "server")))
            up, spec = part.prepare(up, spec)
            out[Key.CPU_S] = float(up.cpu_s) + time.process_time() - t0
        rep = self._deliver(stage, client, "server",
                            leave(ins, spec, up, client, part, out, float(out[Key.CPU_S]),
                                  self.store(client)))
        if rep is None:
            raise ProtocolError(f"client {client}: no reply at {stage!r}")
        if (bad := malformed(rep, needs)) is not None:
            raise ProtocolError(f"client {client}: {bad}")
        return rep


class _StepReplies(Mapping[int, Reply]):
    """The replies to a stage's client-step instructions, each computed when read (once:
    the upload it carries is not kept)."""

    def __init__(self, link: LocalLink, stage: str, instructions: Mapping[int, Mapping[str, Any]],
                 needs: Needs) -> None:
        self._link, self._stage, self._needs = link, stage, needs
        self._ins = dict(instructions)

    def __getitem__(self, client: int) -> Reply:
        if client not in self._ins:
            raise KeyError(client)
        return self._link.step_reply(self._stage, client, self._ins[client], self._needs)

    def __contains__(self, client: object) -> bool:
        return client in self._ins

    def __iter__(self) -> Iterator[int]:
        return iter(self._ins)

    def __len__(self) -> int:
        return len(self._ins)
