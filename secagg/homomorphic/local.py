"""Homomorphic's in-process aggregate: its one server driver
(:class:`~secagg.homomorphic.remote.HomomorphicServer`) over the clients of this process.

:class:`InProcess` is the :class:`~secagg.link.Link` that
:meth:`Homomorphic.aggregate <secagg.homomorphic.layer.Homomorphic.aggregate>` runs the
driver over: each instruction is answered by the node steps a Flower node runs
(:mod:`secagg.homomorphic.node`), on a private store per client kept for the layer's life, so
keys are made once per parameter set and each client is handed the context once, as on a
runtime. An upload is read (a streamed one computed) when the driver reads its client's
reply, in the order it reads them; a client dropped before then is never read. The decryptor
(``key_holder="decryptor"``) is the node of the smallest client id of the first call, as
the embedded engine's link picks it; in ``"clients"`` mode the driver's provisioner fills
the stores.

It answers this layer's steps only, not every layer's as
:class:`~secagg.local_link.LocalLink` does through the layer registry (the registry names
this layer, so reaching it from here would close an import circle), and it has no tamper
hook: tests of messages in flight run the driver over a LocalLink.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from secagg.client_step import reply_fields
from secagg.errors import ProtocolError
from secagg.homomorphic.node import decryptor_step, encrypt
from secagg.homomorphic.plan import HomomorphicPlan
from secagg.homomorphic.remote import HomomorphicServer
from secagg.layers.base import Aggregate, RoundContext, ServerPart
from secagg.link import PROTOCOL_REPLY, Dropped, Needs, PhaseCall, Reply
from secagg.link import reply_field as field
from secagg.messages import ClipReport, Upload, UploadSpec
from secagg.stages import Key, Stage
from secagg.stream import Lazy


class InProcess:
    """The clients of this process as the nodes of a :class:`~secagg.link.Link`, and the
    layer's driver over them (see the module docstring).

    Args:
        layer: the Homomorphic layer.
        decryptor: ``key_holder="decryptor"``: the client id whose node holds the keys.

    Attributes:
        server: the driver (its keys persist across calls).
        stores: client id -> its node's private store.
    """

    def __init__(self, layer: HomomorphicPlan, decryptor: int) -> None:
        self.decryptor = int(decryptor)
        self.server = HomomorphicServer(
            layer=layer, decryptor=self.decryptor if layer.key_holder == "decryptor" else None)
        self.stores: dict[int, MutableMapping[str, Any]] = {}
        self._uploads: Mapping[int, Upload] = {}
        self._spec: UploadSpec | None = None

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """One phase of the driver over the clients of ``uploads``."""
        self._uploads, self._spec = uploads, spec
        call = PhaseCall(spec=spec, cohort=sorted(uploads), ctx=ctx,
                         release=ServerPart(spec, ctx), instruction={}, clips=ClipReport(),
                         stores=self.store)
        try:
            return self.server.aggregate(call, self)
        finally:
            self._uploads, self._spec = {}, None

    # -- the Link protocol

    @property
    def clients(self) -> list[int]:
        """The clients of this call, the decryptor and every node seen before."""
        return sorted({*self._uploads, *self.stores, self.decryptor})

    def store(self, client: int) -> MutableMapping[str, Any]:
        """Client ``client``'s private store (made on first use)."""
        return self.stores.setdefault(int(client), {})

    def exchange(
        self, stage: str, ctx: RoundContext, instructions: Mapping[int, Mapping[str, Any]],
        *, needs: Needs = PROTOCOL_REPLY, step: bool = False,
    ) -> tuple[dict[int, Reply], dict[int, str]]:
        """Each instruction answered by its client's node step: an upload when the driver
        reads its reply (a lazy mapping), a key holder's step here (a refusal is that
        client's failure, named with the error)."""
        sent = {c: {k: v for k, v in ins.items() if v is not None}  # None fields: not sent
                for c, ins in instructions.items()}
        if step:
            return Lazy(sent, self._upload), {}  # type: ignore[return-value]
        got: dict[int, Reply] = {}
        failed: dict[int, str] = {}
        for c, ins in sent.items():
            try:
                got[c] = decryptor_step(field(ins, Key.STEP, str), ins, self.store(c))
            except ProtocolError as exc:
                failed[c] = f"ProtocolError: {exc}"
        return got, failed

    def _upload(self, client: int, ins: Mapping[str, Any]) -> Reply:
        """Client ``client``'s upload encrypted, with its step's reply fields."""
        if field(ins, Key.STEP, str) != Stage.HE_UPLOAD or self._spec is None:
            raise ProtocolError(f"client {client}: no upload to send at this step")
        up = self._uploads[client]
        return {**reply_fields(up), **encrypt(ins, self._spec, up, self.store(client))}

    def count(self, stage: str, nbytes: int) -> None:
        """Nothing to count: in one process, the driver's ledger rows are the traffic."""

    def lost(self, dropped: Dropped) -> None:
        """Nothing to tell: the aggregate's notes name the drops."""

    def reached(self, ctx: RoundContext, stage: str) -> None:
        """Nothing to hold: no secure-sum stage runs here."""
