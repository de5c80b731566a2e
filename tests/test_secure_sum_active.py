"""SecureSum against an active (malicious) server and misbehaving clients.

The attacks are real code against the real protocol objects: a server that forges the
roster's share threshold and splits a client's share holders (self-mask shares from some,
mask-key shares from the others), a server that shows different survivor sets to different
clients, a server that substitutes a client's keys, and clients that advertise a low-order
X25519 point or a copy of another client's keys. Every run uses seeded entropy (tests only).
"""

import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.dropouts import ScheduledDropouts
from secagg.errors import ConfigurationError
from secagg.layers.base import RoundContext
from secagg.secure_sum import run_secure_sum, shamir, wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.graph import build
from secagg.secure_sum.keys import (
    PURPOSE_PAIR_MASK,
    PURPOSE_SELF_MASK,
    advertise_statement,
    agree,
    derive,
    pair,
    sign_public,
)
from secagg.secure_sum.prg import MaskAccumulator, SeededEntropy
from secagg.secure_sum.server import Server

BITS, M = 16, 8
P25519 = 2**255 - 19
# the small-order points of Curve25519 (and their non-canonical encodings p-1, p, p+1)
LOW_ORDER = [0, 1, P25519 - 1, P25519, P25519 + 1,
             0x00b8495f16056286fdb1329ceb8d09da6ac49ff1fae35616aeb8413b7c7aebe0,
             0x57119fd0dd4e22d8868e1c58c45c44045bef839c55b1d0b1248c50a3bc959c5f]


def _ctx(schedule=None):
    return RoundContext(round=1, phase="t", seed=0, dropouts=ScheduledDropouts(schedule or {}))


def _vectors(n, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**BITS, M, dtype=np.uint64) for u in range(n)}


def _ring_sum(vecs, ids):
    return (sum(vecs[u].astype(object) for u in ids) % (1 << BITS)).astype(np.uint64)


def _forge_roster(msg, tk):
    """The same ROSTER with another share threshold t_k (header 32 | round 8 | bits 1 |
    length 4 | t_k 4)."""
    pos = wire.HEADER_BYTES + 13
    return msg[:pos] + struct.pack(">I", tk) + msg[pos + 4:]


class _Session:
    """A real Server and n real Clients, advanced by hand (the server's side is the
    adversary's to drive)."""

    def __init__(self, n=6, t=4, seed=3, pinned=False):
        self.n = n
        self.session = SeededEntropy(seed, "session")(16)
        self.graph = build(list(range(n)), t, "complete")
        self.server = Server(self.session, 1, self.graph, BITS, M)
        ids = {u: Ed25519PrivateKey.from_private_bytes(SeededEntropy(seed, f"id{u}")(32))
               for u in range(n)} if pinned else {}
        pins = {u: sign_public(k) for u, k in ids.items()} if pinned else None
        self.clients = {u: Client(u, self.session, 1, SeededEntropy(seed, u), threshold=t,
                                  length=M, ring_bits=BITS, min_holders=t, signing=ids.get(u),
                                  pinned=pins)
                        for u in range(n)}
        for c in self.clients.values():
            self.server.receive_advertise(c.advertise())
        self.rosters = self.server.close_advertise()

    def share(self, rosters=None):
        rosters = rosters or self.rosters
        for u, c in self.clients.items():
            self.server.receive_shares(c.share_keys(rosters[u]))
        forwards = self.server.close_shares()
        for u, c in self.clients.items():
            self.server.receive_ack(c.receive_forward(forwards[u]))

    def mask(self, vecs):
        self.masked = {}
        for u, c in self.clients.items():
            _, y = self.server.receive_masked(c.masked_input(vecs[u]))
            self.masked[u] = np.array(y)  # ring words, as the server holds them

    def survivors_msg(self, ids):
        return {w: wire.encode(wire.MsgType.SURVIVORS, self.session, wire.SERVER_ID, w,
                               wire.ids_body(ids)) for w in ids}

    def request(self, w, b_ids, sk_ids, sigs):
        return wire.encode(wire.MsgType.UNMASK_REQUEST, self.session, wire.SERVER_ID, w,
                           wire.unmask_request_body(b_ids, sk_ids, sigs))


