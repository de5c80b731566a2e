"""The client side on Flower: one secagg client per SuperNode, with its own data and keys.

:func:`client_app` returns a ``flwr.clientapp.ClientApp`` that answers the ServerApp of
:mod:`secagg.flower.server`. On each message it rebuilds the node's algorithm copy and its
:class:`~secagg.federation.ClientState` (the persistent private state -- e.g. FedLog's
body -- and any in-flight secure-sum party live in the node's ``Context.state``, which
Flower keeps on the node and never sends anywhere), runs the requested step, and replies
with secagg's wire bytes.

Steps (record field ``step``):

* ``hello``: the client id (its partition id) only. A node's number of records stays on
  the node: every step message carries the run's public ``max_records`` bound, and the
  node refuses its own upload when it holds more (as the embedded engine refuses it).
* ``upload`` (Plaintext): the phase's client step, ``Upload.validate``, and the upload
  packed with :func:`secagg.wire.pack_arrays`.
* ``advertise`` / ``share`` / ``masked-input`` / ``consistency`` / ``unmask`` (SecureSum):
  the stages of :class:`secagg.secure_sum.client.Client` (``consistency``: sign the survivor
  set the server shows); ``advertise`` first runs the client step and encodes the upload
  with the layer's fixed-point plan.
* Sessions are advertised ahead: the ``hello`` (for the run's first session) or an
  ``unmask`` instruction (for the next one) may carry a session's id, round and cohort
  size (``next_*`` fields); the node then also draws that session's keys and replies with
  its ADVERTISE (``next_msg``). A node of the next cohort outside this unmask gets
  ``advertise-next`` with the same fields. The session's ``share`` instruction then
  carries the client step (``with_step``): the node runs and encodes it, fixes its
  party's vector length and ring from the encoding, and shares its keys. A session thus
  costs four exchanges instead of five.
* ``evaluate`` (personalized algorithms): the node's accuracy on its own local test set
  with its own model and the server's evaluation state, and whether it has a local test
  set. After every round but the last it rides on the node's first message of the next
  round (``evaluate=True`` and ``eval_state`` beside the client step's fields: the node
  scores its model first, then runs the step, as the embedded engine orders them); only
  the last round's, and nodes outside the next cohort, get a message of their own.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from secagg.data import ClientData, Dataset, Partition
from secagg.errors import ConfigurationError, PrivacyError, ProtocolError
from secagg.federation import AlgorithmLike, ClientState
from secagg.flower.records import RECORD, content, field, read
from secagg.messages import Upload, UploadSpec
from secagg.privacy.policy import NodePolicy
from secagg.secure_sum.client import Client
from secagg.secure_sum.graph import auto_degree, resolve_threshold
from secagg.secure_sum.keys import KeyPairs, private_bytes
from secagg.wire import pack_arrays, unpack_arrays

PartitionLoader = Callable[[Context], tuple[Dataset, ClientData]]
"""Given the node's Flower ``Context``, its data set description and its own partition."""

_STATE = "secagg-node"  # ConfigRecord in Context.state (stays on the node)


def node_partition_loader(make_partition: Callable[[], Partition]) -> PartitionLoader:
    """A loader that picks the node's partition by ``node_config["partition-id"]`` (as
    ``flwr run``'s simulation and ``flower-supernode --node-config`` set it).

    Args:
        make_partition: builds the (deterministic) split of the data; called once per
            process and cached.
    """
    cache: dict[str, Partition] = {}

    def load(context: Context) -> tuple[Dataset, ClientData]:
        if "p" not in cache:
            cache["p"] = make_partition()
        part = cache["p"]
        pid = context.node_config.get("partition-id")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < len(part):
            raise ConfigurationError(
                f"node_config partition-id must be an int in 0..{len(part) - 1}, got {pid!r} "
                "(start the SuperNode with --node-config 'partition-id=K')"
            )
        return part.dataset, part[pid]

    return load


