"""SecureSum against malicious clients (issue 26): each misbehaviour of one client, then t - 1
colluding clients. In every case the honest clients' exact sum comes out and only the
misbehaving clients are dropped (or, past the protocol's bound, the run aborts with the stage
and the counts). The malicious clients are real :class:`Client` subclasses running the real
cryptography and deviating at one step; the server and the honest clients are unchanged.

Against the code before verifiable complaints (the server took an ACK's list of "failed"
senders at face value) the false-complaint cases fail: the liar's victims were excluded, or
the round aborted.
"""

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import secagg.secure_sum.protocol as protocol
from secagg.dropouts import ScheduledDropouts
from secagg.errors import SecureSumAborted
from secagg.layers.base import RoundContext
from secagg.secure_sum import TooFewShares, run_secure_sum, wire
from secagg.secure_sum.client import Client, share_aad, share_nonce
from secagg.secure_sum.graph import build
from secagg.secure_sum.keys import agree, key_commitment, pair_digest, share_key, share_statement
from secagg.stages import SECURE_SUM_STAGES

BITS, M, N, T = 24, 6, 10, 7
STAGES = SECURE_SUM_STAGES


def _ctx(schedule=None):
    return RoundContext(round=2, phase="t", seed=0, dropouts=ScheduledDropouts(schedule or {}))


def _vectors(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**BITS, M, dtype=np.uint64) for u in range(n)}


def _ring_sum(vecs, ids):
    return (sum(vecs[u].astype(object) for u in ids) % (1 << BITS)).astype(np.uint64)


def _run(monkeypatch, bad, n=N, t=T, graph="complete", schedule=None, k=None, seed=1):
    """One session where ``bad`` maps client ids to their malicious Client subclass."""

    def make(cid, *args, **kwargs):
        return bad.get(cid, Client)(cid, *args, **kwargs)

    monkeypatch.setattr(protocol, "Client", make)
    vecs = _vectors(n)
    rep = run_secure_sum(vecs, BITS, _ctx(schedule), threshold=t, graph=graph, k=k,
                         entropy_seed=seed, graph_seed=0)
    return vecs, rep


def _exact_without(vecs, rep, dropped):
    """The honest clients' exact sum came out, and only ``dropped`` are missing."""
    assert set(rep.contributors) == set(vecs) - set(dropped)
    assert np.array_equal(rep.total, _ring_sum(vecs, rep.contributors))


UNSIGNED = b"unsigned"


def _rewrite_shares(client, msg, change):
    """Client ``client``'s SHARES ``msg`` with ``change(receiver, ciphertext) -> ciphertext``
    applied to every entry, each re-signed by the client (the client itself deviates)."""
    body = wire.decode_header(msg, wire.MsgType.SHARES, client.session, wire.SERVER_ID)[1]
    commitment, entries = wire.parse_shares(body)
    n_ct, n_fw = wire.SHARE_CIPHERTEXT_BYTES, wire.FORWARD_ENTRY_BYTES
    n_signed = getattr(wire, "SIGNED_SHARE_BYTES", n_ct)  # ciphertext | share digests
    out = {}
    for v, e in entries.items():
        ct = change(v, e[:n_ct], entries)
        if ct is UNSIGNED:  # the true ciphertext under a signature that does not verify
            ct, sig = e[:n_ct], os.urandom(wire.SIGNATURE_BYTES)
        else:
            sig = client._sign.sign(share_statement(client.session, client.round, client.cid,
                                                    v, ct + e[n_ct:n_signed]))
        out[v] = ct + e[n_ct:n_signed] + sig + e[n_fw:]
    return wire.encode(wire.MsgType.SHARES, client.session, client.cid, wire.SERVER_ID,
                       wire.shares_body(commitment, out))


def _ack(client, complaints):
    """An ACK with ``complaints`` (sender -> (key, commitment)); on the code before the fix,
    whose ACK was a bare list of ids, the same accusation in that form."""
    if hasattr(wire, "complaints_body"):
        body = wire.complaints_body(complaints)
    else:  # pragma: no cover - the pre-fix wire format
        body = wire.ids_body(set(complaints))
    return wire.encode(wire.MsgType.ACK, client.session, client.cid, wire.SERVER_ID, body)


def _true_evidence(client, v):
    """(k_{v->u}, H(k_{u->v})) as an honest complainer u = client would reveal them."""
    ch = client._channels[v]
    if isinstance(ch, tuple):
        return ch[1], key_commitment(ch[0])
    return bytes(32), bytes(32)  # pragma: no cover - pre-fix channels held no raw keys


# ------------------------------------------------------------------ malicious clients


