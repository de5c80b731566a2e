"""The SecureSum layer's client side on a node (Flower's SuperNodes): the steps that answer
:class:`~secagg.secure_sum.remote.SecureSumServer`'s instructions.

A node keeps its secure-sum party between messages in its own private store (Flower: a
``ConfigRecord`` in the node's ``Context.state``, never sent anywhere), frozen to bytes
(:func:`freeze` / :func:`thaw`); a :class:`~secagg.link.LiveStore` (the embedded runtime's
:class:`~secagg.local_link.LocalLink`, in this process) keeps the live party and vector
instead, with no freezing between stages (:func:`keep` / :func:`kept`). The steps:

* :func:`advertise_next` -- ADVERTISE ahead for the next session (its id, round and cohort
  size in the instruction's ``next_*`` fields): fresh keys, and the party kept until that
  session's share instruction brings the client step (which fixes the vector length and
  ring);
* :func:`upload` -- after the client step: encode the upload with the layer's fixed-point
  plan (or as a wrapping layer's node part encodes it, e.g. DistributedDP's noise share
  added), then
  ``advertise`` afresh or ``share`` keys with the party advertised ahead;
* :func:`stage` -- ``share`` / ``masked-input`` / ``consistency`` / ``unmask``: the stages
  of :class:`~secagg.secure_sum.client.Client` (``consistency``: sign the survivor set the
  server shows); after ``unmask`` the session's secrets are forgotten.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import MutableMapping
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secagg import safestore
from secagg.errors import ProtocolError
from secagg.layers.base import NodePart
from secagg.link import LiveStore, Reply
from secagg.link import reply_field as field
from secagg.messages import Upload, UploadSpec
from secagg.secure_sum import wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.graph import auto_degree, resolve_threshold
from secagg.secure_sum.keys import KeyPairs, private_bytes
from secagg.secure_sum.layer import SecureSum
from secagg.stages import Key, Stage
from secagg.wire import pack_arrays, unpack_arrays

NodeStore = MutableMapping[str, Any]
"""A node's private store between messages (Flower: a ConfigRecord in ``Context.state``)."""

_SESSION_KEYS = ("party", "vector", "party_n")  # what a node holds for one session
_STORED = {"Roster": wire.Roster}  # the dataclasses a stored party may hold


def freeze(c: Client) -> bytes:
    """A secure-sum party as bytes for the node's own store (private keys -- the two
    X25519 pairs and the Ed25519 signing key -- as raw bytes; the AES-GCM channels are
    rebuilt from them)."""
    skip = ("_rand", "_channels", "_keys", "_sign")
    d = {k: v for k, v in vars(c).items() if k not in skip}
    if c._keys is not None:
        d["_keys"] = (private_bytes(c._keys.enc), private_bytes(c._keys.mask))
    if c._sign is not None:
        d["_sign"] = c._sign.private_bytes(serialization.Encoding.Raw,
                                           serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())
    return safestore.dumps(d, _STORED)  # arrays and JSON, never pickle


def thaw(raw: bytes) -> Client:
    """The party :func:`freeze` stored (:mod:`secagg.safestore`: nothing in it runs)."""
    try:
        d = safestore.loads(bytes(raw), classes=_STORED)
    except safestore.StoreError as exc:
        raise ProtocolError(f"the node's stored secure-sum party: {exc}") from None
    c = Client.__new__(Client)
    keys = d.pop("_keys", None)
    sign = d.pop("_sign", None)
    vars(c).update(d)
    c._rand = os.urandom
    c._keys = None if keys is None else KeyPairs(
        X25519PrivateKey.from_private_bytes(keys[0]), X25519PrivateKey.from_private_bytes(keys[1])
    )
    c._sign = None if sign is None else Ed25519PrivateKey.from_private_bytes(sign)
    c._channels = {}
    if c._keys is not None and c._roster is not None:
        c._channels = {v: c._channel(v) for v in c._roster.keys}
    return c


def keep(store: NodeStore, party: Client) -> None:
    """Keep ``party`` in the node's store: as it is in a :class:`~secagg.link.LiveStore`
    (in this process, never serialised), else frozen to bytes (:func:`freeze`)."""
    store["party"] = party if isinstance(store, LiveStore) else freeze(party)


def kept(store: NodeStore) -> Client:
    """The party :func:`keep` kept (thawed when the store holds bytes)."""
    party = store["party"]
    return party if isinstance(party, Client) else thaw(party)


def session_bounds(layer: Any, n: int) -> tuple[int, int | None]:
    """(t, the fewest share holders a ROSTER may list) for a cohort of ``n`` under the
    SecureSum ``layer``, computed on the node from the public layer parameters and cohort
    size (as :func:`secagg.secure_sum.graph.build` chooses them; the node does not take the
    server's word for its threshold). The holder bound is t on the complete graph, None on
    the sparse SecAgg+ graph (as the embedded engine's clients are configured)."""
    t = resolve_threshold(layer.threshold, n)
    deg = auto_degree(n) if layer.k is None else int(layer.k)
    kind = layer.graph
    if kind == "auto":
        kind = "harary" if deg < n - 1 else "complete"
    complete = kind == "complete" or n < 2
    return t, (t if complete else None)