def _freeze(c: Client) -> bytes:
    """A secure-sum party as bytes for the node's own Context.state (private keys -- the two
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
    return pickle.dumps(d)


def _thaw(raw: bytes) -> Client:
    d = pickle.loads(raw)  # noqa: S301 - this node's own state, written by _freeze
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


class _Node:
    """The ClientApp's logic (kept apart from Flower's decorators for clarity)."""

    def __init__(
        self, algorithm: AlgorithmLike | Callable[[], AlgorithmLike], loader: PartitionLoader
    ) -> None:
        self._algorithm = algorithm
        self.loader = loader
        self._data: dict[int, tuple[Dataset, ClientData]] = {}

    def _load(self, context: Context) -> tuple[Dataset, ClientData]:
        key = int(context.node_id)
        if key not in self._data:
            self._data[key] = self.loader(context)
        return self._data[key]

    @property
    def algorithm(self) -> AlgorithmLike:
        """The algorithm (built on first use when a factory was given)."""
        if not hasattr(self._algorithm, "phases"):
            self._algorithm = self._algorithm()  # type: ignore[operator]
        return self._algorithm  # type: ignore[return-value]

    def _store(self, context: Context) -> ConfigRecord:
        if _STATE not in context.state.config_records:
            context.state.config_records[_STATE] = ConfigRecord()
        return context.state.config_records[_STATE]

    def handle(self, msg: Message, context: Context) -> Message:
        rec = read(msg)
        step = field(rec, "step", str)
        store = self._store(context)
        tag = field(rec, "run", str)
        if store.get("run") != tag:  # a new run: forget the previous run's private state
            for k in list(store.keys()):
                del store[k]
            store["run"] = tag
        if step == "hello":  # with SecureSum, ADVERTISE for the run's first session too
            _, data = self._load(context)
            store["cid"] = int(data.id)
            out: dict[str, Any] = {"cid": int(data.id)}  # no record count: it is private
            if "next_session" in rec:
                out.update(self._advertise_next(rec, context, store))
            return Message(content(**out), reply_to=msg)
        if step in ("upload", "advertise", "he-upload") or (
                step == "share" and rec.get("with_step") is True):
            out = self._client_step(rec, *self._load(context), store,
                                    policy=_policy(context))
        elif step == "evaluate":
            out = self._evaluate(field(rec, "state", bytes), field(rec, "seed", int),
                                 *self._load(context), store)
        elif step.startswith("he-"):
            out = _decryptor(step, rec, store)
        elif step == "advertise-next":
            out = self._advertise_next(rec, context, store)
        else:
            out = self._secure_sum(step, rec, store)
            if step == "unmask" and "next_session" in rec:
                out.update(self._advertise_next(rec, context, store))
        return Message(content(**out), reply_to=msg)

    def _advertise_next(self, rec: ConfigRecord, context: Context,
                        store: ConfigRecord) -> dict[str, Any]:
        """ADVERTISE for the next secure-sum session (its session id, round and cohort size
        in the ``next_*`` fields), sent ahead with the hello or the current session's
        unmask: fresh keys, and the party kept in the node's state until that session's
        share instruction brings the client step (which fixes the vector length and ring)."""
        for k in ("party", "vector", "party_n"):  # a session this node was dropped from
            if k in store:
                del store[k]
        cid = store["cid"] if "cid" in store else int(self._load(context)[1].id)
        from secagg.secure_sum import SecureSum

        layer = SecureSum(**json.loads(field(rec, "next_layer", str)))
        n = field(rec, "next_n", int)
        t, min_holders = session_bounds(layer, n)
        t0 = time.process_time()
        party = Client(int(cid), field(rec, "next_session", bytes), field(rec, "next_round", int),
                       threshold=t, min_holders=min_holders)
        msg = party.advertise()
        store["party"] = _freeze(party)
        store["party_n"] = n
        return {"next_msg": msg, "next_cpu_s": time.process_time() - t0}

    def _client_step(
        self, rec: ConfigRecord, dataset: Dataset, data: ClientData, store: ConfigRecord,
        policy: NodePolicy | None = None,
    ) -> dict[str, Any]:
        rnd, rounds = field(rec, "round", int), field(rec, "rounds", int)
        seed = field(rec, "seed", int)
        scored: dict[str, Any] = {}
        if rec.get("evaluate") is True:  # the previous round's evaluation, before this step
            scored = self._evaluate(field(rec, "eval_state", bytes), seed, dataset, data, store)
            scored = {"acc": scored["acc"], "has_test": scored["has_test"]}
        algo = copy.deepcopy(self.algorithm)  # one private copy per node and message
        st = ClientState(data)
        algo.setup(dataset, [st], seed)
        if "client_state" in store:
            st.state = pickle.loads(store["client_state"])  # noqa: S301 - own state
        name = field(rec, "phase", str)
        phases = [p for p in algo.phases(rnd, rounds) if p.name == name]
        if not phases:
            raise ProtocolError(f"round {rnd} has no phase {name!r} on this client")
        phase = phases[0]
        raw = rec.get("broadcast", b"")
        bcast = unpack_arrays(raw) if raw else {}
        if policy is not None:  # the node's floor, checked before its data is touched
            _check_policy(policy, rec, bcast)
        t0 = time.process_time()
        values = phase.client_step(st, bcast)
        cpu = time.process_time() - t0
        # the spec after the step: a phase whose bounds come with the broadcast (DP-FedAvg's
        # clip) declares the bound it was told to apply
        spec: UploadSpec = phase.spec()
        if spec.max_records is None:
            spec = replace(spec, max_records=field(rec, "max_records", int))
        up = Upload.validate(spec, values, st.id, st.n_records, field(rec, "on_violation", str))
        store["client_state"] = pickle.dumps(st.state)
        out: dict[str, Any] = {"cpu_s": cpu, "flops": float(phase.client_flops(st)),
                               "clipped": json.dumps(up.clipped), **scored}
        # DP noise added here, on the node, from the node's own noise stream: LocalDP
        # noises the upload before it leaves (the inner layer then carries the widened
        # spec); DistributedDP adds this node's noise share to its encoded vector below
        noiser, rng = None, None
        if "dp" in rec:  # (imported here: a node's messages without DP skip the accountant)
            from secagg.privacy.layers import LocalDP, noise_source

            t0 = time.process_time()
            noiser = self._noiser(rec)
            rng = noise_source(noiser.seed, rnd, name, int(st.id)).rng
            if isinstance(noiser, LocalDP):
                sigmas, wide = noiser.noise_plan(spec)
                if sigmas:
                    up, spec = noiser.noise_upload(up, spec, sigmas, wide, rng), wide
            out["cpu_s"] = cpu = cpu + time.process_time() - t0
        if field(rec, "step", str) == "upload":
            t0 = time.process_time()
            out["msg"] = pack_arrays({f.name: up[f.name] for f in spec.fields})
            out["cpu_s"] = cpu + time.process_time() - t0
            return out
        if field(rec, "step", str) == "he-upload":
            return {**out, **_encrypt(rec, spec, up, store)}
        from secagg.secure_sum import SecureSum

        store["cid"] = int(st.id)
        layer = SecureSum(**json.loads(field(rec, "layer", str)))
        n = field(rec, "n", int)
        t, min_holders = session_bounds(layer, n)
        t0 = time.process_time()
        if noiser is not None and hasattr(noiser, "release_plan"):  # DistributedDP: the
            release = noiser.release_plan(spec, n)  # server's release plan, derived here
            vector, bits = noiser.encode_noised(release, up, rng), release.ring_bits
        else:
            plans = layer.plan(spec, n)
            bits = next(iter(plans.values())).ring_bits if plans else 8
            parts = [p.encode(np.asarray(up[f])) for f, p in plans.items()]
            vector = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        store["vector"] = pack_arrays({"v": vector})
        if field(rec, "step", str) == "advertise":
            # configured as the embedded engine configures its clients (run_secure_sum)
            party = Client(st.id, field(rec, "session", bytes), rnd, threshold=t,
                           length=int(vector.size), ring_bits=bits, min_holders=min_holders)
            out["msg"] = party.advertise()
            out["cpu_s"] = cpu + time.process_time() - t0
            store["party"] = _freeze(party)
            return out
        # share, with the step: the party advertised ahead (with the hello or the previous
        # session's unmask); its vector length and ring are fixed now, before the ROSTER is
        # read (which must announce the same)
        if "party" not in store or store.get("party_n") != n:
            raise ProtocolError("share with the client step, but no party advertised ahead "
                                f"for a cohort of {n} on this node")
        party = _thaw(store["party"])
        if party.round != rnd or party.stage != "advertised":
            raise ProtocolError(f"the party advertised ahead is round {party.round}'s "
                                f"({party.stage}), not round {rnd}'s")
        party.length, party.ring_bits = int(vector.size), bits
        out["step_cpu_s"] = cpu + time.process_time() - t0
        t0 = time.process_time()
        out["msg"] = party.share_keys(field(rec, "msg", bytes))
        out["cpu_s"] = time.process_time() - t0
        store["party"] = _freeze(party)
        return out

    @staticmethod
    def _noiser(rec: ConfigRecord) -> Any:
        """The noise side of the run's DP layer, rebuilt from the instruction's ``dp``
        parameters (:func:`secagg.privacy.layers.node_layer`; DistributedDP around the
        session's SecureSum, whose threshold sizes each share); parameters the node cannot
        check are a ProtocolError (an error reply: the node drops, it never noises less)."""
        from secagg.errors import PrivacyError
        from secagg.layers.plaintext import Plaintext
        from secagg.privacy.layers import DistributedDP, node_layer
        from secagg.secure_sum import SecureSum

        try:
            params = json.loads(field(rec, "dp", str))
            inner = (SecureSum(**json.loads(field(rec, "layer", str))) if "layer" in rec
                     and params.get("layer") == DistributedDP.name else Plaintext())
            return node_layer(params, inner)
        except (PrivacyError, ConfigurationError, ValueError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"DP parameters refused: {exc}") from None

    def _evaluate(
        self, raw: bytes, seed: int, dataset: Dataset, data: ClientData, store: ConfigRecord
    ) -> dict[str, Any]:
        """A personalized algorithm's accuracy for this client: its own model (as its last
        client step left it) with the server's evaluation state ``raw`` (packed arrays,
        e.g. FedLog's head)."""
        algo = copy.deepcopy(self.algorithm)
        st = ClientState(data)
        algo.setup(dataset, [st], seed)
        if "client_state" in store:
            st.state = pickle.loads(store["client_state"])  # noqa: S301 - own state
        algo.load_evaluation_state(unpack_arrays(raw) if raw else {})
        t0 = time.process_time()
        acc = float(algo.evaluate(dataset, [st]))
        cpu = time.process_time() - t0
        # the embedded engine keeps whatever evaluation leaves in the client's state
        store["client_state"] = pickle.dumps(st.state)
        has_test = data.y_test is not None and len(data.y_test) > 0
        return {"acc": acc, "has_test": bool(has_test), "cpu_s": cpu}

    def _secure_sum(self, step: str, rec: ConfigRecord, store: ConfigRecord) -> dict[str, Any]:
        if "party" not in store:
            raise ProtocolError(f"secure-sum step {step!r} before 'advertise' on this node")
        party = _thaw(store["party"])
        inbox = field(rec, "msg", bytes)
        t0 = time.process_time()
        out: dict[str, Any] = {}
        if step == "share":
            out["msg"] = party.share_keys(inbox)
        elif step == "masked-input":
            out["ack"] = party.receive_forward(inbox)
            t1 = time.process_time()
            out["ack_cpu_s"] = t1 - t0
            out["msg"] = party.masked_input(unpack_arrays(store["vector"])["v"])
            t0 = t1
        elif step == "consistency":
            out["msg"] = party.sign_survivors(inbox)
        elif step == "unmask":
            out["msg"] = party.unmask(inbox)
        else:
            raise ProtocolError(f"unknown secagg step {step!r}")
        out["cpu_s"] = time.process_time() - t0
        if step == "unmask":  # the session is over: forget its secrets
            for k in ("party", "vector", "party_n"):
                if k in store:
                    del store[k]
        else:
            store["party"] = _freeze(party)
        return out


