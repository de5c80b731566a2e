"""The lying server's transcript rewrites (issue 33, item 5) on a Flower transcript. The
nodes sign scheme v2 statements: numbered in each node's own ``Context.state``, and closed
at the end of the run by a signed closing statement (step ``close``) with the node's count
and the run's DP terms, which the node first checks against the noise it applied itself.
So the audit with the operators' keys (an identities file outside the run folder, scheme
v2) verifies an honest run in full, and catches a rewritten epsilon, an erased node,
records moved to another round, deleted observations and minted keys; a ServerApp that
asks the nodes to sign DP terms understating their noise gets no closing statement, and
the audit names every node it could not check."""

import json

import pytest
from flwr.app import Error
from flwr.app import Message as FlowerMessage
from flwr.common.constant import ErrorCode

pytest.importorskip("flwr")

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from algorithms import FedLog  # noqa: E402
from secagg import CentralDP, LocalDP, Plaintext  # noqa: E402
from secagg.attest import SCHEME, public_hex, write_identities  # noqa: E402
from secagg.cli import main  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.records import read  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402
from secagg.transcript import Transcript  # noqa: E402

N = 3
VICTIM = 1  # the node whose records the server erases


def _partition():
    return dirichlet_split(load_dataset("digits"), N, 0.5, seed=1, local_test_fraction=0.2)


def _algo():
    return FedLog(feature_dim=4, local_epochs=1)


class _Grid(Grid):
    """Each message goes to its node's ClientApp logic in this process."""

    def __init__(self):
        self.node = _Node(_algo, node_partition_loader(_partition))
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i},
                                          state=RecordDict(), run_config={})
                         for i in range(N)}
        self.replies = []

    def app(self):
        """The ClientApp logic that handles the next message (one per grid here)."""
        return self.node

    def lose(self, message):
        """Whether the reply to ``message`` is lost in transit (never, here)."""
        return False

    def set_run(self, run):
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id  # as a SuperLink stamps it
            try:
                rep = self.app().handle(m, self.contexts[m.metadata.dst_node_id])
            except Exception as exc:  # as Flower's ClientApp runtime: an error reply
                rep = FlowerMessage(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                          reason=f"{type(exc)}:<'{exc}'>"), reply_to=m)
            ids.append(m.metadata.message_id)
            if not self.lose(m):
                self.replies.append(rep)
        return ids

    def pull_messages(self, message_ids):
        out = [r for r in self.replies if r.metadata.reply_to_message_id in message_ids]
        self.replies = [r for r in self.replies if r not in out]
        return out

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError

    def operator_keys(self):
        """The nodes' public keys as their operators hold them (from each node's state)."""
        return {str(nid - 100): public_hex(Ed25519PrivateKey.from_private_bytes(
            ctx.state.config_records["secagg-identity"]["ed25519"]))
            for nid, ctx in self.contexts.items()}


def _flower(layer, base, fed=FlowerFederation, rounds=2, grid=None):
    """Run ``layer`` over the in-process grid; (run folder, the operators' identities
    file outside it, scheme v2)."""
    grid = grid or _Grid()
    # Flower stamps messages with the running task's identity (set by its runtimes)
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        result = fed(_algo(), layer, load_dataset("digits"), rounds=rounds, seed=0,
                     min_nodes=N, stage_timeout=0.5).run(grid)
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    paths = result.save(base / "run")
    assert "announced_identities" in paths and "identities" not in paths
    ids = write_identities(base / "operators" / "identities.json", grid.operator_keys(),
                           scheme=SCHEME)
    return base / "run", ids


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    """An honest run, central DP at eps 7.99 over 2 rounds: (run folder, identities)."""
    layer = CentralDP(Plaintext(), noise_multiplier=0.85, delta=1e-5)
    return _flower(layer, tmp_path_factory.mktemp("flower"))


def _records(folder):
    return [json.loads(ln) for ln in (folder / "transcript.jsonl").read_text().splitlines()]


def _rewrite(records, folder):
    folder.mkdir(parents=True, exist_ok=True)
    t = Transcript()
    t.records = [r for r in records if r.get("type") != "end"]
    t.close()
    t.write(folder / "transcript.jsonl")
    return folder


def _audit(capsys, folder, ids):
    rc = main(["audit", str(folder), "--identities", str(ids)])
    return rc, capsys.readouterr().out


def _stmt(r):
    return r.get("statement", {}) if r.get("type") == "attestation" else {}


def _problems(out):
    """The attestation problems the audit printed."""
    return [ln.strip() for ln in out.splitlines() if ln.startswith("  record ")]