def _liar(victims=None, junk=False):
    """Complains, in its ACK, about ``victims`` (None: every sender) whose shares were fine;
    with the true keys (the server opens the share: "false"), or with junk keys ("uncommitted
    key"). It masks as if those shares had failed (no pairwise mask with its victims)."""

    class Liar(Client):
        def receive_forward(self, forward_msg):
            super().receive_forward(forward_msg)
            named = set(self.accepted) if victims is None else set(victims) & self.accepted
            self.accepted -= named
            self.rejected = named
            return _ack(self, {v: (os.urandom(32), os.urandom(32)) if junk
                               else _true_evidence(self, v) for v in named})

    return Liar


def _garbage_sender(victims, how="random"):
    """Sends ``victims`` a signed ciphertext that does not open: random bytes ("random"), a
    well-encrypted plaintext of out-of-field elements ("plaintext"), another neighbour's
    ciphertext ("duplicate") or a ciphertext of an earlier session ("replay"); or its true
    ciphertext under a signature that does not verify ("unsigned")."""

    class Garbage(Client):
        old: dict[int, bytes] = {}

        def share_keys(self, roster_msg):
            msg = super().share_keys(roster_msg)

            def change(v, ct, entries):
                if v not in victims:
                    return ct
                if how == "random":
                    return os.urandom(len(ct))
                if how == "unsigned":
                    return UNSIGNED
                if how == "plaintext":
                    k_send = self._channels[v][0]
                    mine = (self._keys.enc_public, self._keys.mask_public)
                    return AESGCM(k_send).encrypt(
                        share_nonce(self.cid, v), b"\xff" * wire.SHARE_PLAINTEXT_BYTES,
                        share_aad(self.session, self.round, self.cid, v, mine,
                                  self._roster.keys[v]))
                if how == "duplicate":
                    other = min(w for w in entries if w not in victims)
                    return entries[other][: wire.SHARE_CIPHERTEXT_BYTES]
                assert how == "replay"
                return Garbage.old.get(v, ct)

            return _rewrite_shares(self, msg, change)

    return Garbage


def _equivocator(victims, commit_honestly=False):
    """Uses, towards ``victims``, a share-encryption key other than the one it advertised
    (shows them a different key). With ``commit_honestly`` it still sends the pair digest of
    the advertised key, so only its ciphertexts are wrong."""

    class Equivocator(Client):
        fake = X25519PrivateKey.generate()

        def _channel(self, v):
            if v not in victims:
                return super()._channel(v)
            z = agree(self.fake, self._roster.keys[v][0])
            return (share_key(z, self.session, self.round, self.cid, v),
                    share_key(z, self.session, self.round, v, self.cid))

        def share_keys(self, roster_msg):
            msg = super().share_keys(roster_msg)
            if not commit_honestly:
                return msg
            body = wire.decode_header(msg, wire.MsgType.SHARES, self.session,
                                      wire.SERVER_ID)[1]
            commitment, entries = wire.parse_shares(body)
            n_fw = wire.FORWARD_ENTRY_BYTES
            for v in victims:
                if v in entries:
                    z = agree(self._keys.enc, self._roster.keys[v][0])
                    ks = share_key(z, self.session, self.round, self.cid, v)
                    kr = share_key(z, self.session, self.round, v, self.cid)
                    entries[v] = entries[v][:n_fw] + pair_digest(
                        self.session, self.round, self.cid, v, key_commitment(ks),
                        key_commitment(kr))
            return wire.encode(wire.MsgType.SHARES, self.session, self.cid, wire.SERVER_ID,
                               wire.shares_body(commitment, entries))

    return Equivocator


def _bad_masked(kind):
    """A masked input of the wrong length, the wrong ring, or a huge one."""

    class BadMasked(Client):
        def masked_input(self, vector):
            msg = super().masked_input(vector)
            head = wire.HEADER_BYTES
            body = bytearray(msg[head:])
            if kind == "length":
                body[1:5] = (M + 1).to_bytes(4, "big")
                body += bytes(3)
            elif kind == "ring":
                body[0] = BITS + 8
            else:  # huge: 64 MiB of ring elements
                body += bytes(64 << 20)
            return wire.encode(wire.MsgType.MASKED, self.session, self.cid, wire.SERVER_ID,
                               bytes(body))

    return BadMasked


def _huge_shares():
    class Huge(Client):
        def share_keys(self, roster_msg):
            msg = super().share_keys(roster_msg)
            return msg + bytes(64 << 20)

    return Huge


# ------------------------------------------------------------------ single client


def test_issue_26_false_complaints_against_everyone_exclude_only_the_liar(monkeypatch):
    vecs, rep = _run(monkeypatch, {3: _liar()})
    _exact_without(vecs, rep, {3})
    assert rep.excluded == (3,)
    assert {(u, verdict) for u, _, verdict in rep.verdicts} == {(3, "false")}
    assert len(rep.verdicts) == N - 1


