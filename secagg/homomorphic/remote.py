"""Homomorphic's one server driver, over any :class:`~secagg.link.Link`: Flower's nodes, the
embedded engine's :class:`~secagg.local_link.LocalLink`, or :class:`InProcess`, the link
:meth:`Homomorphic.aggregate <secagg.homomorphic.layer.Homomorphic.aggregate>` runs it over.

:class:`HomomorphicServer` runs both key roles (see the layer): ``"decryptor"``, a decryptor
node makes the keys (once per parameter set; a CKKS key is renewed after
``max_decryptions`` decryptions) and decrypts the sum; ``"clients"``, a :class:`Provisioner`
outside the link (as NVIDIA FLARE's provisioning) puts the shared secret context into each
client's node store (:attr:`~secagg.link.PhaseCall.stores`) and the first client live at
``decrypt`` decrypts (one that fails is dropped there and the next one asked). That secret
never passes through the server, so a runtime that routes every message through it (Flower)
cannot carry this mode. Either way the server adds the ciphertexts with the public context
only, and decodes the sum here (:func:`~secagg.homomorphic.plan.decode_sums`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.client_step import reply_fields
from secagg.costs import SERVER, he_flops
from secagg.errors import ConfigurationError, ProtocolError, SecureSumAborted
from secagg.homomorphic.keys import Aggregator, KeyHolder
from secagg.homomorphic.node import LAYER_KEYS, decryptor_step, encrypt
from secagg.homomorphic.params import HEParams
from secagg.homomorphic.plan import DECRYPTOR, PROVISIONER, HomomorphicPlan, decode_sums
from secagg.layers.base import Aggregate, RoundContext, ServerPart
from secagg.link import (
    PROTOCOL_REPLY,
    Dropped,
    Link,
    Needs,
    PhaseCall,
    Reply,
    Stores,
    add_clips,
    book_drops,
    keep_live,
)
from secagg.link import reply_field as rfield
from secagg.messages import ClipReport, Upload, UploadSpec
from secagg.stages import Key, Stage
from secagg.stream import Lazy
from secagg.transcript import digest
from secagg.wire import unpack_arrays


class Provisioner:
    """The out-of-band key provisioning of ``key_holder="clients"``: generates one key per
    parameter set and puts the shared secret context into a client's node store, where the
    node steps of :mod:`secagg.homomorphic.node` read it (``he-upload`` its public context,
    ``he-decrypt`` its secret context). It is a party of its own, not the server: the
    driver gets the public context and the size of what each client was handed, never the
    secret.

    Args:
        stores: the clients' node stores.
    """

    def __init__(self, stores: Stores) -> None:
        self._stores = stores
        self._secrets: dict[str, bytes] = {}
        self._public: dict[str, bytes] = {}

    def keygen(self, params: HEParams, pjson: str) -> tuple[bytes, float]:
        """New keys for ``params`` (JSON ``pjson``), replacing any held: (the public
        context, the key generation's CPU seconds)."""
        t0 = time.process_time()
        holder = KeyHolder(params, "clients")
        self._secrets[pjson] = holder.client_context
        self._public[pjson] = holder.public_context
        return holder.public_context, time.process_time() - t0

    def deliver(self, client: int, pjson: str) -> int:
        """Hand client ``client``'s node the current keys of ``pjson``; returns the bytes
        handed over (the secret context)."""
        secret, public = self._secrets[pjson], self._public[pjson]
        store = self._stores(client)
        key = "he-secret/" + pjson
        store[key], store[key + "/public"], store[key + "/decryptions"] = secret, public, 0
        store["he-context/" + pjson] = public
        return len(secret)


class HomomorphicServer:
    """Homomorphic's server side over a :class:`~secagg.link.Link` (a
    :class:`~secagg.link.LayerServer`); see the module docstring.

    Args:
        layer: the Homomorphic layer.
        decryptor: ``key_holder="decryptor"``: the client id of the node that generates the
            keys, keeps the secret context and decrypts the sum (default: the smallest
            connected id). It must not collude with the server.

    Attributes:
        keys: per parameter set (JSON): (public context bytes, the server's aggregator,
            the clients booked as provisioned, the clients sent the context).
        decryptions: CKKS: decryptions of the current key per parameter set.
    """

    #: the embedded engine runs this driver too (over a LocalLink), in both key roles, and so
    #: does Homomorphic.aggregate (over :class:`InProcess`)
    local: ClassVar[bool] = True

    def __init__(self, *, layer: HomomorphicPlan, decryptor: int | None = None) -> None:
        self.layer = layer
        self.decryptor = decryptor
        self.provisioner: Provisioner | None = None
        self.keys: dict[str, tuple[bytes, Any, set[int], set[int]]] = {}
        self.decryptions: dict[str, int] = {}

    def hello(self, round: int, phase: str, n: int) -> dict[str, Any]:
        """Nothing rides on the hello."""
        return {}

    def greeted(self, client: int, reply: Reply) -> None:
        """Nothing to keep from the hello."""

    def start(self, cohort: Sequence[int], announced: int) -> None:
        """Nothing to prepare (keys are made when the first phase's parameters are known)."""

    def aggregate(self, call: PhaseCall, link: Link) -> Aggregate:
        """Keys (once per parameter set: from the decryptor node, or provisioned to the
        clients), encrypted uploads from the clients, the sum of ciphertexts here (public
        context only), the clear sum from the decrypting party."""
        layer, spec, ctx, cohort = self.layer, call.release.carried, call.release.ctx, call.cohort
        common, clips = call.instruction, call.clips
        if call.broadcast:  # it rides in the upload instruction
            link.count(Stage.UPLOAD, len(call.broadcast) * len(cohort))
        layer.check(spec)
        n_plan = layer.planned_clients(len(cohort))
        params = layer.params_for(spec, n_plan)
        fps = layer.fixed_point(spec, n_plan, limbs=True) if layer.scheme == "bfv" else None
        pjson = json.dumps(dataclasses.asdict(params))
        dec = None
        if layer.key_holder == "clients":
            if call.stores is None:
                raise ConfigurationError(
                    "Homomorphic(key_holder='clients') needs the clients' keys provisioned out "
                    "of band, into their node stores, which this runtime does not reach (it "
                    "routes every message through the server); use key_holder='decryptor'")
            if self.provisioner is None:
                self.provisioner = Provisioner(call.stores)
        else:
            dec = self.decryptor if self.decryptor is not None else min(link.clients)
            if dec not in link.clients:
                raise ConfigurationError(f"decryptor client {dec} is not connected")
        packing = layer.packing(spec, n_plan)  # BFV: fields wider than a slot in limbs
        if params.scheme == "ckks":
            # a CKKS key answers at most max_decryptions ciphertext decryptions (the flooding
            # is sized for them): past that, new keys, generated and provisioned like the first
            if packing.n_ciphertexts > params.max_decryptions:
                raise ConfigurationError(
                    f"one CKKS sum is {packing.n_ciphertexts} ciphertexts, more than "
                    f"max_decryptions={params.max_decryptions} decryptions per key")
            used = self.decryptions.get(pjson, 0)
            if pjson in self.keys and \
                    used + packing.n_ciphertexts > params.max_decryptions:
                del self.keys[pjson]
        pub, agg, sent = self._keys(params, pjson, dec, cohort, link, ctx)
        desc = {k: getattr(layer, k) for k in LAYER_KEYS}
        got, failed = link.exchange(Stage.UPLOAD, ctx, {c: dict(
            step=Stage.HE_UPLOAD, layer=json.dumps(desc), n_plan=n_plan, params=pjson,
            context=None if c in sent else pub, **common)
            for c in cohort},
            needs=((Key.CPU_S, float), (Key.FLOPS, float), (Key.CLIPPED, str),
                   (Key.ENC_CPU_S, float)),
            step=True)
        link.count(Stage.UPLOAD, len(pub) * len(set(cohort) - sent))
        dropped: Dropped = {}
        live = keep_live(link, ctx, Stage.UPLOAD, got, failed, dropped)
        notes = {**layer.notes(params, packing, spec, len(live)), "decryptor_client": dec,
                 "dropped": dropped}
        sums = {f.name: np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
                for f in spec.additive}
        agg.start(packing)
        share = {f.name: f.size * packing.field_limbs(f.name) / max(packing.total, 1)
                 for f in spec.additive}
        contributors = []
        for c in sorted(live):
            try:  # each reply read once, as it arrives (a lazy link computes it now)
                rec = live[c]
            except ProtocolError as exc:
                book_drops(link, ctx, Stage.UPLOAD, {c: f"ProtocolError: {exc}"}, dropped)
                continue
            frames = rec.get(Key.FRAMES)
            if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
                book_drops(link, ctx, Stage.UPLOAD, {c: "reply without ciphertext frames"},
                           dropped)
                continue
            t0 = time.process_time()
            try:
                agg.add(frames)
            except ProtocolError as exc:
                book_drops(link, ctx, Stage.UPLOAD, {c: f"refused: {exc}"}, dropped)
                continue
            server_s = time.process_time() - t0
            contributors.append(c)
            # it holds the public context for the rest of the run (a client whose reply was
            # never read, e.g. dropped first, may not have stored it: it is sent again)
            sent.add(c)
            size = sum(len(f) for f in frames)
            link.count(Stage.UPLOAD, size)
            add_clips(clips, rec)
            ctx.message(c, SERVER, Stage.UPLOAD, wire_bytes=frames, plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.additive},
                        client_cpu_s=rfield(rec, Key.CPU_S, float)
                        + rfield(rec, Key.ENC_CPU_S, float),
                        server_cpu_s=server_s,
                        flops=rfield(rec, Key.FLOPS, float) + he_flops(
                            "encrypt", params.poly_modulus_degree,
                            len(params.coeff_mod_bit_sizes), packing.n_ciphertexts),
                        step_flops=rfield(rec, Key.FLOPS, float))
            d = digest(frames)
            for f in spec.additive:
                ctx.observe(SERVER, c, Stage.UPLOAD, f.name, "encrypted", frames,
                            nbytes=round(size * share[f.name]), value_digest=d)
        if contributors and packing.total:
            t0 = time.process_time()
            agg_wire = [bytes(f) for f in agg.finish()]
            finish_s = time.process_time() - t0
            # the decrypting party: the decryptor node, or the first client live at decrypt
            parties: list[int] = [dec] if dec is not None else \
                ctx.dropouts.survivors(Stage.DECRYPT, contributors)
            raw, flat, party, cpu = self._decrypt(parties, agg_wire, finish_s, pjson, packing,
                                                  share, spec, link, ctx, dropped)
            notes["decryptor_client"] = dec if dec is not None else party
            if params.scheme == "ckks":
                self.decryptions[pjson] = (self.decryptions.get(pjson, 0)
                                           + packing.n_ciphertexts)
            sums.update(decode_sums(flat, packing, spec, fps))
            name = DECRYPTOR if dec is not None else party
            ctx.message(name, SERVER, Stage.RESULT, wire_bytes=raw,
                        plaintext_bytes=sum(int(s.nbytes) for s in sums.values()),
                        fields={k: int(v.nbytes) for k, v in sums.items()},
                        client_cpu_s=cpu,
                        flops=he_flops("decrypt", params.poly_modulus_degree,
                                       len(params.coeff_mod_bit_sizes) - 1,
                                       packing.n_ciphertexts))
            link.count(Stage.DECRYPT, len(raw))
            for f in spec.additive:
                ctx.observe(name, SERVER, Stage.DECRYPT, f.name, "clear", sums[f.name],
                            what="sum")
                ctx.observe(SERVER, name, Stage.RESULT, f.name, "clear", sums[f.name],
                            what="sum")
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(contributors), notes)

    def _keys(self, params: HEParams, pjson: str, dec: int | None, cohort: Sequence[int],
              link: Link, ctx: RoundContext) -> tuple[bytes, Aggregator, set[int]]:
        """The public context for ``params`` (keys generated on first use: by the decryptor
        node ``dec``, or by the provisioner when ``dec`` is None), the server's aggregator
        (public context only; checked) and the clients that hold the public context. Each
        cohort client not yet provisioned is booked the context it is handed (the
        provisioner's clients get the secret context in its store)."""
        keys = self.keys.get(pjson)
        holder = DECRYPTOR if dec is not None else PROVISIONER
        if keys is None:
            self.decryptions[pjson] = 0
            if self.provisioner is not None:
                pub, cpu = self.provisioner.keygen(params, pjson)
            else:
                assert dec is not None
                got, _ = link.exchange(Stage.KEYS, ctx,
                                       {dec: dict(step=Stage.HE_KEYGEN, params=pjson)})
                if dec not in got:
                    raise SecureSumAborted(Stage.KEYS, 0, 1)
                pub = rfield(got[dec], Key.MSG, bytes)
                cpu = rfield(got[dec], Key.CPU_S, float)
                link.count(Stage.KEYS, len(pub))
            agg = Aggregator(params.scheme, pub)  # refuses a context with a secret key
            ctx.message(holder, SERVER, Stage.KEYS, pub, client_cpu_s=cpu)
            keys = self.keys[pjson] = (pub, agg, set(), set())
        pub, agg, provisioned, sent = keys
        agg.assert_public()
        for c in cohort:
            if c not in provisioned:
                if self.provisioner is not None:
                    size = self.provisioner.deliver(c, pjson)
                    sent.add(c)  # its store holds the public context too
                else:
                    size = len(pub)
                ctx.message(holder, c, Stage.KEYS, wire_bytes=size)
                provisioned.add(c)
        return pub, agg, sent

    def _decrypt(self, parties: Sequence[int], agg_wire: list[bytes], finish_s: float,
                 pjson: str, packing: Any, share: dict[str, float], spec: Any, link: Link,
                 ctx: RoundContext, dropped: Dropped
                 ) -> tuple[bytes, np.ndarray, int, float]:
        """The aggregate ``agg_wire`` decrypted by the first of ``parties`` that answers
        with a flat sum of the packing's length (the decryptor node alone, or the clients
        live at decrypt in order, one that fails booked as dropped there): (its reply, the
        flat sum, who decrypted, its CPU seconds).

        Raises:
            SecureSumAborted: no party answered.
            ProtocolError: the decryptor node's reply is malformed.
        """
        agg_size = sum(len(f) for f in agg_wire)
        d = digest(agg_wire)
        packed = json.dumps(dataclasses.asdict(packing))
        for party in parties:
            name = DECRYPTOR if self.provisioner is None else party
            ctx.message(SERVER, name, Stage.DECRYPT, wire_bytes=agg_wire,
                        server_cpu_s=finish_s)
            link.count(Stage.DECRYPT, agg_size)
            for f in spec.additive:
                n = round(agg_size * share[f.name])
                ctx.observe(SERVER, SERVER, "sum", f.name, "encrypted", agg_wire, what="sum",
                            nbytes=n, value_digest=d)
                ctx.observe(name, SERVER, Stage.DECRYPT, f.name, "encrypted", agg_wire,
                            what="sum", nbytes=n, value_digest=d)
            got, failed = link.exchange(Stage.DECRYPT, ctx, {party: dict(
                step=Stage.HE_DECRYPT, params=pjson, frames=agg_wire, packing=packed)})
            if party in got:
                try:
                    raw = rfield(got[party], Key.MSG, bytes)
                    flat = unpack_arrays(raw).get("flat")
                    if flat is None or flat.shape != (packing.total,):
                        raise ProtocolError(f"a decrypted sum of {packing.total} values "
                                            "expected")
                    return raw, flat, party, rfield(got[party], Key.CPU_S, float)
                except ProtocolError as exc:
                    if self.provisioner is None:
                        raise
                    failed = {party: f"refused: {exc}"}
            if self.provisioner is not None:  # the next client live at decrypt is asked
                book_drops(link, ctx, Stage.DECRYPT, failed, dropped)
        raise SecureSumAborted(Stage.DECRYPT, 0, 1)