def party_identity(store: NodeStore) -> dict[str, Any]:
    """The identity arguments of this node's secure-sum parties: with pinned identities
    (the node's config names its key and its peers' keys; :mod:`secagg.flower.client` puts
    them in the store as ``signing`` and ``pinned``), its long-term signing key and every
    peer's pinned public key, so a roster or a survivor signature the server forged is
    refused; else none (a fresh signing key per session)."""
    if "pinned" not in store:
        return {}
    pins = json.loads(store["pinned"])
    return {"signing": Ed25519PrivateKey.from_private_bytes(bytes(store["signing"])),
            "pinned": {int(c): bytes.fromhex(h) for c, h in pins.items()}}


def _forget(store: NodeStore) -> None:
    for k in _SESSION_KEYS:
        if k in store:
            del store[k]


def advertise_next(rec: Reply, cid: int, store: NodeStore) -> dict[str, Any]:
    """ADVERTISE for the next session (see the module docstring); replies ``next_msg``
    and ``next_cpu_s``."""
    _forget(store)  # a session this node was dropped from
    layer = SecureSum(**json.loads(field(rec, Key.NEXT_LAYER, str)))
    n = field(rec, Key.NEXT_N, int)
    t, min_holders = session_bounds(layer, n)
    t0 = time.process_time()
    party = Client(int(cid), field(rec, Key.NEXT_SESSION, bytes), field(rec, Key.NEXT_ROUND, int),
                   threshold=t, min_holders=min_holders, **party_identity(store))
    msg = party.advertise()
    keep(store, party)
    store["party_n"] = n
    return {Key.NEXT_MSG: msg, Key.NEXT_CPU_S: time.process_time() - t0}


def upload(rec: Reply, spec: UploadSpec, up: Upload, client: int, part: NodePart | None,
           out: dict[str, Any], cpu: float, store: NodeStore) -> dict[str, Any]:
    """After the client step (``out`` holds its reply fields, ``cpu`` its CPU seconds):
    encode ``up`` (as the wrapping layer's node ``part`` encodes it, if it does, e.g. with a
    noise share; else with the layer's fixed-point plan), then ``advertise`` afresh, or
    ``share`` keys with the party advertised ahead (its vector length and ring are fixed
    now, before the ROSTER is read, which must announce the same)."""
    store["cid"] = int(client)
    layer = SecureSum(**json.loads(field(rec, Key.LAYER, str)))
    n = field(rec, Key.N, int)
    rnd = field(rec, Key.ROUND, int)
    t, min_holders = session_bounds(layer, n)
    t0 = time.process_time()
    worst = t
    encoded = None if part is None else part.encode(up, spec, n)
    if encoded is not None:  # e.g. DistributedDP's plan, derived here, with this node's share
        vector, bits, planned = encoded
        worst = max(t, planned)
    else:
        plans = layer.plan(spec, n)
        bits = next(iter(plans.values())).ring_bits if plans else 8
        parts = [p.encode(np.asarray(up[f])) for f, p in plans.items()]
        vector = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    store["vector"] = vector if isinstance(store, LiveStore) else pack_arrays({"v": vector})
    if field(rec, Key.STEP, str) == Stage.ADVERTISE:
        # configured as the embedded engine configures its clients (run_secure_sum)
        # with pinned identities, at least ``worst`` distinct pinned clients must sign the
        # survivor set before this node unmasks (the noise shares were sized for them)
        party = Client(client, field(rec, Key.SESSION, bytes), rnd, threshold=worst,
                       length=int(vector.size), ring_bits=bits, min_holders=min_holders,
                       **party_identity(store))
        out[Key.MSG] = party.advertise()
        out[Key.CPU_S] = cpu + time.process_time() - t0
        keep(store, party)
        return out
    if "party" not in store or store.get("party_n") != n:
        raise ProtocolError("share with the client step, but no party advertised ahead "
                            f"for a cohort of {n} on this node")
    party = kept(store)
    if party.round != rnd or party.stage != "advertised":
        raise ProtocolError(f"the party advertised ahead is round {party.round}'s "
                            f"({party.stage}), not round {rnd}'s")
    party.length, party.ring_bits = int(vector.size), bits
    party.threshold = max(int(party.threshold or 0), worst)
    out[Key.STEP_CPU_S] = cpu + time.process_time() - t0
    t0 = time.process_time()
    out[Key.MSG] = party.share_keys(field(rec, Key.MSG, bytes))
    out[Key.CPU_S] = time.process_time() - t0
    keep(store, party)
    return out


def stage(step: str, rec: Reply, store: NodeStore) -> dict[str, Any]:
    """One protocol stage of this node's party (see the module docstring)."""
    if "party" not in store:
        raise ProtocolError(f"secure-sum step {step!r} before 'advertise' on this node")
    party = kept(store)
    inbox = field(rec, Key.MSG, bytes)
    t0 = time.process_time()
    out: dict[str, Any] = {}
    if step == Stage.SHARE:
        out[Key.MSG] = party.share_keys(inbox)
    elif step == Stage.MASKED_INPUT:
        out[Key.ACK] = party.receive_forward(inbox)
        t1 = time.process_time()
        out[Key.ACK_CPU_S] = t1 - t0
        vector = store["vector"]
        out[Key.MSG] = party.masked_input(vector if isinstance(vector, np.ndarray)
                                          else unpack_arrays(vector)["v"])
        t0 = t1
    elif step == Stage.CONSISTENCY:
        out[Key.MSG] = party.sign_survivors(inbox)
    elif step == Stage.UNMASK:
        out[Key.MSG] = party.unmask(inbox)
    else:
        raise ProtocolError(f"unknown secagg step {step!r}")
    out[Key.CPU_S] = time.process_time() - t0
    if step == Stage.UNMASK:  # the session is over: forget its secrets
        _forget(store)
    else:
        keep(store, party)
    return out