def test_an_honest_flower_run_verifies_in_full(flower_run, capsys):
    folder, ids = flower_run
    rc, out = _audit(capsys, folder, ids)
    assert rc == 0, out
    first = out.splitlines()[0]
    assert first.startswith("attestation: verified - ") and "partial" not in first
    assert out.splitlines()[1].startswith(f"trusted: the public keys in {ids}")
    assert "server's word (no party signed" not in out
    assert f"from the DP terms {N} parties signed): eps=7.9" in out
    assert "(remote nodes: each signed these terms" in out  # CentralDP: 0 checked by them
    assert "releases it noised itself, 0 in all; noise the server adds itself" in out
    recs = _records(folder)
    closes = [_stmt(r) for r in recs if _stmt(r).get("stage") == "end"]
    assert sorted(c["sender"] for c in closes) == list(range(N))
    for c in closes:  # each node's count is the number of its statements before it
        assert c["seq"] == c["params"]["statements"] == sum(
            1 for r in recs if _stmt(r).get("sender") == c["sender"]) - 1


# -- the three transcript rewrites that passed a Flower audit, and a variant ----------

def test_flower_privacy_records_rewritten_from_eps_8_to_0_05_fail(flower_run, tmp_path,
                                                                    capsys):
    folder, ids = flower_run
    recs = _records(folder)
    claimed = [r["epsilon"] for r in recs if r["type"] == "privacy"]
    assert claimed and all(7.9 < e <= 8.0 for e in claimed)
    for r in recs:
        if r["type"] == "privacy":
            r["epsilon"] = 0.05
            r["holds_against"] = ["every observer, the aggregator included"]
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4, out
    problems = _problems(out)
    assert problems and all("the server's privacy record claims eps=0.05" in p
                            and "gives eps=7.9" in p for p in problems), problems


def test_flower_one_nodes_records_all_removed_fail(flower_run, tmp_path, capsys):
    folder, ids = flower_run
    recs = [r for r in _records(folder) if VICTIM not in (
        r.get("sender"), r.get("receiver"), r.get("client"), _stmt(r).get("sender"))]
    for r in recs:  # the header's keys and node count no longer name it either
        if r["type"] == "run":
            r["attestation"]["keys"].pop(str(VICTIM))
            r["clients"] = N - 1
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4, out
    assert _problems(out) == [f"record 0: missing: party {VICTIM} signed no closing "
                              "statement: all its records were removed"], out


def test_flower_message_records_moved_to_another_round_fail(flower_run, tmp_path, capsys):
    folder, ids = flower_run
    recs = _records(folder)
    moved = 0
    for r in recs:
        if r["type"] == "message" and r["round"] == 0 and r["sender"] == VICTIM:
            r["round"] = 1
            moved += 1
    assert moved
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4, out
    problems = _problems(out)
    assert any("has no signed statement (of that round" in p for p in problems), out
    assert any("does not record (removed or moved)" in p for p in problems), out
    assert all(f"from {VICTIM} " in p or f"{VICTIM} signed" in p for p in problems), problems


def test_flower_a_node_made_to_look_silent_at_close_is_named_unverified(
        flower_run, tmp_path, capsys):
    """The server drops a node's last upload with its statement and observations, and
    its closing statement, and records that the node did not answer the closing request:
    the audit does not pass, and says what it cannot check of that node."""
    folder, ids = flower_run
    recs = _records(folder)
    last = max(_stmt(r)["seq"] for r in recs if _stmt(r).get("sender") == VICTIM
               and _stmt(r).get("stage") != "end")
    gone = next(_stmt(r) for r in recs if _stmt(r).get("sender") == VICTIM
                and _stmt(r).get("seq") == last)
    recs = [r for r in recs if not (
        _stmt(r).get("sender") == VICTIM and _stmt(r).get("seq", -1) >= last
        or r.get("sender") == VICTIM and r.get("round") == gone["round"]
        and r["type"] in ("message", "observation"))]
    recs.append({"type": "unclosed", "party": str(VICTIM), "reason": "no reply within 0.5 s"})
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4, out
    problems = _problems(out)
    assert len(problems) == 1 and ": unverified: party 1 signed no closing statement" in \
        problems[0] and "did not answer the closing request (no reply within 0.5 s)" in \
        problems[0] and f"after number {last - 1}" in problems[0], problems


class _UnderstatingServer(FlowerFederation):
    """A ServerApp that, at the end of the run, asks the nodes to sign DP terms with ten
    times the noise they added (its privacy records can then claim a tiny epsilon)."""

    def _close_nodes(self, terms):
        lie = json.loads(json.dumps(terms))
        for e in lie["events"]:
            e["noise_multiplier"] *= 10
        return super()._close_nodes(lie)


