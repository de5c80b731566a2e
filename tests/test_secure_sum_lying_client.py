"""A lying client excludes only itself, at every stage (issue 33), on the embedded runtime.

Each attacker is a real :class:`Client` subclass that runs the real cryptography and lies at one
step, signing its lie where the protocol has it sign (so the lie, not a broken signature, is
what the server must catch). n = 10, threshold 7 unless a case says otherwise. On the code
before issue 33 every single-liar case here aborted the round (a bad tag or commitment, a wrong
share: "refusing to unmask"; a wrong unmask response blamed honest client 0), the unpinned key
aborted it at 'share' and ``on_abort="skip"`` crashed on the ProtocolError.

The Flower runtime's cases (the same liars inside the node code) are in
tests/test_flower_lying_client.py.
"""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from lying_clients import (
    bad_commitment,
    bad_tag,
    liar,
    other_round_tag,
    tag_for_round,
    wrong_share_to,
    wrong_unmask,
)

import secagg.secure_sum.protocol as protocol
from secagg.dropouts import ScheduledDropouts
from secagg.engine import guard_phase
from secagg.errors import ProtocolError, SecureSumAborted
from secagg.layers.base import RoundContext
from secagg.secure_sum import UnrecoverableSecret, run_secure_sum
from secagg.secure_sum.client import Client

BITS, M, N, T = 24, 6, 10, 7


def _ctx(round=2):
    return RoundContext(round=round, phase="t", seed=0, dropouts=ScheduledDropouts({}))


def _vectors(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**BITS, M, dtype=np.uint64) for u in range(n)}


def _ring_sum(vecs, ids):
    return (sum(vecs[u].astype(object) for u in ids) % (1 << BITS)).astype(np.uint64)


def _run(monkeypatch, bad, n=N, t=T, identities=None, seed=1):
    """One session where ``bad`` maps client ids to their lying Client subclass."""

    def make(cid, *args, **kwargs):
        return bad.get(cid, Client)(cid, *args, **kwargs)

    monkeypatch.setattr(protocol, "Client", make)
    vecs = _vectors(n)
    rep = run_secure_sum(vecs, BITS, _ctx(), threshold=t, entropy_seed=seed,
                         identities=identities)
    return vecs, rep


def _exact(vecs, rep, contributors):
    assert rep.contributors == tuple(sorted(contributors))
    assert np.array_equal(rep.total, _ring_sum(vecs, contributors))


# ------------------------------------------------------------------ one liar: item 3's ways

@pytest.mark.parametrize("lie", [bad_tag, other_round_tag], ids=["wrong", "other-round"])
def test_a_bad_integrity_tag_drops_only_its_sender(monkeypatch, lie):
    vecs, rep = _run(monkeypatch, {4: liar(lie)})
    _exact(vecs, rep, set(range(N)) - {4})
    assert [(st, u) for st, u, _ in rep.failures] == [("masked-input", 4)]
    assert "integrity tag" in rep.faults[4] and set(rep.faults) == {4}


def test_an_inconsistent_seed_commitment_is_its_senders_fault_and_the_sum_stays_exact(
        monkeypatch):
    """Its shares decode (all ten agree) to a seed its commitment contradicts: the server names
    the sender, uses the seed the shares encode, and the sum is exact."""
    vecs, rep = _run(monkeypatch, {4: liar(bad_commitment)})
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {4} and "commitment" in rep.faults[4]
    assert rep.failures == []


def test_one_wrong_share_inside_a_signed_ciphertext_is_corrected_and_names_its_dealer(
        monkeypatch):
    """Client 4 deals client 5 a wrong share of its seed (encrypted and signed as any other,
    under a signed digest of that wrong share, so client 5 cannot tell): client 5 returns what
    4 signed, the decoder corrects it, and the fault is the dealer's alone (before issue 33's
    digests the server could only record a dispute between 4 and 5). Client 4's input is
    already in the sum: it stays a contributor, named, its wrong share corrected."""
    vecs, rep = _run(monkeypatch, {4: liar(wrong_share_to([5]), "share_keys")})
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {4}
    assert "dealt client(s) [5] a wrong share of its self-mask seed" in rep.faults[4]
    assert rep.failures == [] and rep.excluded == () and rep.verdicts == []