@pytest.mark.parametrize("junk", [False, True], ids=["true-keys", "junk-keys"])
def test_false_complaints_aimed_at_chosen_clients_exclude_only_the_liar(monkeypatch, junk):
    vecs, rep = _run(monkeypatch, {3: _liar({0, 7}, junk=junk)})
    _exact_without(vecs, rep, {3})
    verdict = "uncommitted key" if junk else "false"
    assert sorted(rep.verdicts) == [(3, 0, verdict), (3, 7, verdict)]


@pytest.mark.parametrize("how", ["random", "plaintext", "duplicate", "replay", "unsigned"])
def test_malformed_duplicated_or_replayed_shares_exclude_only_their_sender(monkeypatch, how):
    if how == "replay":  # capture a ciphertext of an earlier session, then replay it
        captured = {}

        class Capture(Client):
            def share_keys(self, roster_msg):
                msg = super().share_keys(roster_msg)
                body = wire.decode_header(msg, wire.MsgType.SHARES, self.session,
                                          wire.SERVER_ID)[1]
                for v, e in wire.parse_shares(body)[1].items():
                    captured[v] = e[: wire.SHARE_CIPHERTEXT_BYTES]
                return msg

        _run(monkeypatch, {5: Capture}, seed=7)
        g = _garbage_sender({1, 2}, how="replay")
        g.old = captured
        bad = g
    else:
        bad = _garbage_sender({1, 2}, how=how)
    vecs, rep = _run(monkeypatch, {5: bad})
    _exact_without(vecs, rep, {5})
    assert sorted(rep.verdicts) == [(1, 5, "upheld"), (2, 5, "upheld")]


def test_a_resent_shares_message_is_refused_and_the_first_copy_stands(monkeypatch):
    # a byte-identical second SHARES is refused as a replay; the first copy, which was fine,
    # stands (the duplicate does no harm, so its sender stays in the sum)
    from secagg.secure_sum.server import Server
    orig = Server.receive_shares
    outcomes = []

    def receive_twice(self, data):
        u = orig(self, data)
        if u == 4:
            try:
                orig(self, data)
            except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                outcomes.append(type(exc).__name__)
        return u

    monkeypatch.setattr(Server, "receive_shares", receive_twice)
    vecs = _vectors()
    rep = run_secure_sum(vecs, BITS, _ctx(), threshold=T, entropy_seed=1)
    assert outcomes == ["ReplayedMessage"]
    _exact_without(vecs, rep, set())


@pytest.mark.parametrize("kind", ["length", "ring", "huge"])
def test_masked_input_of_wrong_length_ring_or_size_drops_only_its_sender(monkeypatch, kind):
    vecs, rep = _run(monkeypatch, {6: _bad_masked(kind)})
    _exact_without(vecs, rep, {6})
    assert [(s, u) for s, u, _ in rep.failures] == [("masked-input", 6)]
    assert rep.excluded == ()


def test_a_huge_shares_message_drops_only_its_sender(monkeypatch):
    vecs, rep = _run(monkeypatch, {2: _huge_shares()})
    _exact_without(vecs, rep, {2})
    assert [(s, u) for s, u, _ in rep.failures] == [("share", 2)]


def test_equivocation_towards_some_neighbours_cuts_those_edges_and_excludes_no_one(
        monkeypatch):
    # the server cannot tell which end of a mismatched pair lied, so it cuts the edge (neither
    # direction forwarded, neither end masks with the other): no honest client is excluded,
    # and the equivocator, whose keys were otherwise consistent, stays a contributor
    vecs, rep = _run(monkeypatch, {4: _equivocator({0, 8})})
    _exact_without(vecs, rep, set())
    assert rep.cut == ((0, 4), (4, 8))
    assert rep.verdicts == [] and rep.excluded == ()


def test_equivocation_towards_every_neighbour_drops_only_the_equivocator(monkeypatch):
    vecs, rep = _run(monkeypatch, {4: _equivocator(set(range(N)))})
    _exact_without(vecs, rep, {4})
    assert list(rep.cut_off) == [4]
    assert len(rep.cut) == N - 1


def test_equivocating_ciphertexts_under_honest_digests_exclude_the_equivocator(monkeypatch):
    vecs, rep = _run(monkeypatch, {4: _equivocator({0, 8}, commit_honestly=True)})
    _exact_without(vecs, rep, {4})
    # (its own decryptions under the key it showed fail too; its complaints reveal that key,
    # not the committed one)
    assert sorted(rep.verdicts) == [(0, 4, "upheld"), (4, 0, "uncommitted key"),
                                    (4, 8, "uncommitted key"), (8, 4, "upheld")]


