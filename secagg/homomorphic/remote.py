"""The Homomorphic layer's server side when the clients run elsewhere (Flower's nodes).

:class:`HomomorphicServer` runs the layer's ``key_holder="decryptor"`` protocol over a
:class:`~secagg.link.Link`: a designated decryptor node generates the keys (once per
parameter set; a CKKS key is renewed after ``max_decryptions`` decryptions) and keeps the
secret context; the clients get the public context once and send their encrypted uploads;
the server adds the ciphertexts with the public context only; the decryptor decrypts the
sum, which is decoded here exactly as in one process
(:func:`~secagg.homomorphic.layer.decode_sums`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER, he_flops
from secagg.errors import ConfigurationError, ProtocolError, SecureSumAborted
from secagg.homomorphic.keys import Aggregator
from secagg.homomorphic.layer import DECRYPTOR, Homomorphic, decode_sums
from secagg.homomorphic.node import LAYER_KEYS
from secagg.layers.base import Aggregate
from secagg.link import Dropped, Link, PhaseCall, Reply, add_clips, book_drops, keep_live
from secagg.link import reply_field as rfield
from secagg.stages import Key, Stage
from secagg.transcript import digest
from secagg.wire import unpack_arrays


class HomomorphicServer:
    """Homomorphic's server side over a :class:`~secagg.link.Link` (a
    :class:`~secagg.link.LayerServer`); see the module docstring.

    Args:
        layer: the Homomorphic layer, with ``key_holder="decryptor"``.
        decryptor: the client id of the node that generates the keys, keeps the secret
            context and decrypts the sum (default: the smallest connected id). It must not
            collude with the server (as the embedded layer's decryptor).

    Attributes:
        keys: per parameter set (JSON): (public context bytes, the server's aggregator,
            the clients booked as provisioned, the clients sent the context).
        decryptions: CKKS: decryptions of the current key per parameter set.
    """

    #: the embedded engine runs this driver too (over a LocalLink; key_holder="clients"
    #: is the in-process layer's own, refused here by the engine's check_remote)
    local: ClassVar[bool] = True

    def __init__(self, *, layer: Homomorphic, decryptor: int | None = None) -> None:
        self.layer = layer
        self.decryptor = decryptor
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
        """Keys from the decryptor node (once per parameter set), encrypted uploads from
        the clients, the sum of ciphertexts here (public context only), the clear sum from
        the decryptor."""
        layer, spec, ctx, cohort = self.layer, call.release.carried, call.release.ctx, call.cohort
        common, clips = call.instruction, call.clips
        if call.broadcast:  # it rides in the upload instruction
            link.count(Stage.UPLOAD, len(call.broadcast) * len(cohort))
        layer.check(spec)
        n_plan = layer.planned_clients(len(cohort))
        params = layer.params_for(spec, n_plan)
        fps = layer.fixed_point(spec, n_plan, limbs=True) if layer.scheme == "bfv" else None
        pjson = json.dumps(dataclasses.asdict(params))
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
        keys = self.keys.get(pjson)
        if keys is None:
            self.decryptions[pjson] = 0
            got, failed = link.exchange(Stage.KEYS, ctx,
                                        {dec: dict(step=Stage.HE_KEYGEN, params=pjson)})
            if dec not in got:
                raise SecureSumAborted(Stage.KEYS, 0, 1)
            pub = rfield(got[dec], Key.MSG, bytes)
            agg = Aggregator(params.scheme, pub)  # refuses a context with a secret key
            ctx.message(DECRYPTOR, SERVER, Stage.KEYS, pub,
                        client_cpu_s=rfield(got[dec], Key.CPU_S, float))
            link.count(Stage.KEYS, len(pub))
            keys = self.keys[pjson] = (pub, agg, set(), set())
        pub, agg, provisioned, sent = keys
        agg.assert_public()
        for c in cohort:
            if c not in provisioned:
                ctx.message(DECRYPTOR, c, Stage.KEYS, wire_bytes=len(pub))
                provisioned.add(c)
        desc = {k: getattr(layer, k) for k in LAYER_KEYS}
        got, failed = link.exchange(Stage.UPLOAD, ctx, {c: dict(
            step=Stage.HE_UPLOAD, layer=json.dumps(desc), n_plan=n_plan, params=pjson,
            context=None if c in sent else pub, **common)
            for c in cohort},
            needs=((Key.CPU_S, float), (Key.FLOPS, float), (Key.CLIPPED, str),
                   (Key.ENC_CPU_S, float)),
            step=True)
        link.count(Stage.UPLOAD, len(pub) * len(set(cohort) - sent))
        sent.update(got)  # a node keeps the public context for the rest of the run
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
            agg_size = sum(len(f) for f in agg_wire)
            ctx.message(SERVER, DECRYPTOR, Stage.DECRYPT, wire_bytes=agg_wire,
                        server_cpu_s=finish_s)
            link.count(Stage.DECRYPT, agg_size)
            d = digest(agg_wire)
            for f in spec.additive:
                n = round(agg_size * share[f.name])
                ctx.observe(SERVER, SERVER, "sum", f.name, "encrypted", agg_wire, what="sum",
                            nbytes=n, value_digest=d)
                ctx.observe(DECRYPTOR, SERVER, Stage.DECRYPT, f.name, "encrypted", agg_wire,
                            what="sum", nbytes=n, value_digest=d)
            got, failed = link.exchange(Stage.DECRYPT, ctx, {dec: dict(
                step=Stage.HE_DECRYPT, params=pjson, frames=agg_wire,
                packing=json.dumps(dataclasses.asdict(packing)))})
            if dec not in got:
                raise SecureSumAborted(Stage.DECRYPT, 0, 1)
            if params.scheme == "ckks":
                self.decryptions[pjson] = (self.decryptions.get(pjson, 0)
                                               + packing.n_ciphertexts)
            raw = rfield(got[dec], Key.MSG, bytes)
            flat = unpack_arrays(raw)["flat"]
            sums.update(decode_sums(flat, packing, spec, fps))
            ctx.message(DECRYPTOR, SERVER, Stage.RESULT, wire_bytes=raw,
                        plaintext_bytes=sum(int(s.nbytes) for s in sums.values()),
                        fields={k: int(v.nbytes) for k, v in sums.items()},
                        client_cpu_s=rfield(got[dec], Key.CPU_S, float),
                        flops=he_flops("decrypt", params.poly_modulus_degree,
                                       len(params.coeff_mod_bit_sizes) - 1,
                                       packing.n_ciphertexts))
            link.count(Stage.DECRYPT, len(raw))
            for f in spec.additive:
                ctx.observe(DECRYPTOR, SERVER, Stage.DECRYPT, f.name, "clear", sums[f.name],
                            what="sum")
                ctx.observe(SERVER, DECRYPTOR, Stage.RESULT, f.name, "clear", sums[f.name],
                            what="sum")
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(contributors), notes)