def _split_attack(s, victim, tk, b_group, sk_group, sigs_for):
    """The malicious server's unmasking: self-mask shares of ``victim`` from ``b_group``,
    mask-key shares from ``sk_group``; returns the victim's input if both secrets come back.
    ``sigs_for(w)`` gives the consistency signatures the server forwards to w."""
    b_sh, sk_sh = {}, {}
    for w in b_group:
        resp = s.clients[w].unmask(s.request(w, {victim}, set(), sigs_for(w)))
        b, _ = wire.parse_unmask_response(memoryview(resp)[wire.HEADER_BYTES:])
        b_sh[w] = b[victim]
    for w in sk_group:
        resp = s.clients[w].unmask(s.request(w, set(), {victim}, sigs_for(w)))
        _, sk = wire.parse_unmask_response(memoryview(resp)[wire.HEADER_BYTES:])
        sk_sh[w] = sk[victim]
    if len(b_sh) < tk or len(sk_sh) < tk:
        return None

    def rebuild(pool):
        holders = sorted(pool)[:tk]
        flat = shamir.reconstruct([h + 1 for h in holders],
                                  np.array([pool[h] for h in holders], dtype=object))
        return shamir.elements_to_key(flat)

    b, sk = rebuild(b_sh), rebuild(sk_sh)
    y = s.masked[victim].copy()
    masks = MaskAccumulator(y)
    masks.add(derive(b, PURPOSE_SELF_MASK, s.session, 1, victim, victim), -1)
    for v in range(s.n):
        if v != victim:
            key = derive(agree(sk, s.server.keys[v][1]), PURPOSE_PAIR_MASK, s.session, 1,
                         *pair(victim, v))
            masks.add(key, -1 if victim < v else 1)
    return y.astype(np.uint64) & np.uint64((1 << BITS) - 1)


# --------------------------------------------------------------------------- point 3


def test_threshold_of_at_most_half_is_refused_at_configuration():
    from secagg.secure_sum import SecureSum

    for bad in (0.5, 0.3):
        with pytest.raises(ConfigurationError, match="half"):
            SecureSum(threshold=bad)
        with pytest.raises(ConfigurationError, match="half"):
            build(list(range(10)), bad)
    with pytest.raises(ConfigurationError, match="half"):
        run_secure_sum(_vectors(10), BITS, _ctx(), threshold=5)  # a count of n/2
    assert build(list(range(10)), 6).threshold == 6 and build(list(range(10)), 0.51).threshold == 6
    g = build(list(range(100)), 0.51, "harary", k=28, seed=0)
    assert 2 * g.share_threshold > g.k + 1


def test_split_attack_with_forged_share_threshold_is_refused_by_every_client():
    """t = 0.5 is refused up front; a server that forges t_k = 2 in the roster anyway (so
    that two disjoint pairs of holders rebuild both secrets of client 0) gets no shares:
    every client refuses the roster with UnsafeThreshold, naming the bound."""
    from secagg.secure_sum.errors import UnsafeThreshold

    s = _Session(n=6, t=4)
    forged = {u: _forge_roster(m, 2) for u, m in s.rosters.items()}
    for u, c in s.clients.items():
        with pytest.raises(UnsafeThreshold, match="more than half") as e:
            c.share_keys(forged[u])
        assert (e.value.share_threshold, e.value.holders) == (2, 6)
        assert c.stage == "advertised"  # nothing was shared
    # the same forgery inside a full run: every client drops out, the run aborts (typed)
    # instead of sharing secrets the server could split
    from secagg.errors import SecureSumAborted

    def forge(stage, sender, receiver, msg):
        return _forge_roster(msg, 2) if stage == "share" and sender == "server" else msg

    with pytest.raises(SecureSumAborted) as e:
        run_secure_sum(_vectors(6), BITS, _ctx(), threshold=4, entropy_seed=1, tamper=forge)
    assert e.value.stage == "share" and e.value.survivors == 0


