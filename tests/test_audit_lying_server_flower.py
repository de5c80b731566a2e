"""The lying server's transcript rewrites (issue 33, item 5) on a Flower transcript: the
nodes sign scheme v1 statements (no sequence numbers, no closing statement), so the audit
with the operators' keys catches deleted observations and minted keys, refuses the keys
the server collected as a trust root, and says plainly what it cannot check: its verified
line reads "scheme v1: partial" and the DP figures are labelled the server's word."""

import json

import pytest

pytest.importorskip("flwr")

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from algorithms import FedLog  # noqa: E402
from secagg import CentralDP, Plaintext  # noqa: E402
from secagg.attest import public_hex, write_identities  # noqa: E402
from secagg.cli import main  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402
from secagg.transcript import Transcript  # noqa: E402

N = 3


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
            rep = self.node.handle(m, self.contexts[m.metadata.dst_node_id])
            ids.append(m.metadata.message_id)
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


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    """(run folder, the operators' identities file outside it)."""
    grid = _Grid()
    layer = CentralDP(Plaintext(), noise_multiplier=0.85, delta=1e-5)
    # Flower stamps messages with the running task's identity (set by its runtimes)
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        result = FlowerFederation(_algo(), layer, load_dataset("digits"), rounds=2, seed=0,
                                  min_nodes=N, stage_timeout=0.5).run(grid)
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    base = tmp_path_factory.mktemp("flower")
    paths = result.save(base / "run")
    assert "announced_identities" in paths and "identities" not in paths
    ids = write_identities(base / "operators" / "identities.json", grid.operator_keys())
    return base / "run", ids


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


def test_an_honest_flower_run_verifies_partially_and_says_so(flower_run, capsys):
    folder, ids = flower_run
    rc, out = _audit(capsys, folder, ids)
    assert rc == 0, out
    assert out.splitlines()[0].startswith("attestation: verified (scheme v1: partial)")
    assert out.splitlines()[1].startswith(f"trusted: the public keys in {ids}")
    assert "DP: the figures below are the server's word" in out


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