def test_a_wrong_share_under_the_true_digest_is_caught_by_its_holder_at_forward(monkeypatch):
    """Client 4 deals client 5 a wrong share but signs the digest of the true one: client 5
    finds the mismatch when it decrypts, complains with its key, the server opens the relayed
    ciphertext, sees the mismatch itself and excludes the dealer (not the holder)."""
    vecs, rep = _run(monkeypatch, {4: liar(wrong_share_to([5], digest_of="true"),
                                           "share_keys")})
    _exact(vecs, rep, set(range(N)) - {4})
    assert rep.verdicts == [(5, 4, "upheld")] and rep.excluded == (4,)
    assert rep.faults == {}


def test_wrong_values_in_an_unmask_response_name_only_their_holder(monkeypatch):
    """Client 6 changes every share in its unmask response: each contradicts the digest its
    dealer signed, so client 6 alone is named, none of its shares is used, and the sum is
    exact from the other nine holders (the old code blamed client 0, then disputed)."""
    vecs, rep = _run(monkeypatch, {6: liar(wrong_unmask(), "unmask")})
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {6} and "contradicts the digest" in rep.faults[6]
    assert [(st, u) for st, u, _ in rep.failures] == [("unmask", 6)]
    assert rep.live["unmask"] == N - 1


def test_an_unpinned_key_is_refused_at_advertise_and_no_roster_is_poisoned(monkeypatch):
    """With pinned identities, client 3 advertises under a key that is not pinned: refused at
    advertise, the other nine finish exactly (the old server rostered it, and every honest
    client then refused the roster: 'stage share: 1 live clients')."""
    ids = {u: Ed25519PrivateKey.from_private_bytes(bytes([u + 1]) * 32) for u in range(N)}

    class Unpinned(Client):
        def __init__(self, cid, *args, **kwargs):
            super().__init__(cid, *args, **kwargs)
            self._sign = Ed25519PrivateKey.from_private_bytes(b"\x99" * 32)  # not pinned

    vecs, rep = _run(monkeypatch, {3: Unpinned}, identities=ids)
    _exact(vecs, rep, set(range(N)) - {3})
    assert "pinned identity" in rep.refused[3]
    assert rep.live["share"] == N - 1 and rep.pinned


# ------------------------------------------------------------------ our variants

def test_two_colluding_liars_within_the_bound_are_corrected_exactly(monkeypatch):
    """threshold 6: h = 10 shares, t_k = 6. Clients 1 and 8 both lie in every share of their
    unmask responses: each wrong share contradicts its dealer's signed digest, so both are
    named and their shares set aside; 8 shares of each seed are left and the sum is exact."""
    bad = {1: liar(wrong_unmask(), "unmask"), 8: liar(wrong_unmask(), "unmask")}
    vecs, rep = _run(monkeypatch, bad, t=6)
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {1, 8}


def test_two_lying_holders_of_one_seed_are_named_and_their_shares_set_aside(monkeypatch):
    """threshold 7 (bound 1): clients 1 and 8 both return wrong shares of client 5's seed --
    past the decoder's bound, the case that aborted before the signed digests. Each wrong
    share contradicts client 5's signed digest, so both holders are named and their shares
    set aside; 8 shares are left for t_k = 7 and the sum is exact."""
    bad = {1: liar(wrong_unmask({5}), "unmask"), 8: liar(wrong_unmask({5}), "unmask")}
    vecs, rep = _run(monkeypatch, bad)
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {1, 8}
    assert all("client 5's self-mask seed" in rep.faults[u] for u in (1, 8))


