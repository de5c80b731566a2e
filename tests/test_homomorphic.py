"""Homomorphic layer: exact BFV sums, CKKS within its stated bound, key roles, packing,
malformed and foreign ciphertexts, ledger and transcript."""

from __future__ import annotations

import math
import struct
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import tenseal as ts

from secagg.dropouts import ScheduledDropouts
from secagg.encoding import plan
from secagg.errors import (
    ConfigurationError,
    EncodingOverflow,
    InadmissibleField,
    ProtocolError,
    SecureSumAborted,
)
from secagg.homomorphic import (
    Aggregator,
    CiphertextError,
    Encryptor,
    ForeignContextError,
    Homomorphic,
    KeyHolder,
    KeyRoleError,
    Packing,
    bfv_params,
    ckks_params,
)
from secagg.homomorphic.packing import join_message
from secagg.homomorphic.params import MAX_MODULUS_BITS, is_prime
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec

C, D = 10, 16          # FedLog: classes, feature dim
B = 2.0                # feature clamp
MAX_REC = 50
P = 5000               # FedAvg: parameters (more than one BFV / CKKS ciphertext)


def fedlog_spec() -> UploadSpec:
    return UploadSpec((
        Field("stats", (C, D + 1), "float64", bound=Bound(linf=B), additive=True),
        Field("n", (1,), "int64", bound=Bound(linf=1.0), additive=True),
    ), max_records=MAX_REC)


def fedlog_uploads(spec: UploadSpec, n_clients: int, seed: int = 0) -> dict[int, Upload]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in range(n_clients):
        n = int(rng.integers(1, MAX_REC + 1))
        y = rng.integers(0, C, n)
        phi = rng.uniform(-B, B, (n, D))
        stats = np.zeros((C, D + 1))
        np.add.at(stats, y, np.concatenate([np.ones((n, 1)), phi], axis=1))
        out[c] = Upload.validate(spec, {"stats": stats, "n": np.array([n])}, c, n)
    return out


def fedavg_spec() -> UploadSpec:
    return UploadSpec((
        Field("n", (1,), "int64", bound=Bound(linf=1.0), additive=True),
        Field("weighted_params", (P,), "float64", bound=Bound(linf=1.0), additive=True),
    ), max_records=MAX_REC)


def fedavg_uploads(spec: UploadSpec, n_clients: int, seed: int = 1) -> dict[int, Upload]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in range(n_clients):
        n = int(rng.integers(1, MAX_REC + 1))
        w = n * rng.uniform(-1, 1, P)
        out[c] = Upload.validate(spec, {"n": np.array([n]), "weighted_params": w}, c, n)
    return out


def quantised_sum(uploads: dict[int, Upload], name: str, clients, scale_bits: int) -> np.ndarray:
    """Exact sum of round(x * 2^f) over clients, in int64 (independent of the layer)."""
    acc = 0
    for c in clients:
        acc = acc + np.rint(np.ldexp(np.asarray(uploads[c][name], dtype=np.float64),
                                     scale_bits)).astype(np.int64)
    return acc


def keyset(params, mode: str = "decryptor") -> SimpleNamespace:
    """A key holder for ``params`` and the client and server roles of its keys (the
    layer's own keys live in its driver: ``layer.local.server.keys``)."""
    holder = KeyHolder(params, mode)
    return SimpleNamespace(holder=holder, aggregator=Aggregator(params.scheme, holder.public_context),
                           encryptor=Encryptor(params.scheme, holder.client_context,
                                               holder.fingerprint))


def driver_keys(layer: Homomorphic) -> tuple[bytes, Aggregator]:
    """The public context and the server's aggregator of the layer's in-process driver."""
    ((pub, aggregator, _, _),) = layer.local.server.keys.values()
    return pub, aggregator


def ctx(round_: int = 0, dropouts=None) -> RoundContext:
    if dropouts is None:
        return RoundContext(round_, "p", 0)
    return RoundContext(round_, "p", 0, dropouts=dropouts)


