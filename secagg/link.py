"""The transport callable a layer's server side runs over, wherever the clients run.

A remote runtime (Flower: :mod:`secagg.flower.server`) supplies a :class:`Link`, and so does
the embedded one (:class:`~secagg.local_link.LocalLink`: the clients of this process); a
layer's server driver (:class:`secagg.layers.plaintext.PlaintextServer`,
:class:`secagg.secure_sum.remote.SecureSumServer`,
:class:`secagg.homomorphic.remote.HomomorphicServer`) sends each client one instruction per
stage through it and gets the replies back, as plain mappings of field name to value. The
driver never sees the runtime's message objects, and the runtime never sees a layer: as in
Flower's own workflow/mod split, the protocol lives with the layer, the messages with the
runtime.

The vocabulary both sides use: an instruction is a mapping with a ``step`` (what the node
runs) and the step's fields; a reply is a mapping checked with :func:`reply_field`. A
client that does not answer a stage, answers with an error, or answers without the fields
the stage needs is *dropped* at that stage (:func:`book_drops`), never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from secagg.costs import SERVER
from secagg.errors import ProtocolError
from secagg.layers.base import Aggregate, RoundContext, ServerPart
from secagg.messages import ClipReport, UploadSpec
from secagg.stages import Key, dropped_stage

Reply = Mapping[str, Any]
"""One client's reply to an instruction: field name -> value (int, float, str, bytes...)."""

Needs = Sequence[tuple[str, type]]
"""The fields (name, type) a reply must carry for its stage."""

#: what a plain protocol reply carries: the protocol message and the node's CPU seconds
PROTOCOL_REPLY: Needs = ((Key.MSG, bytes), (Key.CPU_S, float))
#: what a reply to an instruction that ran the client step carries
STEP_REPLY: Needs = ((Key.MSG, bytes), (Key.CPU_S, float), (Key.FLOPS, float), (Key.CLIPPED, str))

Stores = Callable[[int], MutableMapping[str, Any]]
"""Client id -> its node's private store, where a runtime reaches its nodes out of band
(:attr:`PhaseCall.stores`)."""


class LiveStore(dict[str, Any]):
    """A node's private store that lives in this process (the embedded runtime's
    :class:`~secagg.local_link.LocalLink`): a node step may keep live objects in it (a
    secure-sum party, its vector) instead of freezing them to bytes between stages; any
    other store (Flower's ConfigRecord, a plain dict) gets bytes."""


Dropped = dict[str, dict[int, str]]
"""Stage -> client -> why it was dropped there (an aggregate's ``notes["dropped"]``)."""


class Link(Protocol):
    """What a remote runtime supplies to a layer's server driver: messages to and from
    the connected clients, and its own bookkeeping of them."""

    @property
    def clients(self) -> Collection[int]:
        """The ids of the connected clients."""
        ...

    def exchange(
        self, stage: str, ctx: RoundContext, instructions: Mapping[int, Mapping[str, Any]],
        *, needs: Needs = PROTOCOL_REPLY, step: bool = False,
    ) -> tuple[dict[int, Reply], dict[int, str]]:
        """Send one instruction per client (each with its ``step`` and fields), wait for the
        replies; returns (client -> reply, client -> why it failed) for every addressed
        client. ``step``: the instructions run the client step (local training), which may
        take longer than a protocol stage, and may carry the runtime's own requests (e.g.
        Flower's node evaluation rides on a node's first message of a round)."""
        ...

    def count(self, stage: str, nbytes: int) -> None:
        """Book ``nbytes`` of secagg wire bytes sent or received at ``stage`` in the
        runtime's transport table (the cost ledger is booked by the driver)."""
        ...

    def lost(self, dropped: Dropped) -> None:
        """Learn which clients a driver dropped in this phase (the runtime then, e.g., does
        not ask them to evaluate, and names them when a secure sum aborts)."""
        ...

    def reached(self, ctx: RoundContext, stage: str) -> None:
        """A secure-sum stage has just closed (a test hook may hold the server there)."""
        ...


Upcoming = Callable[[], "tuple[int, str, list[int]] | None"]
"""The phase after the current one, as (round, phase name, cohort), or None after the last."""


@dataclass(kw_only=True)
class PhaseCall:
    """One phase as a layer's server driver runs it over a :class:`Link`.

    Attributes:
        spec: the phase's spec (the layer carries ``release.carried``: under LocalDP, bounds
            widened by the noise).
        cohort: the sampled clients, in order.
        ctx: the phase's context (the inner layer books under ``release.ctx``, where a DP
            layer relabels the noised fields).
        release: the wrapping layer's server part for the phase
            (:meth:`~secagg.layers.base.Layer.server_part`; the identity when nothing wraps
            the carrying layer).
        instruction: the fields every client-step instruction carries (round, phase, seed,
            the packed broadcast under ``broadcast``, the DP noise parameters under ``dp``).
        clips: the run's clip counts, added to from the clients' replies.
        upcoming: the phase after this one (a secure-sum session advertises for it early).
        stores: client id -> its node's private store, where the runtime reaches the nodes
            out of band (the embedded one: :meth:`~secagg.local_link.LocalLink.store`); None
            over a runtime that routes every message through the server (Flower). A driver
            that provisions keys to the clients without the server (Homomorphic
            ``key_holder="clients"``) needs it.
    """

    spec: UploadSpec
    cohort: list[int]
    ctx: RoundContext
    release: ServerPart
    instruction: dict[str, Any]
    clips: ClipReport
    upcoming: Upcoming = field(default=lambda: None)
    stores: Stores | None = None

    @property
    def broadcast(self) -> bytes:
        """The packed broadcast the client step needs (b"" when none)."""
        return self.instruction.get(Key.BROADCAST) or b""