def test_liars_past_the_bound_abort_exactly_with_the_reason(monkeypatch):
    """threshold 7: one wrong share per secret is corrected; client 5 dealing two wrong shares
    of its seed (under its own signed digests, so the holders accept and return them) is past
    it: UnrecoverableSecret names the owner, the counts and the bound -- and on_abort="skip"
    would record it (it is an abort)."""
    bad = {5: liar(wrong_share_to([1, 8]), "share_keys")}
    with pytest.raises(UnrecoverableSecret) as info:
        _run(monkeypatch, bad)
    err = info.value
    assert (err.owner, err.secret, err.holders, err.threshold, err.max_errors) == (
        5, "self-mask seed", 10, 7, 1)
    assert err.stage == "unmask" and isinstance(err, SecureSumAborted)
    assert isinstance(err, ProtocolError)


def test_a_liar_that_lies_to_some_peers_only_is_corrected(monkeypatch):
    """Client 0 deals wrong shares to clients 3 and 7 only (two wrong shares of its seed;
    threshold 6: h = 10, t_k = 6, within the bound of 2): corrected, the sum exact."""
    vecs, rep = _run(monkeypatch, {0: liar(wrong_share_to([3, 7]), "share_keys")}, t=6)
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {0} and "dealt client(s) [3, 7]" in rep.faults[0]


def test_a_share_liar_and_a_tag_liar_together(monkeypatch):
    """Client 0 deals client 3 a wrong share, client 9 tags its vector for another round:
    9 is dropped (its mask key rebuilt from its holders, each of its pairwise masks removed),
    0's seed is corrected from the 9 remaining holders (bound 1), the other nine sum exactly."""
    bad = {0: liar(wrong_share_to([3]), "share_keys"), 9: liar(other_round_tag)}
    vecs, rep = _run(monkeypatch, bad, t=6)
    _exact(vecs, rep, set(range(N)) - {9})
    assert set(rep.faults) == {0, 9}
    assert "dealt client(s) [3]" in rep.faults[0] and "integrity tag" in rep.faults[9]


def test_a_replayed_tag_of_the_previous_round_is_refused(monkeypatch):
    """Client 2 sends, in round 2, a tag as it would have made it in round 1 for the same
    vector digest: bound to round 1, refused; client 2 dropped; the rest exact."""
    vecs, rep = _run(monkeypatch, {2: liar(tag_for_round(-1), "masked_input")})
    _exact(vecs, rep, set(range(N)) - {2})
    assert "integrity tag" in rep.faults[2]


# ------------------------------------------------------------------ item 4: on_abort="skip"

def test_on_abort_skip_records_a_protocol_error_and_goes_on():
    aborted, participation = [], []

    def step():
        raise ProtocolError("a message nobody can be blamed for")

    assert guard_phase(step, 2, "train", 10, "skip", aborted, participation)
    assert aborted == [(2, "train", "ProtocolError: a message nobody can be blamed for")]
    assert participation == [(2, "train", 0, 10)]
    with pytest.raises(ProtocolError):
        guard_phase(step, 2, "train", 10, "raise", [], [])


@pytest.fixture
def fed_liars(monkeypatch):
    def install(bad):
        def make(cid, *args, **kwargs):
            return bad.get(cid, Client)(cid, *args, **kwargs)
        monkeypatch.setattr(protocol, "Client", make)
    return install


def _federation(clients, on_abort="skip"):
    from algorithms.fedlog import FedLog
    from secagg.federation import Federation
    from secagg.secure_sum import SecureSum
    return Federation(FedLog(local_epochs=1, feature_dim=4), SecureSum(threshold=7), clients,
                      rounds=3,
                      seed=0, on_abort=on_abort, progress=False).run()