# --- BFV: exact -------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["fedlog", "fedavg"])
def test_bfv_sum_equals_sum_of_quantised_inputs(make):
    spec = fedlog_spec() if make == "fedlog" else fedavg_spec()
    ups = (fedlog_uploads if make == "fedlog" else fedavg_uploads)(spec, 5)
    layer = Homomorphic("bfv", precision=2.0**-24)
    drop = ScheduledDropouts({"upload": {1}})
    agg = layer.aggregate(ups, spec, ctx(dropouts=drop))
    live = [0, 2, 3, 4]
    assert agg.contributors == tuple(live)
    float_field = "stats" if make == "fedlog" else "weighted_params"
    want = np.ldexp(quantised_sum(ups, float_field, live, 24).astype(np.float64), -24)
    assert np.array_equal(agg[float_field], want)
    n_sum = sum(int(ups[c]["n"][0]) for c in live)
    assert agg["n"].dtype == np.int64 and agg["n"].tolist() == [n_sum]
    # The planned ring is the smallest that holds the cohort's sum, within t.
    params = agg.notes["he_params"]
    assert params["plain_modulus"] > 2 ** params["ring_bits"]


def test_bfv_negative_and_extreme_values_do_not_wrap():
    spec = UploadSpec((Field("x", (8,), bound=Bound(linf=3.0, adjacency="client"), additive=True),))
    vals = {0: np.full(8, -3.0), 1: np.full(8, -3.0), 2: np.array([3.0, -3, 0, 1e-3, -1e-3, 2.5,
                                                                  -2.5, 3])}
    ups = {c: Upload.validate(spec, {"x": v}, c, 1) for c, v in vals.items()}
    agg = Homomorphic("bfv", precision=1e-6).aggregate(ups, spec, ctx())
    f = plan(spec, 4, 1e-6)["x"].scale_bits
    want = np.ldexp(quantised_sum(ups, "x", [0, 1, 2], f).astype(np.float64), -f)
    assert np.array_equal(agg["x"], want)
    assert agg["x"][0] == -3.0


def test_bfv_exact_at_the_edge_of_the_largest_ring():
    """64 clients at +-bound in a 59-bit ring under a 60-bit t: no wrap, no noise error."""
    bound = 2.0**12 - 1
    spec = UploadSpec((Field("x", (64,), bound=Bound(linf=bound, adjacency="client"), additive=True),))
    sign = np.where(np.arange(64) % 2 == 0, 1.0, -1.0)
    ups = {c: Upload.validate(spec, {"x": sign * bound}, c, 1) for c in range(64)}
    layer = Homomorphic("bfv", precision=2.0**-40, max_clients=64)
    agg = layer.aggregate(ups, spec, ctx())
    assert agg.notes["he_params"]["ring_bits"] == 59
    assert agg.notes["he_params"]["plain_modulus"].bit_length() == 60
    assert np.array_equal(agg["x"], sign * bound * 64)


def test_bfv_refuses_a_plan_beyond_the_plain_modulus():
    spec = UploadSpec((Field("x", (4,), bound=Bound(linf=1e9, adjacency="client"), additive=True),))
    layer = Homomorphic("bfv", precision=1e-12)
    with pytest.raises(EncodingOverflow):
        layer.params_for(spec, 16)
    with pytest.raises(EncodingOverflow):
        bfv_params(60, 2)


# --- CKKS: within the stated bound -------------------------------------------------------


@pytest.mark.parametrize("make", ["fedlog", "fedavg"])
def test_ckks_sum_within_stated_bound(make):
    spec = fedlog_spec() if make == "fedlog" else fedavg_spec()
    ups = (fedlog_uploads if make == "fedlog" else fedavg_uploads)(spec, 6)
    precision = 1e-6
    layer = Homomorphic("ckks", precision=precision)
    agg = layer.aggregate(ups, spec, ctx())
    bound = agg.notes["error_bound"]
    assert 0 < bound <= precision
    for f in spec.fields:
        exact = sum(np.asarray(ups[c][f.name], dtype=np.float64) for c in range(6))
        err = np.max(np.abs(agg[f.name] - exact))
        assert err <= bound, (f.name, err, bound)
    assert agg["n"].dtype == np.int64
    assert agg["n"][0] == sum(int(ups[c]["n"][0]) for c in range(6))


def test_ckks_bound_holds_at_a_coarse_precision():
    """With a coarse target the scale is small, so the noise is visible -- and bounded."""
    spec = fedavg_spec()
    ups = fedavg_uploads(spec, 4, seed=3)
    agg = Homomorphic("ckks", precision=1e-2).aggregate(ups, spec, ctx())
    exact = sum(np.asarray(ups[c]["weighted_params"]) for c in range(4))
    err = np.max(np.abs(agg["weighted_params"] - exact))
    assert 0 < err <= agg.notes["error_bound"] <= 1e-2