def _he_layer(rec: ConfigRecord) -> Any:
    from secagg.homomorphic import Homomorphic

    cfg = json.loads(field(rec, "layer", str))
    keys = ("scheme", "poly_modulus_degree", "key_holder", "precision", "max_clients",
            "max_decryptions", "flood_security_bits")
    return Homomorphic(**{k: cfg[k] for k in keys if k in cfg})


def _encrypt(
    rec: ConfigRecord, spec: UploadSpec, up: Upload, store: ConfigRecord
) -> dict[str, Any]:
    """Homomorphic: pack, (BFV: fixed-point encode,) encrypt under the decryptor's public
    context (relayed by the server once per run and parameter set, then kept on the node);
    the frames go back as a list of bytes."""
    from secagg.homomorphic.keys import Encryptor
    from secagg.homomorphic.packing import Packing, fingerprint

    layer = _he_layer(rec)
    n_plan = field(rec, "n_plan", int)
    t0 = time.process_time()
    params = layer.params_for(spec, n_plan)
    fps = layer.fixed_point(spec, n_plan) if layer.scheme == "bfv" else None
    key = "he-context/" + field(rec, "params", str)
    if "context" in rec:
        store[key] = field(rec, "context", bytes)
    if key not in store:
        raise ProtocolError("he-upload without the public context, and none is held")
    pub = store[key]
    enc = Encryptor(layer.scheme, pub, fingerprint(pub))
    packing = Packing.from_spec(spec, params.slots)
    frames = enc.encrypt(layer._flatten(up, spec, packing, fps), packing)
    return {"frames": [bytes(f) for f in frames],
            "enc_cpu_s": time.process_time() - t0}