def test_split_attack_with_an_honest_threshold_is_refused_by_the_consistency_round():
    """With the honest t_k (4 of 6 holders), a server that tells a group of holders "client 0
    survived" and another "client 0 dropped" must forward to the second group signatures on a
    survivor set without client 0 -- which the others never signed. The holders asked for
    the mask key refuse (InconsistentView); the server never holds both secrets."""
    from secagg.secure_sum.errors import InconsistentView

    vecs = _vectors(6, seed=1)
    for pinned in (False, True):
        s = _Session(n=6, t=4, pinned=pinned)
        s.share()
        s.mask(vecs)
        everyone = list(range(6))
        without0 = [1, 2, 3, 4, 5]
        sigs = {}
        for w, msg in s.survivors_msg(everyone).items():
            sigs[w] = wire.parse_signature(memoryview(s.clients[w].sign_survivors(msg))
                                           [wire.HEADER_BYTES:])
        # the b group is happy: 6 valid signatures on the set it signed
        b_group, sk_group = [0, 1, 2, 3], [4, 5]
        for w in b_group:
            s.clients[w].unmask(s.request(w, {0}, set(), sigs))
        # the sk group signed the same set; a request that treats 0 as dropped contradicts it
        for w in sk_group:
            with pytest.raises(InconsistentView, match="in the survivor set"):
                s.clients[w].unmask(s.request(w, set(), {0}, sigs))
        # an equivocating server: fresh clients 4, 5 shown U3 without client 0
        s2 = _Session(n=6, t=4, pinned=pinned)
        s2.share()
        s2.mask(vecs)
        shown = {**s2.survivors_msg(everyone), **{w: m for w, m in
                                                  s2.survivors_msg(without0).items()
                                                  if w in (4, 5)}}
        sigs2 = {w: wire.parse_signature(memoryview(s2.clients[w].sign_survivors(shown[w]))
                                         [wire.HEADER_BYTES:]) for w in everyone}
        assert s2.clients[4].survivors_count == len(without0)  # it signed the set without 0
        for w in (4, 5):  # every signature by a member of the set it was shown
            with pytest.raises(InconsistentView, match="does not verify"):
                s2.clients[w].unmask(s2.request(w, set(), {0}, {v: sigs2[v] for v in without0}))
            own = {v: sigs2[v] for v in (4, 5)}  # only the consistent ones: too few
            with pytest.raises(InconsistentView, match="2 valid signatures"):
                s2.clients[w].unmask(s2.request(w, set(), {0}, own))
        # the b group (4 signatures on its set) does release its shares: the server ends with
        # the self-mask seed only, never the mask key as well
        b_sigs = {v: sigs2[v] for v in range(4)}
        assert _split_attack(s2, 0, 4, [0, 1, 2, 3], [], lambda w, b=b_sigs: b) is None


def test_split_attack_succeeds_without_the_defences():
    """The attack code is sound: given both secrets it recovers the victim's exact input
    (here from honest clients' shares rebuilt by the honest server), so the refusals above are
    what stops it."""
    vecs = _vectors(6, seed=2)
    s = _Session(n=6, t=4)
    s.share()
    s.mask(vecs)
    sk_private = s.clients[0]._keys.mask_private
    b = s.clients[0]._b
    y = s.masked[0].copy()
    masks = MaskAccumulator(y)
    masks.add(derive(b, PURPOSE_SELF_MASK, s.session, 1, 0, 0), -1)
    for v in range(1, 6):
        key = derive(agree(sk_private, s.server.keys[v][1]), PURPOSE_PAIR_MASK, s.session, 1,
                     *pair(0, v))
        masks.add(key, -1)
    assert np.array_equal(y.astype(np.uint64) & np.uint64((1 << BITS) - 1), vecs[0])


