"""The Homomorphic layer's client side on a node (Flower's SuperNodes): the steps that
answer :class:`~secagg.homomorphic.remote.HomomorphicServer`'s instructions.

* :func:`encrypt` -- after a client's step (``he-upload``): pack, (BFV: fixed-point encode,)
  encrypt under the decryptor's public context (relayed by the server once per run and
  parameter set, then kept in the node's private store);
* :func:`decryptor_step` -- the designated decryptor's ``he-keygen`` (keys for the
  parameters the server asks for; the secret context stays in its store) and
  ``he-decrypt`` (the aggregate ciphertext to the flat clear sum).
"""

from __future__ import annotations

import json
import time
from collections.abc import MutableMapping
from functools import lru_cache
from typing import Any

from secagg.errors import ProtocolError
from secagg.homomorphic.plan import HomomorphicPlan
from secagg.link import Reply
from secagg.link import reply_field as field
from secagg.messages import Upload, UploadSpec
from secagg.stages import Key, Stage
from secagg.wire import pack_arrays

NodeStore = MutableMapping[str, Any]
"""A node's private store between messages (Flower: a ConfigRecord in ``Context.state``)."""

#: the layer parameters an ``he-upload`` instruction carries (its ``layer`` JSON)
LAYER_KEYS = ("scheme", "poly_modulus_degree", "key_holder", "precision", "max_clients",
              "max_decryptions", "flood_security_bits")


def layer_of(rec: Reply) -> HomomorphicPlan:
    """The Homomorphic layer's parameters an instruction's ``layer`` JSON describes."""
    cfg = json.loads(field(rec, Key.LAYER, str))
    return HomomorphicPlan(**{k: cfg[k] for k in LAYER_KEYS if k in cfg})


@lru_cache(maxsize=4)
def _encryptor(scheme: str, pub: bytes) -> Any:
    """The encryptor of the public context ``pub`` (deserialized once per context: the
    clients of one process share the server's copy of it; it holds no secret)."""
    from secagg.homomorphic.keys import Encryptor
    from secagg.homomorphic.packing import fingerprint

    return Encryptor(scheme, pub, fingerprint(pub))


def encrypt(rec: Reply, spec: UploadSpec, up: Upload, store: NodeStore) -> dict[str, Any]:
    """This client's encrypted upload (see the module docstring); the frames go back as a
    list of bytes."""
    layer = layer_of(rec)
    n_plan = field(rec, Key.N_PLAN, int)
    t0 = time.process_time()
    fps = layer.fixed_point(spec, n_plan, limbs=True) if layer.scheme == "bfv" else None
    key = "he-context/" + field(rec, Key.PARAMS, str)
    if Key.CONTEXT in rec:
        store[key] = field(rec, Key.CONTEXT, bytes)
    if key not in store:
        raise ProtocolError("he-upload without the public context, and none is held")
    enc = _encryptor(layer.scheme, bytes(store[key]))
    packing = layer.packing(spec, n_plan)  # BFV: fields wider than a slot in limbs
    frames = enc.encrypt(layer._flatten(up, spec, packing, fps), packing)
    return {Key.FRAMES: [bytes(f) for f in frames],
            Key.ENC_CPU_S: time.process_time() - t0}


def _params(pjson: str) -> Any:
    """The encryption parameters an instruction's ``params`` JSON names."""
    from secagg.homomorphic.params import HEParams

    d = json.loads(pjson)
    return HEParams(**{**d, "coeff_mod_bit_sizes": tuple(d["coeff_mod_bit_sizes"])})


@lru_cache(maxsize=4)
def _holder(pjson: str, secret: bytes, public: bytes) -> Any:
    """The key holder of a stored key (parameters ``pjson``), rebuilt once per key as the
    party keeps it between messages: its context, fingerprint and flooding-noise stream (a
    CSPRNG under a fresh OS key); its decryption count is the store's, set per message.
    Keyed by the secret bytes themselves, so only a caller that holds them gets it."""
    import tenseal as ts

    from secagg.homomorphic.keys import KeyHolder
    from secagg.homomorphic.packing import fingerprint
    from secagg.privacy.samplers import noise_generator

    holder = KeyHolder.__new__(KeyHolder)
    holder.params, holder.mode = _params(pjson), "decryptor"
    holder._ctx = ts.context_from(secret, n_threads=1)
    holder.public_context = holder.client_context = public
    holder.fingerprint = fingerprint(public)
    holder._noise = noise_generator()
    return holder


def decryptor_step(step: str, rec: Reply, store: NodeStore) -> dict[str, Any]:
    """The designated decryptor's ``he-keygen`` and ``he-decrypt`` (see the module
    docstring)."""
    from secagg.homomorphic.keys import KeyHolder
    from secagg.homomorphic.packing import Packing

    key = "he-secret/" + field(rec, Key.PARAMS, str)
    t0 = time.process_time()
    if step == Stage.HE_KEYGEN:
        holder = KeyHolder(_params(field(rec, Key.PARAMS, str)), "decryptor")
        store[key] = holder._ctx.serialize(save_public_key=True, save_secret_key=True,
                                           save_galois_keys=False, save_relin_keys=False)
        store[key + "/public"] = holder.public_context
        store[key + "/decryptions"] = 0  # a new key: its CKKS decryption quota starts afresh
        return {Key.MSG: holder.public_context, Key.CPU_S: time.process_time() - t0}
    if step != Stage.HE_DECRYPT:
        raise ProtocolError(f"unknown secagg step {step!r}")
    if key not in store:
        raise ProtocolError("he-decrypt for parameters this node holds no keys of")
    holder = _holder(field(rec, Key.PARAMS, str), bytes(store[key]),
                     bytes(store[key + "/public"]))
    # the key's decryption count (CKKS quota) persists on the node with the key
    holder.decryptions = int(store.get(key + "/decryptions", 0))
    p = json.loads(field(rec, Key.PACKING, str))
    packing = Packing(tuple(p["names"]), tuple(tuple(x) for x in p["shapes"]),
                      tuple(p["offsets"]), int(p["total"]), int(p["slots"]))
    frames = rec.get(Key.FRAMES)
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise ProtocolError("he-decrypt without the aggregate's frames")
    flat = holder.decrypt(frames, packing)
    store[key + "/decryptions"] = holder.decryptions
    return {Key.MSG: pack_arrays({"flat": flat}), Key.CPU_S: time.process_time() - t0}