def _decryptor(step: str, rec: ConfigRecord, store: ConfigRecord) -> dict[str, Any]:
    """The designated decryptor's steps: ``he-keygen`` (keys for the params the server asks
    for; the secret context stays in this node's Context.state) and ``he-decrypt`` (the
    aggregate ciphertext to the flat clear sum)."""
    import tenseal as ts

    from secagg.homomorphic.keys import KeyHolder
    from secagg.homomorphic.packing import Packing, fingerprint
    from secagg.homomorphic.params import HEParams
    from secagg.privacy.samplers import noise_generator

    d = json.loads(field(rec, "params", str))
    d["coeff_mod_bit_sizes"] = tuple(d["coeff_mod_bit_sizes"])
    params = HEParams(**d)
    key = "he-secret/" + field(rec, "params", str)
    t0 = time.process_time()
    if step == "he-keygen":
        holder = KeyHolder(params, "decryptor")
        store[key] = holder._ctx.serialize(save_public_key=True, save_secret_key=True,
                                           save_galois_keys=False, save_relin_keys=False)
        store[key + "/public"] = holder.public_context
        store[key + "/decryptions"] = 0  # a new key: its CKKS decryption quota starts afresh
        return {"msg": holder.public_context, "cpu_s": time.process_time() - t0}
    if step != "he-decrypt":
        raise ProtocolError(f"unknown secagg step {step!r}")
    if key not in store:
        raise ProtocolError("he-decrypt for parameters this node holds no keys of")
    holder = KeyHolder.__new__(KeyHolder)
    holder.params, holder.mode = params, "decryptor"
    holder._ctx = ts.context_from(store[key], n_threads=1)
    holder.public_context = holder.client_context = store[key + "/public"]
    holder.fingerprint = fingerprint(holder.public_context)
    # the key's decryption count (CKKS quota) persists on the node with the key; the flooding
    # noise generator is fresh (a new OS key) per message
    holder.decryptions = int(store.get(key + "/decryptions", 0))
    holder._noise = noise_generator()
    p = json.loads(field(rec, "packing", str))
    packing = Packing(tuple(p["names"]), tuple(tuple(x) for x in p["shapes"]),
                      tuple(p["offsets"]), int(p["total"]), int(p["slots"]))
    frames = rec.get("frames")
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise ProtocolError("he-decrypt without the aggregate's frames")
    flat = holder.decrypt(frames, packing)
    store[key + "/decryptions"] = holder.decryptions
    return {"msg": pack_arrays({"flat": flat}), "cpu_s": time.process_time() - t0}