def test_pinned_keys_stop_a_server_that_substitutes_a_clients_keys():
    """Man in the middle: the server replaces client 1's keys in client 0's roster by its
    own. With pinned keys client 0 refuses (the keys are not signed by client 1's pinned key);
    without, it cannot tell (the honest-but-curious limit, stated in the docs)."""
    from secagg.secure_sum.errors import InconsistentView
    from secagg.secure_sum.keys import KeyPairs, signing_key

    for pinned in (True, False):
        s = _Session(n=5, t=3, pinned=pinned)
        body = memoryview(s.rosters[0])[wire.HEADER_BYTES:]
        roster = wire.parse_roster(body)
        evil = KeyPairs.generate(SeededEntropy(99))
        evil_sign = signing_key(SeededEntropy(98))
        keys = dict(roster.keys)
        keys[1] = (evil.enc_public, evil.mask_public)
        signing = dict(roster.signing)
        signing[1] = (sign_public(evil_sign), evil_sign.sign(
            advertise_statement(s.session, 1, 1, *keys[1])))
        fake = wire.encode(wire.MsgType.ROSTER, s.session, wire.SERVER_ID, 0, wire.roster_body(
            roster.round, roster.ring_bits, roster.length, roster.share_threshold, keys, signing))
        if pinned:
            with pytest.raises(InconsistentView, match="pinned key"):
                s.clients[0].share_keys(fake)
        else:
            assert isinstance(s.clients[0].share_keys(fake), bytes)


def test_a_roster_that_isolates_a_small_group_is_refused():
    """Complete graph, t = 4 of 6: a server that gives client 0 a roster of two neighbours
    (to read the sum of a 3-client group) is refused."""
    from secagg.secure_sum.errors import MalformedMessage

    s = _Session(n=6, t=4)
    roster = wire.parse_roster(memoryview(s.rosters[0])[wire.HEADER_BYTES:])
    small = wire.encode(wire.MsgType.ROSTER, s.session, wire.SERVER_ID, 0, wire.roster_body(
        roster.round, roster.ring_bits, roster.length, 2,
        {v: roster.keys[v] for v in (1, 2)}, {v: roster.signing[v] for v in (1, 2)}))
    with pytest.raises(MalformedMessage, match="fewer than the 3"):
        s.clients[0].share_keys(small)
    assert s.clients[0].stage == "advertised"  # nothing shared
    assert isinstance(s.clients[0].share_keys(s.rosters[0]), bytes)  # the honest one is fine