class LayerServer(Protocol):
    """A layer's server side over a :class:`Link` (one per run; it may keep state across
    phases, e.g. keys). The hooks let a protocol ride its first stage on the runtime's
    hello, as a secure-sum session advertises ahead."""

    #: whether the embedded engine runs this driver in one process too, over a
    #: :class:`~secagg.local_link.LocalLink` (issue 34's migration: True once the driver
    #: carries everything the layer's in-process ``aggregate`` did; until then that runs)
    local: bool

    def hello(self, round: int, phase: str, n: int) -> dict[str, Any]:
        """Fields the runtime's hello carries for the run's first phase (cohort size n)."""
        ...

    def greeted(self, client: int, reply: Reply) -> None:
        """One client's reply to the hello."""
        ...

    def start(self, cohort: Sequence[int], announced: int) -> None:
        """The run's first cohort is known (the hello announced ``announced`` clients)."""
        ...

    def aggregate(self, call: PhaseCall, link: Link) -> Aggregate:
        """Run one phase's protocol with the clients and return the server's view."""
        ...


def reply_field(rec: Reply, name: str, kind: type) -> Any:
    """``rec[name]`` checked to be of ``kind`` (an int is a float; a ProtocolError names
    what is missing)."""
    value = rec.get(name)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise ProtocolError(
            f"secagg record field {name!r}: expected {kind.__name__}, got {type(value).__name__}"
        )
    return value


def malformed(rec: Reply, needs: Needs) -> str | None:
    """Why ``rec`` lacks a field ``needs`` names (or has the wrong type); None if it has
    them all."""
    try:
        for name, kind in needs:
            reply_field(rec, name, kind)
    except ProtocolError as exc:
        return f"malformed reply: {exc}"
    return None


def book_drops(link: Link, ctx: RoundContext, stage: str, failed: Mapping[int, str],
               dropped: Dropped, *, rows: bool = True) -> None:
    """Book every client in ``failed`` as dropped at ``stage``: a zero-byte ledger row of
    stage ``"dropped:<stage>"`` from it (unless ``rows`` is False), and its reason in
    ``dropped``; then tell the runtime (:meth:`Link.lost`)."""
    for c, why in sorted(failed.items()):
        if rows:
            ctx.message(c, SERVER, dropped_stage(stage), 0)
        dropped.setdefault(stage, {})[c] = why
    link.lost(dropped)


def keep_live(link: Link, ctx: RoundContext, stage: str, got: Mapping[int, Reply],
              failed: dict[int, str], dropped: Dropped, *, rows: bool = True,
              ) -> Mapping[int, Reply]:
    """The replies of the clients still live at ``stage`` (in client order, each read from
    ``got`` when asked for): those that answered and that the run's injected dropouts keep;
    every other addressed client is booked as dropped (``rows``: see :func:`book_drops`)."""
    live = set(ctx.dropouts.survivors(stage, sorted(got)))
    failed.update({c: "injected dropout" for c in got if c not in live})
    book_drops(link, ctx, stage, failed, dropped, rows=rows)
    return _Subset(got, sorted(live))


def only(got: Mapping[int, Reply], keys: Sequence[int]) -> Mapping[int, Reply]:
    """The replies of ``keys`` among ``got``, each read from ``got`` when asked for."""
    return _Subset(got, [k for k in keys if k in got])


class _Subset(Mapping[int, Reply]):
    """The replies of ``keys`` among ``got``, each read from ``got`` when asked for (a
    lazy link's reply is computed then, and not held here)."""

    def __init__(self, got: Mapping[int, Reply], keys: Sequence[int]) -> None:
        self._got, self._keys = got, list(keys)
        self._members = set(self._keys)

    def __getitem__(self, c: int) -> Reply:
        if c not in self._members:
            raise KeyError(c)
        return self._got[c]

    def __contains__(self, c: object) -> bool:
        return c in self._members

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def add_clips(clips: ClipReport, rec: Reply) -> None:
    """Add a step reply's clip counts (its ``clipped`` JSON object) to ``clips``."""
    for k, v in json.loads(reply_field(rec, Key.CLIPPED, str)).items():
        clips.counts[k] = clips.counts.get(k, 0) + v