@pytest.mark.parametrize("make", ["fedlog", "fedavg"])
def test_ckks_release_is_on_the_precision_grid(make):
    """The server receives multiples of the power-of-two grid below the precision, not raw
    decryptions (whose low digits carry the key-dependent error)."""
    spec = fedlog_spec() if make == "fedlog" else fedavg_spec()
    ups = (fedlog_uploads if make == "fedlog" else fedavg_uploads)(spec, 4, seed=5)
    precision = 1e-6
    agg = Homomorphic("ckks", precision=precision).aggregate(ups, spec, ctx())
    grid = agg.notes["flooding"]["grid"]
    assert grid == 2.0 ** math.floor(math.log2(precision / 4))
    x = agg["stats" if make == "fedlog" else "weighted_params"]
    assert np.array_equal(np.rint(x / grid) * grid, x)
    flood = agg.notes["flooding"]
    assert 0 < flood["required_sigma"] <= flood["sigma"] and flood["statistical_security_bits"] == 40
    assert agg.notes["error_bound"] >= 8 * flood["sigma"] + grid / 2


def _ckks_aggregate_message(n_clients: int = 5, **kw):
    spec = fedavg_spec()
    ups = fedavg_uploads(spec, n_clients, seed=7)
    layer = Homomorphic("ckks", **kw)
    params = layer.params_for(spec, 8)
    ks = keyset(params)
    packing = Packing.from_spec(spec, params.slots)
    ks.aggregator.start(packing)
    for c in range(n_clients):
        ks.aggregator.add(ks.encryptor.encrypt(layer._flatten(ups[c], spec, packing, None),
                                               packing))
    exact = packing.flatten({f.name: sum(np.asarray(ups[c][f.name], dtype=np.float64)
                                         for c in range(n_clients)) for f in spec.additive},
                            np.float64)
    return ks, packing, ks.aggregator.finish(), exact, params


def test_ckks_release_adds_fresh_flooding_noise_each_decryption():
    """Two releases of the same ciphertext differ (fresh noise each call); both differ from
    the raw decryption by noise of the stated std (plus the rounding), within the bound."""
    ks, packing, wire, exact, params = _ckks_aggregate_message()
    raw = ks.holder._decrypt_raw(wire, packing)
    a = ks.holder.decrypt(wire, packing)
    b = ks.holder.decrypt(wire, packing)
    # sigma = precision/16 is ~0.26 grid steps, so about 30% of entries round differently
    assert np.mean(a != b) > 0.15
    assert np.mean(np.rint(raw / params.grid) * params.grid != raw) > 0.9  # raw: off the grid
    for rel in (a, b):
        d = rel - raw
        # flooding N(0, sigma^2), then rounding to the grid: std sqrt(sigma^2 + g^2/12)
        want = math.sqrt(params.flood_sigma**2 + params.grid**2 / 12)
        assert 0.9 < d.std() / want < 1.1, (d.std(), want)
        assert abs(d.mean()) < 5 * want / math.sqrt(d.size)
        assert np.max(np.abs(rel - exact)) <= params.notes["error_bound"]
    assert ks.holder.decryptions == 3 * packing.n_ciphertexts


def test_ckks_key_answers_a_bounded_number_of_decryptions_then_is_replaced():
    ks, packing, wire, _, params = _ckks_aggregate_message(max_decryptions=2 * 3)
    assert packing.n_ciphertexts == 3 and params.max_decryptions == 6
    ks.holder.decrypt(wire, packing)
    ks.holder.decrypt(wire, packing)
    with pytest.raises(KeyRoleError, match="generate a new key"):
        ks.holder.decrypt(wire, packing)
    # The layer replaces the key before its quota runs out, and books the new keys.
    spec = fedavg_spec()
    ups = fedavg_uploads(spec, 2)
    layer = Homomorphic("ckks", max_decryptions=6)
    c = ctx()
    prints = []
    for r in range(3):
        layer.aggregate(ups, spec, ctx(r) if r else c)
        prints.append(driver_keys(layer)[0])
    assert prints[0] == prints[1] != prints[2]
    with pytest.raises(ConfigurationError, match="max_decryptions"):
        Homomorphic("ckks", max_decryptions=2).aggregate(ups, spec, ctx())