class InProcess:
    """The clients of this process as the nodes of a :class:`~secagg.link.Link`, each with a
    store kept for the layer's life (keys made once per parameter set, as on a runtime), and
    :attr:`server`, the driver over them. An upload is read (a streamed one computed) when
    the driver reads its reply, a dropped client's never. Unlike
    :class:`~secagg.local_link.LocalLink`, which reaches every layer's node steps through the
    layer registry (an import circle from here), it answers this layer's steps only, and has
    no tamper hook. ``decryptor``: the client whose node holds the keys."""

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
                got[c] = decryptor_step(rfield(ins, Key.STEP, str), ins, self.store(c))
            except ProtocolError as exc:
                failed[c] = f"ProtocolError: {exc}"
        return got, failed

    def _upload(self, client: int, ins: Mapping[str, Any]) -> Reply:
        """Client ``client``'s upload encrypted, with its step's reply fields."""
        assert self._spec is not None  # read within aggregate only
        up = self._uploads[client]
        return {**reply_fields(up), **encrypt(ins, self._spec, up, self.store(client))}

    def count(self, stage: str, nbytes: int) -> None:
        """Nothing to count: in one process the ledger rows are the traffic."""

    def lost(self, dropped: Dropped) -> None:
        """Nothing to tell: the aggregate's notes name the drops."""

    def reached(self, ctx: RoundContext, stage: str) -> None:
        """Nothing to hold (no secure-sum stage)."""
