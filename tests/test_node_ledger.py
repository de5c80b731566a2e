"""A node's ledger file (secagg.privacy.node_ledger): a crash between intent and commit
counts as spent, a replayed message is charged once, any edit to a line before the last
breaks the chain at a named line, a torn last line is reported (never accepted or
dropped silently), one writer at a time, and the head names the history."""

import hashlib
import json

import pytest

from secagg.errors import PrivacyError
from secagg.privacy.node_ledger import (
    GENESIS,
    LedgerConflict,
    LedgerCorrupt,
    LedgerLocked,
    LedgerTorn,
    NodeLedger,
    read_ledger,
    repair_torn_tail,
)


def _event(r):
    return {"run": "r1", "round": r, "phase": "train", "noise_multiplier": 1.0}


def _three(path):
    with NodeLedger(path) as led:
        for r in range(3):
            assert led.intend(f"m{r}", _event(r))
            led.commit(f"m{r}", {"status": "uploaded"})
        return led.head


def test_a_crash_between_intent_and_commit_counts_as_spent(tmp_path):
    path = tmp_path / "node" / "ledger.jsonl"
    led = NodeLedger(path)
    led.intend("m0", _event(0))
    led.commit("m0")
    led.intend("m1", _event(1))  # synced; then the node "crashes": no commit, no close
    led._lock.release()  # what the process's death does to its lock
    again = NodeLedger(path)  # the restarted node
    assert again.charged() == [_event(0), _event(1)]
    assert again.state.committed() == [_event(0)]
    assert again.state.uncommitted() == [_event(1)]
    # the restarted node does not answer the message again: it stays charged once
    assert again.intend("m1", _event(1)) is False
    assert len(read_ledger(path).charged()) == 2
    again.close()


def test_a_replayed_message_is_charged_once(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with NodeLedger(path) as led:
        assert led.intend("m0", _event(0)) is True
        led.commit("m0")
        size = path.stat().st_size
        assert led.intend("m0", _event(0)) is False  # the replay: nothing written
        assert path.stat().st_size == size
        assert led.charged() == [_event(0)]
        with pytest.raises(LedgerConflict, match="other terms"):
            led.intend("m0", {**_event(0), "noise_multiplier": 0.1})
        with pytest.raises(LedgerConflict, match="committed twice"):
            led.commit("m0")
        with pytest.raises(LedgerConflict, match="without its intent"):
            led.commit("never-sent")
    assert read_ledger(path).charged() == [_event(0)]


def test_tampering_with_a_middle_line_breaks_the_chain_at_the_next_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _three(path)
    lines = path.read_bytes().split(b"\n")
    rec = json.loads(lines[2])  # line 3: the second intent
    rec["payload"]["noise_multiplier"] = 9.0  # claim more noise than was charged
    lines[2] = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorrupt) as err:
        read_ledger(path)
    assert err.value.line == 4 and "chain breaks" in str(err.value)
    assert isinstance(err.value, PrivacyError)
    # removing a line breaks it too
    _three(tmp_path / "b.jsonl")
    b = (tmp_path / "b.jsonl").read_bytes().split(b"\n")
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(b[:1] + b[2:]))
    with pytest.raises(LedgerCorrupt, match=":2: the digest chain breaks"):
        read_ledger(tmp_path / "b.jsonl")
    # and so does garbage in the middle
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(b[:1] + [b"{not json"] + b[1:]))
    with pytest.raises(LedgerCorrupt, match=":2: not a JSON"):
        read_ledger(tmp_path / "c.jsonl")


def test_a_torn_last_line_is_reported_and_repaired_only_on_request(tmp_path):
    path = tmp_path / "ledger.jsonl"
    head = _three(path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"id":"m3","kind":"inte')  # a crash mid-append
    with pytest.raises(LedgerTorn) as err:
        read_ledger(path)
    assert err.value.line == 7
    with pytest.raises(LedgerTorn):
        NodeLedger(path)  # the node does not write on top of it
    state = read_ledger(path, allow_torn=True)
    assert state.torn == b'{"id":"m3","kind":"inte' and state.head == head
    assert len(state.charged()) == 3
    assert repair_torn_tail(path) == state.torn
    assert path.read_bytes() == whole
    assert (tmp_path / "ledger.jsonl.torn").read_bytes() == state.torn + b"\n"
    with NodeLedger(path) as led:  # usable again, chained on the same head
        assert led.head == head
        led.intend("m3", _event(3))
        assert led.state.entries[-1].prev == head


def test_the_head_is_the_digest_of_the_last_line_and_stable_across_reads(tmp_path):
    path = tmp_path / "ledger.jsonl"
    assert read_ledger(path).head == GENESIS  # no file: empty ledger
    head = _three(path)
    last = path.read_bytes().rstrip(b"\n").split(b"\n")[-1]
    assert head == hashlib.sha256(last).hexdigest()
    assert read_ledger(path).head == read_ledger(path).head == head
    first = json.loads(path.read_bytes().split(b"\n")[0])
    assert first["prev"] == GENESIS
    # a second ledger with the same events has the same head; other events, another head
    assert _three(tmp_path / "twin.jsonl") == head
    with NodeLedger(tmp_path / "other.jsonl") as led:
        led.intend("m0", _event(5))
        assert led.head != read_ledger(path).entries[0].digest


def test_one_writer_at_a_time(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = NodeLedger(path)
    with pytest.raises(LedgerLocked, match="another writer"):
        NodeLedger(path)
    with pytest.raises(LedgerLocked):
        repair_torn_tail(path)
    led.close()
    with NodeLedger(path) as again:  # released on close
        again.intend("m0", _event(0))
    with pytest.raises(PrivacyError, match="closed"):
        again.intend("m1", _event(1))


def test_a_failed_append_closes_the_writer(tmp_path, monkeypatch):
    """A write that fails (disk full, a signal) may leave a torn line: the writer stops
    rather than chain a next entry on top of it, and the next writer finds the tear."""
    import os

    path = tmp_path / "ledger.jsonl"
    led = NodeLedger(path)
    led.intend("m0", _event(0))

    def full(fd):
        with path.open("ab") as fh:  # what a cut write leaves: half a line
            fh.write(b'{"id":"m1"')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        led.intend("m1", _event(1))
    monkeypatch.undo()
    with pytest.raises(PrivacyError, match="closed"):
        led.commit("m0")
    with pytest.raises(LedgerTorn):
        NodeLedger(path)  # the lock was released; the tear is found
