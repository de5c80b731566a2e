"""A node's ledger cannot be rolled back silently (issue 33, item 6), from the seat of
whoever can touch the ledger file but not the head file kept apart from it (node config
``ledger-head``, beside the node's key): a truncated (at a line boundary), deleted,
replaced or moved-to-a-fresh-path ledger is refused with a typed error before the node
touches its data, never read as less spent. The real node logic answers real upload
instructions (LocalDP, client level) with a budget of K releases."""

import importlib.util
import os
import shutil

import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from flwr.app import Context, RecordDict  # noqa: E402
from test_flower_client_dp import _fedavg  # noqa: E402
from test_flower_node_ledger import DELTA, _budget_for, _step_message  # noqa: E402
from test_flower_runtime import _partition, task_identity  # noqa: E402,F401

from algorithms.fedavg import FedAvg  # noqa: E402
from secagg.errors import ProtocolError  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.privacy.node_ledger import (  # noqa: E402
    LedgerRolledBack,
    LedgerUninitialised,
    NodeLedger,
    check_head,
    init_ledger,
    read_ledger,
)

K = 2  # releases the node's budget admits


@pytest.fixture
def trained(monkeypatch):
    """Rounds in which the node's training ran (a spy)."""
    seen: list[int] = []
    real = FedAvg.local_update

    def spy(self, client, params, round):
        seen.append(round)
        return real(self, client, params, round)

    monkeypatch.setattr(FedAvg, "local_update", spy)
    return seen


def _node_context(ledger, head, **extra):
    return Context(run_id=1, node_id=100, run_config={}, state=RecordDict(),
                   node_config={"partition-id": 0, "ledger-path": str(ledger),
                                "ledger-head": str(head), "ledger-init": "true",
                                "client-budget": f"server={_budget_for(K)}",
                                "client-budget-delta": DELTA, **extra})


def _spend(tmp_path, rounds, run="r1"):
    """A node that took part in ``rounds`` releases of ``run``: (node, ledger, head)."""
    ledger, head = tmp_path / "ledger" / "l.jsonl", tmp_path / "keys" / "node.ledger-head"
    node = _Node(_fedavg, node_partition_loader(_partition))
    for r in range(rounds):
        node.handle(_step_message(node, None, run=run, rnd=r), _node_context(ledger, head))
    assert len(read_ledger(ledger).charged()) == rounds
    return node, ledger, head


def test_a_ledger_truncated_at_a_line_boundary_is_refused(tmp_path, trained):
    """The issue's attack: the budget admits K releases; K are spent; the file is cut
    back to its first release (intent and commit lines). Before: the node read one
    release spent and admitted more (5 releases, eps 4.98 against 3.33). Now: refused."""
    node, ledger, head = _spend(tmp_path, K)
    lines = ledger.read_bytes().split(b"\n")
    ledger.write_bytes(b"\n".join(lines[:2]) + b"\n")
    trained.clear()
    with pytest.raises(ProtocolError, match="truncated or replaced"):
        node.handle(_step_message(node, None, rnd=K), _node_context(ledger, head))
    assert trained == []
    with pytest.raises(LedgerRolledBack):
        check_head(ledger, head)


def test_a_deleted_ledger_is_refused_not_read_as_zero(tmp_path, trained):
    node, ledger, head = _spend(tmp_path, 1)
    ledger.unlink()
    trained.clear()
    with pytest.raises(ProtocolError, match="never read as zero spent"):
        node.handle(_step_message(node, None, rnd=1), _node_context(ledger, head))
    assert trained == [] and not ledger.exists()


def test_a_ledger_path_moved_to_a_fresh_file_is_refused(tmp_path, trained):
    """ledger-path changed to a new, empty place (ledger-init still set): the head kept
    beside the key says releases were charged; the fresh file holds none."""
    node, ledger, head = _spend(tmp_path, 1)
    trained.clear()
    with pytest.raises(ProtocolError, match="never read as zero spent"):
        node.handle(_step_message(node, None, rnd=1),
                    _node_context(tmp_path / "elsewhere.jsonl", head))
    assert trained == []


def test_a_ledger_replaced_by_another_history_is_refused(tmp_path, trained):
    """Variant: the file replaced by a valid chain of its own (another node's fresh
    ledger with one release, so as long as the real one)."""
    node, ledger, head = _spend(tmp_path, 1)
    other = tmp_path / "other"
    _, l2, _ = _spend(other, 1, run="r9")
    shutil.copyfile(l2, ledger)
    assert len(read_ledger(ledger).entries) == len(read_ledger(l2).entries)
    with pytest.raises(ProtocolError, match="truncated or replaced"):
        node.handle(_step_message(node, None, rnd=1), _node_context(ledger, head))


def test_a_lost_head_or_an_uninitialised_ledger_is_refused(tmp_path):
    """Variants: a head file deleted beside a non-empty ledger; a fresh ledger without
    the explicit start (no ledger-init)."""
    node, ledger, head = _spend(tmp_path, 1)
    head.unlink()
    with pytest.raises(ProtocolError, match="no head file"):
        node.handle(_step_message(node, None, rnd=1), _node_context(ledger, head))
    with pytest.raises(LedgerUninitialised):
        NodeLedger(ledger, head)
    fresh = tmp_path / "fresh.jsonl"
    with pytest.raises(ProtocolError, match="started only explicitly"):
        node.handle(_step_message(node, None, rnd=1),
                    _node_context(fresh, tmp_path / "fresh.head", **{"ledger-init": "false"}))
    assert not fresh.exists()
    # the explicit steps: adopting the file as it stands, or starting a fresh one
    init_ledger(ledger, head, adopt=True)
    assert len(check_head(ledger, head).charged()) == 1
    with pytest.raises(LedgerUninitialised, match="never re-initialised"):
        init_ledger(ledger, head)


def test_a_ledger_moved_with_its_contents_and_a_crash_before_the_head_update_are_fine(
        tmp_path):
    """What is not a rollback: the file moved with its history (ledger-path updated), and
    a crash between an append and the head's update (the file one entry ahead)."""
    node, ledger, head = _spend(tmp_path, 1)
    moved = tmp_path / "moved" / "l.jsonl"
    moved.parent.mkdir()
    ledger.rename(moved)
    node.handle(_step_message(node, None, rnd=1), _node_context(moved, head))
    assert len(check_head(moved, head).charged()) == 2
    before = head.read_bytes()
    with NodeLedger(moved, None) as led:  # an append whose head update never happened
        led.refuse("r1/9/train", {"note": "appended by a writer that crashed"})
    head.write_bytes(before)
    state = check_head(moved, head)
    assert len(state.entries) == 5 and state.head == read_ledger(moved).head