def test_flower_nodes_refuse_to_sign_dp_terms_that_understate_their_noise(
        tmp_path, capsys):
    layer = LocalDP(Plaintext(), noise_multiplier=1.0, delta=1e-5)
    folder, ids = _flower(layer, tmp_path, fed=_UnderstatingServer, rounds=1)
    recs = _records(folder)
    assert not [r for r in recs if _stmt(r).get("stage") == "end"]  # nobody signed it
    assert sorted(r["party"] for r in recs if r["type"] == "unclosed") == \
        [str(c) for c in range(N)]
    assert all("misdescribe the noise it applied" in r["reason"] and "other noise than "
               "this party added (noise multiplier 1.0)" in r["reason"]
               for r in recs if r["type"] == "unclosed")
    rc, out = _audit(capsys, folder, ids)
    assert rc == 4, out
    problems = _problems(out)
    assert len(problems) == N and all(": unverified: " in p and "the DP terms it applied"
                                      in p for p in problems), problems


def test_flower_clear_upload_observations_deleted_fail(flower_run, tmp_path, capsys):
    folder, ids = flower_run
    recs = [r for r in _records(folder) if not (
        r["type"] == "observation" and r["form"] == "clear" and r["what"] == "upload")]
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4 and "never records seeing" in out


def test_flower_keys_the_server_collected_are_refused_and_minted_keys_fail(
        flower_run, tmp_path, capsys):
    folder, ids = flower_run
    rc, out = _audit(capsys, folder, folder / "announced_identities.json")
    assert rc == 4 and "lies in the run folder" in out
    recs = _records(folder)
    mine = {}
    for r in recs:
        if r["type"] == "attestation":
            st = r["statement"]
            key = mine.setdefault(str(st["sender"]), Ed25519PrivateKey.generate())
            from secagg.attest import Statement, sign

            r.update(sign(key, Statement.from_json(st)))
        if r["type"] == "run":
            r["attestation"]["keys"] = {}
    for r in recs:
        if r["type"] == "run":
            r["attestation"]["keys"] = {p: public_hex(k) for p, k in mine.items()}
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4 and "(replaced)" in out and "does not verify" in out


class _LossyGrid(_Grid):
    """The reply of node VICTIM to its upload instruction never reaches the server."""

    def app(self):
        """The ClientApp logic that handles the next message (one per grid here)."""
        return self.node

    def lose(self, message):
        rec = read(message)
        return message.metadata.dst_node_id == 100 + VICTIM and rec["step"] == "upload"


def test_flower_a_reply_lost_in_transit_leaves_a_gap_the_audit_names_without_passing(
        tmp_path, capsys):
    """The node signed an upload the server never got (it drops the node at that stage):
    the audit cannot tell that from a deletion, so it does not pass, and says both."""
    folder, ids = _flower(Plaintext(), tmp_path, rounds=1, grid=_LossyGrid())
    recs = _records(folder)
    assert any(r["type"] == "message" and r["sender"] == VICTIM
               and r["stage"].startswith("dropped:") for r in recs)
    rc, out = _audit(capsys, folder, ids)
    assert rc == 4, out
    assert _problems(out) == [
        f"record 0: missing: party {VICTIM}: statements number 0 of its 0-0 are missing "
        "(its messages were removed with their statements; or, on this remote runtime, "
        "replies that reached the server after their stage's timeout or not at all: the "
        "audit cannot tell those from deleted ones)"], out


class _RestartingGrid(_Grid):
    """Each message is handled by a fresh ClientApp (a process restarted per message):
    only the node's Context.state carries anything over."""

    def app(self):
        return _Node(_algo, self.node.loader)


def test_flower_node_numbers_live_in_context_state_across_restarts(tmp_path, capsys):
    folder, ids = _flower(Plaintext(), tmp_path, rounds=2, grid=_RestartingGrid())
    rc, out = _audit(capsys, folder, ids)
    assert rc == 0, out
    recs = _records(folder)
    for c in range(N):  # two uploads, then the closing statement numbered 2
        assert [_stmt(r)["seq"] for r in recs if _stmt(r).get("sender") == c] == [0, 1, 2]


def test_a_malformed_or_foreign_closing_request_is_a_typed_error():
    from flwr.app import Message

    from secagg.errors import ProtocolError
    from secagg.flower.records import content

    grid = _Grid()
    ctx = grid.contexts[100]
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        def send(**fields):
            m = Message(content(**fields), dst_node_id=100, message_type="train.secagg")
            return grid.node.handle(m, ctx)

        with pytest.raises(ProtocolError, match="did not join"):
            send(step="close", run="r1", round=0)
        send(step="hello", run="r1")
        for bad, why in (("{", "not JSON"), ("[1, 2]", "not a JSON object")):
            with pytest.raises(ProtocolError, match=why):
                send(step="close", run="r1", round=0, dp_terms=bad)
        rep = read(send(step="close", run="r1", round=0))
        (st,) = [r["statement"] for r in json.loads(rep["att"])]
        assert (st["sender"], st["stage"], st["seq"], st["params"]["statements"]) == \
            (0, "end", 0, 0)
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