def test_federation_survives_a_liar_in_round_1_with_every_round_exact(digits_clients,
                                                                      fed_liars):
    """One liar in round 1 (a wrong unmask response): every round completes and equals the
    honest run (the old run crashed: 'WHOLE RUN CRASHED in round 2: ProtocolError')."""
    honest = _federation(digits_clients)
    fed_liars({6: liar(wrong_unmask(), "unmask", rounds={1})})
    lied = _federation(digits_clients)
    assert lied.aborted == [] and lied.history == honest.history


def test_federation_skip_records_liars_past_the_bound_and_goes_on(digits_clients, fed_liars):
    fed_liars({5: liar(wrong_share_to([1, 8]), "share_keys", rounds={1})})
    res = _federation(digits_clients)
    assert [(r, why.startswith("secure sum aborted at stage 'unmask'")) for r, _, why
            in res.aborted] == [(1, True)]
    assert [(r, got) for r, _, got, _ in res.participation] == [(0, 10), (1, 0), (2, 10)]


# ------------------------------------------------------------------ the decoder itself

@pytest.mark.parametrize("h,t", [(10, 7), (9, 4), (12, 5), (30, 20)])
def test_decode_corrects_up_to_the_bound_names_the_rows_and_refuses_past_it(h, t):
    """floor((h - t) / 2) wrong shares per column corrected and located (some columns with
    every wrong row, some with a subset, one clean); one more is refused."""
    import random

    from secagg.secure_sum import shamir

    rnd = random.Random(h * 100 + t)
    xs = [rnd.randrange(1, 2**32) for _ in range(h)]
    secrets_ = [rnd.randrange(shamir.P) for _ in range(5)]
    sh = shamir.share(secrets_, t, xs, rand=lambda k: rnd.randbytes(k))
    e = shamir.max_errors(h, t)
    assert e == (h - t) // 2
    bad = rnd.sample(range(h), e)
    for c in (0, 1, 3):
        for i in bad if c != 3 else bad[:1]:
            sh[i, c] = (sh[i, c] + rnd.randrange(1, shamir.P)) % shamir.P
    got, errors = shamir.decode(xs, sh, t)
    assert got == secrets_
    assert errors == [set(bad), set(bad), set(), set(bad[:1]), set()]
    spare = next(i for i in range(h) if i not in bad)
    sh[spare, 1] = (sh[spare, 1] + 1) % shamir.P
    with pytest.raises(shamir.DecodingError) as info:
        shamir.decode(xs, sh, t)
    assert (info.value.column, info.value.holders, info.value.max_errors) == (1, h, e)


def test_a_commitment_lie_with_a_corrected_share_as_well_aborts_rather_than_guess(monkeypatch):
    """Client 4's commitment lies and it deals client 6 a wrong share of its seed under its
    signed digest: a seed that needed correcting and still misses its commitment could be
    more liars than the bound, so the round aborts with the reason instead of trusting the
    decoded seed."""
    def both(client, msg):
        return bad_commitment(client, wrong_share_to([6])(client, msg))

    with pytest.raises(UnrecoverableSecret, match="inconsistent with its commitment") as info:
        _run(monkeypatch, {4: liar(both, "share_keys")})
    assert info.value.owner == 4


def test_a_commitment_lie_and_a_lying_holder_name_each_their_own_liar(monkeypatch):
    """Client 4's commitment lies and client 6 returns a wrong share of 4's seed: 6's share
    contradicts 4's signed digest and is set aside (6 named), the other nine agree on a seed
    4's commitment contradicts (4 named), and that seed gives the exact sum."""
    bad = {4: liar(bad_commitment), 6: liar(wrong_unmask({4}), "unmask")}
    vecs, rep = _run(monkeypatch, bad)
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {4, 6}
    assert "commitment" in rep.faults[4] and "client 4's self-mask seed" in rep.faults[6]


# ------------------------------------------------------------------ attribution (signed digests)