@pytest.mark.parametrize("stage", STAGES)
def test_silence_at_each_stage_costs_only_the_silent_client(monkeypatch, stage):
    vecs, rep = _run(monkeypatch, {}, schedule={stage: {9}})
    # silent after its masked input arrived, its input is still (correctly) in the sum
    late = stage in ("consistency", "unmask")
    _exact_without(vecs, rep, set() if late else {9})
    assert rep.excluded == ()


@pytest.mark.parametrize("graph", ["harary"])
def test_false_complaints_on_the_secagg_plus_graph(monkeypatch, graph):
    vecs, rep = _run(monkeypatch, {3: _liar()}, n=16, t=9, graph=graph, k=8)
    _exact_without(vecs, rep, {3})
    assert {verdict for _, _, verdict in rep.verdicts} == {"false"}


# ------------------------------------------------------------------ t - 1 colluders


def test_colluders_each_misbehaving_differently_are_the_only_ones_dropped(monkeypatch):
    # n = 11, t = 6: four colluders, each with a different misbehaviour, aimed at the same
    # honest victim (client 0) where they can be
    bad = {6: _liar({0}), 7: _garbage_sender({0}), 8: _equivocator(set(range(11))),
           9: _bad_masked("ring")}
    vecs, rep = _run(monkeypatch, bad, n=11, t=6)
    _exact_without(vecs, rep, set(bad))
    assert sorted(rep.verdicts) == [(0, 7, "upheld"), (6, 0, "false")]
    assert list(rep.cut_off) == [8]


def test_t_minus_1_colluders_with_a_garbage_sender_hit_the_share_bound(monkeypatch):
    # n = 11, t = t_k = 6 and five colluders: the sender of a garbage share is excluded, and
    # its mask key must be rebuilt from the honest clients that accepted its shares -- five of
    # the six (its victim rejected them), fewer than t_k. The round aborts and says exactly
    # that, instead of excluding an honest client or returning a wrong sum.
    bad = {6: _liar({0}), 7: _garbage_sender({0}), 8: _equivocator(set(range(11))),
           9: _liar({0}, junk=True), 10: _bad_masked("ring")}
    with pytest.raises(TooFewShares) as e:
        _run(monkeypatch, bad, n=11, t=6)
    assert (e.value.owner, e.value.secret, e.value.survivors, e.value.threshold) == (
        7, "mask key", 5, 6)
    assert "5 shares of client 7's mask key" in str(e.value)


def test_t_minus_1_colluding_liars_against_one_victim(monkeypatch):
    bad = {u: _liar({0}) for u in (6, 7, 8, 9, 10)}
    vecs, rep = _run(monkeypatch, bad, n=11, t=6)
    _exact_without(vecs, rep, set(bad))
    assert sorted(rep.verdicts) == [(u, 0, "false") for u in sorted(bad)]


def _secagg_plus(n=16, t=9, k=8):
    return build(list(range(n)), t, "harary", k, 0)  # the graph _run builds (graph_seed 0)


def test_colluders_on_the_secagg_plus_graph_within_its_bound(monkeypatch):
    # SecAgg+'s bound is per neighbourhood: every honest client must keep t_k live members in
    # its closed neighbourhood. Up to t - 1 liars chosen greedily within that bound.
    g = _secagg_plus()
    bad: set[int] = set()
    for u in range(16):
        trial = bad | {u}
        honest = set(range(16)) - trial
        if len(trial) < g.threshold and len(honest) >= g.threshold and all(
                len(g.closed(w) - trial) >= g.share_threshold for w in honest):
            bad = trial
    assert len(bad) >= 3
    vecs, rep = _run(monkeypatch, {u: _liar() for u in bad}, n=16, t=9, graph="harary", k=8)
    _exact_without(vecs, rep, bad)
    assert {u for u, _, _ in rep.verdicts} == bad


def test_colluders_past_a_secagg_plus_neighbourhood_bound_abort_with_the_reason(monkeypatch):
    g = _secagg_plus()
    victim = 0
    holders = len(g.closed(victim))
    crowd = sorted(g.neighbours[victim])[: holders - g.share_threshold + 1]
    with pytest.raises(SecureSumAborted) as e:
        _run(monkeypatch, {u: _liar() for u in crowd}, n=16, t=9, graph="harary", k=8)
    assert (e.value.stage, e.value.survivors, e.value.threshold) == (
        "masked-input", g.share_threshold - 1, g.share_threshold)


def test_t_minus_1_colluders_past_the_bound_abort_with_the_reason(monkeypatch):
    # n = 10, t = 7: six colluding liars leave four honest clients, fewer than t = 7 -- the
    # round cannot complete and aborts at masked-input saying so; it never excludes an honest
    # client or returns a wrong sum
    bad = {u: _liar() for u in range(4, 10)}
    with pytest.raises(SecureSumAborted) as e:
        _run(monkeypatch, bad)
    assert (e.value.stage, e.value.survivors, e.value.threshold) == ("masked-input", 4, 7)