def test_canonical_embedding_is_sqrt_half_n_times_orthogonal():
    """The flooding sizing's change of domain: slot values (real and imaginary parts of the
    N/2 slots) are sqrt(N/2) times an orthogonal map of the N coefficients, so i.i.d. slot
    noise is i.i.d. coefficient noise (checked for N = 16 with SEAL's slot roots)."""
    n = 16
    roots = np.exp(1j * np.pi * (2 * np.arange(n // 2) + 1) / n)  # one of each conjugate pair
    v = roots[:, None] ** np.arange(n)[None, :]                     # (N/2) x N
    m = np.vstack([v.real, v.imag])                                 # N x N real
    np.testing.assert_allclose(m.T @ m, (n / 2) * np.eye(n), atol=1e-9)


def test_ckks_refuses_precision_beyond_float64():
    with pytest.raises(EncodingOverflow):
        ckks_params(1e9, 8, 1e-12)


# --- parameters and packing --------------------------------------------------------------


@pytest.mark.parametrize("ring,n", [(20, 1), (43, 8), (59, 64)])
def test_bfv_parameters_are_valid_and_secure(ring, n):
    p = bfv_params(ring, n)
    t, big_n = p.plain_modulus, p.poly_modulus_degree
    assert is_prime(t) and t % (2 * big_n) == 1 and t > 2**ring and t.bit_length() <= 60
    assert sum(p.coeff_mod_bit_sizes) <= MAX_MODULUS_BITS[big_n]
    # noise margin above t: log2(n) + log2(N) + 6 bits
    assert p.data_bits >= t.bit_length() + math.ceil(math.log2(n)) + int(math.log2(big_n)) + 6


def test_is_prime_agrees_with_trial_division():
    small = [k for k in range(2, 3000) if all(k % d for d in range(2, int(k**0.5) + 1))]
    assert [k for k in range(3000) if is_prime(k)] == small
    assert is_prime(2**61 - 1) and not is_prime(2**61 + 1)


@pytest.mark.parametrize("scheme", ["bfv", "ckks"])
def test_packing_uses_ceil_values_over_slots(scheme):
    spec = fedavg_spec()
    layer = Homomorphic(scheme)
    params = layer.params_for(spec, 4)
    packing = Packing.from_spec(spec, params.slots)
    total = 1 + P
    assert packing.total == total
    assert packing.n_ciphertexts == math.ceil(total / params.slots) >= 2
    assert [b - a for a, b in packing.chunks()][:-1] == [params.slots] * (packing.n_ciphertexts - 1)
    big = Packing(("x",), ((10**6,),), (0,), 10**6, params.slots)
    assert big.utilisation >= 0.95
    ups = fedavg_uploads(spec, 3)
    agg = layer.aggregate(ups, spec, ctx())
    assert agg.notes["ciphertexts_per_upload"] == packing.n_ciphertexts


# --- key roles -----------------------------------------------------------------------------


@pytest.mark.parametrize("key_holder", ["decryptor", "clients"])
def test_aggregator_holds_no_secret_key(key_holder):
    spec = fedlog_spec()
    layer = Homomorphic("bfv", key_holder=key_holder)
    layer.aggregate(fedlog_uploads(spec, 3), spec, ctx())
    _, aggregator = driver_keys(layer)
    server_ctx = aggregator.context
    assert not server_ctx.has_secret_key() and not server_ctx.is_private()
    assert server_ctx.is_public()
    # The server's sum cannot be decrypted with what the server holds.
    with pytest.raises(ValueError):
        aggregator.accumulators[0].decrypt()
    # Handing the server a context that holds the secret key is refused.
    ks = keyset(layer.params_for(spec, 4), key_holder)
    secret = ks.holder._ctx.serialize(save_secret_key=True, save_relin_keys=False,
                                      save_galois_keys=False)
    with pytest.raises(KeyRoleError):
        Aggregator("bfv", secret)
    assert ks.holder.client_context != ks.holder.public_context or key_holder == "decryptor"
    assert ts.context_from(ks.holder.client_context).has_secret_key() == (key_holder == "clients")
    # who holds the secret key: the decryptor's node alone, or every client's
    holders = sorted(c for c, store in layer.local.stores.items()
                     if any(k.startswith("he-secret/") for k in store))
    assert holders == ([0] if key_holder == "decryptor" else [0, 1, 2])


def test_describe_and_transcript_name_the_key_holder():
    spec = fedlog_spec()
    layer = Homomorphic("ckks", key_holder="decryptor")
    d = layer.describe()
    assert d["key_holder"] == "decryptor" and d["decrypting_party"] == "decryptor"
    assert d["secret_key_held_by"] == ["decryptor"] and "server" not in d["secret_key_held_by"]
    c = ctx()
    layer.aggregate(fedlog_uploads(spec, 3), spec, c)
    obs = list(c.transcript.observations())
    server_uploads = [o for o in obs if o["party"] == "server" and o["what"] == "upload"]
    assert server_uploads and all(o["form"] == "encrypted" for o in server_uploads)
    clear = {(o["party"], o["form"]) for o in obs if o["what"] == "sum"}
    assert ("server", "encrypted") in clear and ("decryptor", "encrypted") in clear
    assert ("decryptor", "clear") in clear
    # the server never sees an individual upload in the clear
    assert not [o for o in obs if o["party"] == "server" and o["what"] == "upload"
                and o["form"] == "clear"]
    assert Homomorphic("bfv", key_holder="clients").describe()["secret_key_held_by"] == [
        "every client"]


def test_clients_mode_decrypts_at_a_surviving_client_or_aborts():
    spec = fedlog_spec()
    ups = fedlog_uploads(spec, 4)
    layer = Homomorphic("bfv", key_holder="clients")
    c = ctx(dropouts=ScheduledDropouts({"decrypt": {0}}))
    agg = layer.aggregate(ups, spec, c)
    assert agg["n"][0] == sum(int(ups[k]["n"][0]) for k in range(4))
    dec = [r for r in c.ledger.rows if r.stage == "decrypt"]
    assert len(dec) == 1 and dec[0].receiver == 1
    with pytest.raises(SecureSumAborted):
        layer.aggregate(ups, spec, ctx(dropouts=ScheduledDropouts({"decrypt": {0, 1, 2, 3}})))
    # Everyone drops before uploading: an empty, correctly typed sum and no upload rows.
    c2 = ctx(dropouts=ScheduledDropouts({"upload": {0, 1, 2, 3}}))
    empty = layer.aggregate(ups, spec, c2)
    assert empty.contributors == () and empty["n"].tolist() == [0]
    assert not [r for r in c2.ledger.rows if r.stage == "upload"]


def test_ckks_refuses_a_value_beyond_the_bound_it_was_sized_for():
    spec = UploadSpec((Field("x", (4,), bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    good = Upload.validate(spec, {"x": np.zeros(4)}, 0, 1)
    bad = Upload({"x": np.array([0.0, 5.0, 0.0, 0.0])}, spec, 1, 1)  # skips validation
    with pytest.raises(EncodingOverflow):
        Homomorphic("ckks").aggregate({0: good, 1: bad}, spec, ctx())


# --- server-side addition ------------------------------------------------------------------


def test_server_adds_in_place_without_copies(monkeypatch):
    spec = fedavg_spec()
    ups = fedavg_uploads(spec, 3)
    layer = Homomorphic("ckks")
    params = layer.params_for(spec, 4)
    ks = keyset(params)
    packing = Packing.from_spec(spec, params.slots)
    wires = [ks.encryptor.encrypt(layer._flatten(ups[c], spec, packing, None), packing)
             for c in range(3)]
    copies = []
    original = ts.Context.copy
    monkeypatch.setattr(ts.Context, "copy", lambda self: copies.append(1) or original(self))
    agg = ks.aggregator
    agg.start(packing)
    agg.add(wires[0])
    ids = [id(a) for a in agg.accumulators]
    data_ids = [id(a.data) for a in agg.accumulators]
    agg.add(wires[1])
    agg.add(wires[2])
    assert [id(a) for a in agg.accumulators] == ids
    assert [id(a.data) for a in agg.accumulators] == data_ids
    assert copies == []
    flat = ks.holder.decrypt(agg.finish(), packing)
    exact = sum(np.asarray(ups[c]["weighted_params"]) for c in range(3))
    assert np.max(np.abs(flat[1:] - exact)) <= 1e-6


# --- malformed and foreign ciphertexts ------------------------------------------------------


def _setup(scheme="bfv"):
    spec = fedlog_spec()
    ups = fedlog_uploads(spec, 3)
    layer = Homomorphic(scheme)
    params = layer.params_for(spec, 4)
    ks = keyset(params)
    packing = Packing.from_spec(spec, params.slots)
    fps = layer.fixed_point(spec, 4) if scheme == "bfv" else None
    wire = ks.encryptor.encrypt(layer._flatten(ups[0], spec, packing, fps), packing)
    return layer, ks, packing, wire, params


def _reframe(wire: bytes, body: bytes) -> bytes:
    """Replace the single ciphertext of a message, with a valid checksum."""
    head = bytearray(wire[:34])
    head[22:26] = struct.pack(">I", zlib.crc32(body))
    return bytes(head) + struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("scheme", ["bfv", "ckks"])
def test_malformed_ciphertexts_raise_typed_errors(scheme):
    layer, ks, packing, frames, _ = _setup(scheme)
    assert len(frames) == 2  # header + one ciphertext
    head, body = frames
    wire = join_message(frames)  # the single-buffer form
    agg = ks.aggregator
    agg.start(packing)
    bad = {
        "truncated": wire[:-100],
        "header only": wire[:20],
        "bad magic": b"XXX" + wire[3:],
        "flipped body byte": wire[:5000] + bytes([wire[5000] ^ 0xFF]) + wire[5001:],
        "trailing": wire + b"\x00",
        "garbage ciphertext": _reframe(wire, b"\x5e\xa1" * 500),
        "not bytes": "hello",
        "frames: none": (),
        "frames: header only": (head,),
        "frames: one too many": (head, body, body),
        "frames: truncated ciphertext": (head, body[:-1]),
        "frames: header with trailing byte": (head + b"\x00", body),
        "frames: flipped ciphertext byte": (head, body[:99] + bytes([body[99] ^ 1]) + body[100:]),
        "frames: not bytes": (head, bytearray(body)),
        "frames: a string": (head, "x" * len(body)),
        "frames: garbage ciphertext": tuple(_split(_reframe(wire, b"\x5e\xa1" * 500))),
    }
    for name, data in bad.items():
        with pytest.raises(CiphertextError):
            agg.add(data)  # type: ignore[arg-type]
        assert agg.count == 0, name
    assert issubclass(CiphertextError, ProtocolError)
    agg.add(wire)  # a good upload still goes through afterwards, in either form
    agg.add(list(frames))
    assert agg.count == 2


def _split(wire: bytes) -> list[bytes]:
    """Frames of a one-ciphertext single-buffer message."""
    return [wire[:38], wire[38:]]


def test_foreign_context_ciphertexts_raise_typed_errors():
    layer, ks, packing, wire, params = _setup("bfv")
    # Same parameters, other keys: caught by the context fingerprint.
    other = KeyHolder(params)
    foreign = Encryptor("bfv", other.client_context, other.fingerprint)
    flat = np.zeros(packing.total, dtype=np.int64)
    agg = ks.aggregator
    agg.start(packing)
    with pytest.raises(ForeignContextError):
        agg.add(foreign.encrypt(flat, packing))
    # Other parameters, even with our fingerprint forged on the message: SEAL rejects it.
    big = bfv_params(params.ring_bits, 4, poly_modulus_degree=8192)
    holder8k = KeyHolder(big)
    forged = Encryptor("bfv", holder8k.client_context, ks.aggregator.fingerprint)
    with pytest.raises(ForeignContextError):
        agg.add(forged.encrypt(flat, packing))
    # A CKKS message sent to a BFV aggregator.
    _, ks_ckks, _, wire_ckks, _ = _setup("ckks")
    with pytest.raises(ForeignContextError):
        agg.add(wire_ckks)
    assert agg.count == 0
    # The key holder refuses an aggregate made under another context too.
    agg.add(wire)
    ours = agg.finish()
    with pytest.raises(ForeignContextError):
        other.decrypt(ours, packing)
    assert ks.holder.decrypt(ours, packing).shape == (packing.total,)


# --- admissibility and configuration --------------------------------------------------------


def test_non_additive_fields_are_refused_with_the_reason():
    spec = UploadSpec((Field("emb", (3, 4), additive=False, bound=Bound(linf=1.0)),
                       Field("n", (1,), "int64", bound=Bound(linf=1.0), additive=True)), max_records=5)
    layer = Homomorphic("ckks")
    with pytest.raises(InadmissibleField) as ei:
        layer.check(spec)
    assert ei.value.field == "emb" and ei.value.layer == "homomorphic"
    assert "additive" in ei.value.reason
    unbounded = UploadSpec((Field("x", (3,), additive=True),))
    with pytest.raises(InadmissibleField):
        layer.check(unbounded)
    for bad in [dict(scheme="paillier"), dict(key_holder="server"), dict(precision=0.7),
                dict(poly_modulus_degree=1000), dict(max_clients=0)]:
        with pytest.raises(ConfigurationError):
            Homomorphic(**bad)


# --- ledger -----------------------------------------------------------------------------


def test_ledger_books_true_sizes_and_each_context_once_per_client():
    spec = fedlog_spec()
    layer = Homomorphic("bfv")
    c0 = ctx(0)
    layer.aggregate(fedlog_uploads(spec, 3), spec, c0)
    params = layer.params_for(spec, 4)
    keys = [r for r in c0.ledger.rows if r.stage == "keys"]
    assert sorted(str(r.receiver) for r in keys) == ["0", "1", "2", "server"]
    assert all(r.wire_bytes == len(driver_keys(layer)[0]) for r in keys)
    packing = Packing.from_spec(spec, params.slots)
    ups = [r for r in c0.ledger.rows if r.stage == "upload"]
    # an upload is the header plus its ciphertexts: about one compressed ciphertext here
    assert len(ups) == 3 and all(
        r.wire_bytes > 34 + 4 * packing.n_ciphertexts and r.receiver == "server" for r in ups)
    # Round 1: one new client gets the context; nobody else is sent it again.
    ups2 = fedlog_uploads(spec, 4, seed=5)
    c1 = ctx(1)
    layer.aggregate(ups2, spec, c1)
    keys1 = [r for r in c1.ledger.rows if r.stage == "keys"]
    assert [r.receiver for r in keys1] == [3]


def test_wire_checksum_is_zlib_crc32_and_frames_round_trip():
    """The header's checksum is the standard library's CRC-32 of the ciphertext bytes
    (whichever implementation computed it), and decoding gives back each ciphertext."""
    from secagg.homomorphic.packing import (
        KIND_UPLOAD,
        decode_message,
        encode_message,
        fingerprint,
    )
    from secagg.wire import message_size

    rng = np.random.default_rng(3)
    spec = UploadSpec((Field("x", (10,), bound=Bound(linf=1.0), additive=True),))
    packing = Packing.from_spec(spec, 4)  # 3 ciphertexts of 4, 4, 2 values
    cts = [rng.bytes(n) for n in (1000, 70_001, 3)]
    fp = fingerprint(b"context")
    frames = encode_message(KIND_UPLOAD, "bfv", fp, packing.total, cts)
    assert len(frames) == 4 and all(a is b for a, b in zip(frames[1:], cts, strict=True))
    assert struct.unpack_from(">I", frames[0], 22)[0] == zlib.crc32(b"".join(cts))
    got = decode_message(frames, KIND_UPLOAD, "bfv", fp, packing)
    assert all(a is b for a, b in zip(got, cts, strict=True))  # framed: no copies
    wire = join_message(frames)
    assert message_size(frames) == message_size(wire) == len(wire) == 38 + 8 + 71_004
    from secagg.transcript import digest
    assert digest(frames) == digest(wire)  # the transcript names a message, in either form
    cut = decode_message(wire, KIND_UPLOAD, "bfv", fp, packing)
    assert len(cut) == 3 and cut.lengths == (1000, 70_001, 3)
    assert list(cut) == cts
    assert list(decode_message(bytearray(wire), KIND_UPLOAD, "bfv", fp, packing)) == cts
    flipped = bytearray(wire)
    flipped[-2] ^= 0x01  # one bit in the last ciphertext
    with pytest.raises(CiphertextError, match="CRC-32"):
        decode_message(bytes(flipped), KIND_UPLOAD, "bfv", fp, packing)


def test_fuzzed_framed_uploads_raise_typed_errors_and_never_change_the_sum():
    """96 random corruptions of a multi-ciphertext BFV upload (byte flips in any frame,
    truncations, extensions, dropped, repeated or swapped frames): each is refused with a
    ProtocolError and the aggregate decrypts to the exact sum of the good uploads."""
    spec = fedavg_spec()
    ups = fedavg_uploads(spec, 2)
    layer = Homomorphic("bfv")
    params = layer.params_for(spec, 4)
    ks = keyset(params)
    packing = Packing.from_spec(spec, params.slots)
    fps = layer.fixed_point(spec, 4)
    good = [ks.encryptor.encrypt(layer._flatten(ups[c], spec, packing, fps), packing)
            for c in range(2)]
    assert len(good[0]) >= 3  # header + several ciphertexts
    rng = np.random.default_rng(2024)
    agg = ks.aggregator
    agg.start(packing)
    agg.add(good[0])
    for trial in range(96):
        frames = list(good[1])
        kind = trial % 6
        i = int(rng.integers(0, len(frames)))
        if kind == 0:  # flip one byte anywhere in one frame
            f = bytearray(frames[i])
            f[int(rng.integers(0, len(f)))] ^= int(rng.integers(1, 256))
            frames[i] = bytes(f)
        elif kind == 1:
            frames[i] = frames[i][: int(rng.integers(0, len(frames[i])))]
        elif kind == 2:
            frames[i] = frames[i] + rng.bytes(int(rng.integers(1, 9)))
        elif kind == 3:
            del frames[i]
        elif kind == 4:
            frames.insert(i, frames[i])
        else:
            j = 1 + (i % (len(frames) - 1))
            k = 1 + ((j + int(rng.integers(1, len(frames) - 1)) - 1) % (len(frames) - 1))
            frames[j], frames[k] = frames[k], frames[j]
            if frames[j] == good[1][j]:  # swapped two identical frames: still valid
                continue
        with pytest.raises(ProtocolError):
            agg.add(frames)
        assert agg.count == 1
    agg.add(good[1])
    flat = ks.holder.decrypt(agg.finish(), packing)
    sums = packing.unflatten(flat)
    for f in spec.additive:
        want = quantised_sum(ups, f.name, range(2), fps[f.name].scale_bits)
        assert sums[f.name].ravel().tolist() == np.asarray(want).ravel().tolist(), f.name


# --- BFV: fields wider than the plain modulus, in limbs ----------------------------------


def _wide_spec() -> UploadSpec:
    """A 62-bit field (2^16 x 16 clients at 2^-40 precision) beside a narrow one."""
    return UploadSpec((
        Field("wide", (40,), bound=Bound(linf=65536.0, adjacency="client"), additive=True),
        Field("n", (1,), "int64", bound=Bound(linf=100, adjacency="client"), additive=True),
    ))


def test_bfv_splits_a_field_wider_than_the_plain_modulus_into_limbs_and_sums_it_exactly():
    spec = _wide_spec()
    rng = np.random.default_rng(3)
    vals = {c: rng.uniform(-65536, 65536, 40) for c in range(16)}
    vals[0][:4] = [65536.0, -65536.0, 65536.0, -65536.0]  # the bound's edges, in every client
    for c in range(1, 16):
        vals[c][:4] = vals[0][:4]
    ups = {c: Upload.validate(spec, {"wide": v, "n": np.array([c + 1])}, c, c + 1)
           for c, v in vals.items()}
    layer = Homomorphic("bfv", precision=2.0**-40)
    fps = layer.fixed_point(spec, 16, limbs=True)
    assert fps["wide"].ring_bits == 58 + 4 > 59 and fps["n"].ring_bits == 59
    assert layer.limbs(spec, 16) == {"wide": 2} and layer.limb_bits(16) == 54
    agg = layer.aggregate(ups, spec, ctx())
    # bit-exact: the sum of the quantised inputs, computed independently in Python integers
    want = [sum(round(v * 2**40) for v in (vals[c][i] for c in range(16))) for i in range(40)]
    assert np.array_equal(agg["wide"], np.array([w / 2**40 for w in want]))
    assert agg["wide"][0] == 16 * 65536.0 and agg["wide"][1] == -16 * 65536.0
    assert agg["n"].tolist() == [sum(range(1, 17))]
    assert agg.notes["limbs"] == {"limb_bits": 54, "fields": {"wide": 2}}
    assert agg.notes["ciphertexts_per_upload"] == 1  # 81 values in one ciphertext
    assert agg.notes["he_params"]["plain_modulus"].bit_length() == 60


def test_bfv_limb_sums_and_recombination_are_exact_at_the_widest_ring():
    """64-bit ring elements, split and joined, add exactly modulo 2^64."""
    from secagg.homomorphic.plan import join_limbs, split_limbs

    rng = np.random.default_rng(0)
    ring = rng.integers(0, 2**63, (8, 5), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    limbs = split_limbs(ring.ravel(), 2, 54)
    assert limbs.shape == (2, 40) and int(limbs.min()) >= 0 and int(limbs.max()) < 2**54
    sums = limbs.reshape(2, 8, 5).sum(axis=1)  # the cohort's limb sums, as BFV decrypts them
    want = sum(int(v) for v in ring[:, 0]) % 2**64
    assert int(join_limbs(sums, 54)[0]) == want
    with pytest.raises(EncodingOverflow):
        join_limbs(-sums, 54)


def test_bfv_refuses_a_wide_field_packed_without_limbs():
    """A caller that packs one value per slot (as before limbs; the Flower runtime still
    does) gets a typed refusal naming the field, never a wrapped sum: from the plan, and
    from the layer's encoder if it packs without limbs anyway."""
    spec = _wide_spec()
    layer = Homomorphic("bfv", precision=2.0**-40)
    with pytest.raises(EncodingOverflow, match="'wide'.*62-bit ring.*limbs"):
        layer.fixed_point(spec, 16)
    params = layer.params_for(spec, 16)
    flat_packing = Packing.from_spec(spec, params.slots)
    up = Upload.validate(spec, {"wide": np.ones(40), "n": np.array([1])}, 0, 1)
    with pytest.raises(EncodingOverflow, match="'wide'.*limb"):
        layer._flatten(up, spec, flat_packing, layer.fixed_point(spec, 16, limbs=True))