def _lies_about_mask_keys(client, msg):
    """Its UNMASK_RESPONSE with every requested mask-key share changed."""
    from secagg.secure_sum import shamir, wire

    body = wire.decode_header(msg, wire.MsgType.UNMASK_RESPONSE, client.session,
                              wire.SERVER_ID)[1]
    b, s = wire.parse_unmask_response(body)
    s = {v: [(e + 1) % shamir.P for e in els] for v, els in s.items()}
    return wire.encode(wire.MsgType.UNMASK_RESPONSE, client.session, client.cid,
                       wire.SERVER_ID, wire.unmask_response_body(b, s))


def test_a_wrong_mask_key_share_of_a_dropped_client_names_its_holder(monkeypatch):
    """Client 9 is dropped (its tag is for another round), so its mask key is rebuilt from
    its holders; client 6 returns wrong shares of it. Each contradicts the mask-key digest
    client 9 signed for client 6: client 6 is named (client 9 only for its tag), and the
    rebuilt key removes 9's pairwise masks exactly."""
    bad = {9: liar(other_round_tag), 6: liar(_lies_about_mask_keys, "unmask")}
    vecs, rep = _run(monkeypatch, bad, t=6)
    _exact(vecs, rep, set(range(N)) - {9})
    assert set(rep.faults) == {6, 9}
    assert "client 9's mask key" in rep.faults[6] and "integrity tag" in rep.faults[9]


def test_a_holder_that_accepts_an_unsigned_share_is_named_not_the_dealer(monkeypatch):
    """Client 4 deals client 5 a wrong share under a broken signature; client 5 deviates too:
    it accepts the share without checking the signature (an honest holder complains), then
    returns it. The share matches the digest in the entry, so the decoder corrects it; the
    entry does not carry client 4's signature, so nothing shows client 4 dealt it and the
    fault is client 5's (it provably accepted a share its dealer never signed)."""
    import secagg.secure_sum.client as client_mod
    from secagg.secure_sum import wire

    def unsigned(client, msg):
        msg = wrong_share_to([5])(client, msg)
        body = wire.decode_header(msg, wire.MsgType.SHARES, client.session, wire.SERVER_ID)[1]
        commitment, entries = wire.parse_shares(body)
        n = wire.SIGNED_SHARE_BYTES
        e = entries[5]
        entries[5] = e[:n] + bytes(wire.SIGNATURE_BYTES) + e[n + wire.SIGNATURE_BYTES:]
        return wire.encode(wire.MsgType.SHARES, client.session, client.cid, wire.SERVER_ID,
                           wire.shares_body(commitment, entries))

    class Credulous(Client):
        def receive_forward(self, forward_msg):
            real = client_mod.verify_signature
            client_mod.verify_signature = lambda *a: True  # checks no sender signature
            try:
                return super().receive_forward(forward_msg)
            finally:
                client_mod.verify_signature = real

    vecs, rep = _run(monkeypatch, {4: liar(unsigned, "share_keys"), 5: Credulous})
    _exact(vecs, rep, range(N))
    assert set(rep.faults) == {5} and "never signed" in rep.faults[5]
    assert rep.verdicts == []


def test_share_digests_bind_owner_holder_kind_and_round():
    """The digest a dealer signs changes with each field it binds, so a signed digest cannot
    be replayed for another holder, secret, round or session."""
    from secagg.secure_sum.client import share_digest

    els, s = [1, 2, 3], b"\x01" * 16
    base = share_digest(s, 2, 4, 5, "b", els)
    others = [share_digest(s, 2, 5, 4, "b", els), share_digest(s, 2, 4, 5, "sk", els),
              share_digest(s, 3, 4, 5, "b", els), share_digest(b"\x02" * 16, 2, 4, 5, "b", els),
              share_digest(s, 2, 4, 5, "b", [1, 2, 4])]
    assert len({base, *others}) == 6
    with pytest.raises(ValueError):
        share_digest(s, 2, 4, 5, "x", els)