def test_honest_runs_with_pinned_identities_are_exact_and_say_so():
    from secagg.messages import Bound, Field, Upload, UploadSpec
    from secagg.secure_sum import SecureSum

    n = 8
    ids = {u: Ed25519PrivateKey.from_private_bytes(SeededEntropy(5, u)(32)) for u in range(n)}
    vecs = _vectors(n, seed=4)
    drops = {"masked-input": {2}, "consistency": {5}, "unmask": {6}}
    rep = run_secure_sum(vecs, BITS, _ctx(drops), threshold=0.6, entropy_seed=2, identities=ids)
    assert rep.pinned and rep.contributors == (0, 1, 3, 4, 5, 6, 7)  # 5 and 6: input arrived
    assert np.array_equal(rep.total, _ring_sum(vecs, rep.contributors))
    assert rep.live["consistency"] == 6 and rep.failures == []
    with pytest.raises(ConfigurationError, match="identities"):
        run_secure_sum(vecs, BITS, _ctx(), threshold=0.6, identities={0: ids[0]})
    spec = UploadSpec((Field("x", (3,), bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    ups = {u: Upload.validate(spec, {"x": np.full(3, u / 10)}, u, 1) for u in range(n)}
    for layer, model in ((SecureSum(threshold=0.6, identities=ids), "active (pinned keys)"),
                         (SecureSum(threshold=0.6), "honest-but-curious")):
        agg = layer.aggregate(ups, spec, _ctx())
        assert np.allclose(agg["x"], np.full(3, sum(range(n)) / 10))
        assert agg.notes["secure_sum"]["server_model"] == model


# --------------------------------------------------------------------------- point 4


def _replace_advertise(msg, enc=None, mask=None, signer=None):
    """A client's own ADVERTISE with other X25519 keys, signed by the (malicious) client."""
    head = wire.HEADER.unpack(msg[: wire.HEADER_BYTES])
    session, cid = head[3], head[4]
    e0, m0, _, _ = wire.parse_advertise(memoryview(msg)[wire.HEADER_BYTES:])
    enc, mask = enc or e0, mask or m0
    signer = signer or Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    sig = signer.sign(advertise_statement(session, 1, cid, enc, mask))
    return wire.encode(wire.MsgType.ADVERTISE, session, cid, wire.SERVER_ID,
                       wire.advertise_body(enc, mask, sign_public(signer), sig))


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_key_at_advertise_drops_only_that_client(point):
    from secagg.secure_sum.keys import is_low_order

    low = point.to_bytes(32, "little")
    assert is_low_order(low)
    vecs = _vectors(7, seed=5)

    def attack(stage, sender, receiver, msg):
        if stage == "advertise" and sender == 3:
            return _replace_advertise(msg, mask=low)
        return msg

    rep = run_secure_sum(vecs, BITS, _ctx(), threshold=5, entropy_seed=5, tamper=attack)
    assert rep.contributors == (0, 1, 2, 4, 5, 6)
    assert np.array_equal(rep.total, _ring_sum(vecs, rep.contributors))
    assert list(rep.refused) == [3] and "low-order" in rep.refused[3]
    assert [f[:2] for f in rep.failures] == [("advertise", 3)]


def test_copied_keys_at_advertise_drop_the_copier_and_the_session_goes_on():
    vecs = _vectors(7, seed=6)
    seen = {}

    def attack(stage, sender, receiver, msg):
        if stage == "advertise" and sender == 2:
            seen[2] = wire.parse_advertise(memoryview(msg)[wire.HEADER_BYTES:])
        if stage == "advertise" and sender == 5:  # replays client 2's X25519 keys as its own
            return _replace_advertise(msg, enc=seen[2][0], mask=seen[2][1])
        return msg

    rep = run_secure_sum(vecs, BITS, _ctx(), threshold=5, entropy_seed=6, tamper=attack)
    assert rep.contributors == (0, 1, 2, 3, 4, 6)
    assert np.array_equal(rep.total, _ring_sum(vecs, rep.contributors))
    assert rep.refused == {5: "a copy of client 2's public key"}


def test_server_refuses_reused_and_badly_signed_keys_and_client_types_zero_secrets():
    from secagg.secure_sum.errors import MalformedMessage, RejectedKey

    s = Server(bytes(16), 1, build(list(range(4)), 3), BITS, M)
    c0 = Client(0, bytes(16), 1, SeededEntropy(1, 0))
    msg = c0.advertise()
    enc, _, _, _ = wire.parse_advertise(memoryview(msg)[wire.HEADER_BYTES:])
    with pytest.raises(RejectedKey, match="same X25519 key"):
        s.receive_advertise(_replace_advertise(msg, mask=enc))
    c1 = Client(1, bytes(16), 1, SeededEntropy(1, 1))
    bad = bytearray(c1.advertise())
    bad[-1] ^= 1  # the signature
    with pytest.raises(RejectedKey, match="signature"):
        s.receive_advertise(bytes(bad))
    assert set(s.refused) == {0, 1} and s.keys == {}
    for point in LOW_ORDER:
        with pytest.raises(MalformedMessage, match="low-order"):
            agree(bytes(range(1, 33)), point.to_bytes(32, "little"))


# --------------------------------------------------------------------------- point 8


def test_mutated_roster_length_or_ring_is_a_protocol_error_and_the_run_goes_on():
    vecs = _vectors(6, seed=7)
    for pos, value in ((wire.HEADER_BYTES + 9, struct.pack(">I", M + 1)),
                       (wire.HEADER_BYTES + 8, bytes([BITS - 4]))):
        def mutate(stage, sender, receiver, msg, pos=pos, value=value):
            if stage == "share" and sender == "server" and receiver == 2:
                return msg[:pos] + value + msg[pos + len(value):]
            return msg

        rep = run_secure_sum(vecs, BITS, _ctx(), threshold=4, entropy_seed=7, tamper=mutate)
        assert rep.contributors == (0, 1, 3, 4, 5)
        assert np.array_equal(rep.total, _ring_sum(vecs, rep.contributors))
        assert [f[:2] for f in rep.failures] == [("share", 2)]
        assert "ROSTER announces" in rep.failures[0][2]