def _policy(context: Context) -> NodePolicy:
    """The node's own privacy floor from its node config (:mod:`secagg.privacy.policy`);
    a malformed one is a ProtocolError (the node drops rather than guess)."""
    try:
        return NodePolicy.from_node_config(context.node_config)
    except PrivacyError as exc:
        raise ProtocolError(f"node config: {exc}") from None


def _check_policy(policy: NodePolicy, rec: ConfigRecord, bcast: dict[str, np.ndarray]) -> None:
    """Refuse an instruction whose noise or clip is weaker than the node's floor: the node
    adds the noise under LocalDP and DistributedDP and applies the clip, so a ServerApp
    cannot lower either below what the node accepts (the refusal is an error reply: the
    node drops and sends nothing)."""
    try:
        dp = json.loads(field(rec, "dp", str)) if "dp" in rec else None
        clip = float(np.asarray(bcast["clip"]).ravel()[0]) if "clip" in bcast else None
        policy.check(dp, clip)
    except (PrivacyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"instruction refused by this node's privacy policy: {exc}") \
            from None


def client_app(
    algorithm: AlgorithmLike | Callable[[], AlgorithmLike], partition_loader: PartitionLoader
) -> ClientApp:
    """A Flower ClientApp that plays one secagg client of ``algorithm`` on each SuperNode.

    Args:
        algorithm: the same algorithm (and hyper-parameters) the ServerApp runs, or a
            zero-argument factory of it (then heavy imports such as torch happen only in
            the messages that run a client step, not in every secure-sum stage); each node
            works on its own copy.
        partition_loader: ``(context) -> (dataset, client_data)``; the node's own data
            (e.g. :func:`node_partition_loader`). ``client_data.id`` is the client id the
            server sees (ids must be unique across nodes).
    """
    node = _Node(algorithm, partition_loader)
    app = ClientApp()

    @app.train("secagg")
    def _secagg(msg: Message, context: Context) -> Message:
        return node.handle(msg, context)

    return app


__all__ = ["PartitionLoader", "client_app", "node_partition_loader", "RECORD"]
