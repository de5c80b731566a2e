"""secagg audit --threat: per field who reads it, attack results, exit status."""

from __future__ import annotations

import pytest

from algorithms.fedlog import FedLog
from secagg import Federation
from secagg.cli import main
from secagg.data import dirichlet_split, load_dataset
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum
from threat_models import view


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    part = dirichlet_split(load_dataset("digits"), n_clients=5, alpha=0.5, seed=0)
    out = {}
    for name, layer in (("plain", Plaintext()), ("secure", SecureSum(threshold=3))):
        res = Federation(FedLog(feature_dim=8), layer, part, rounds=1,
                         include_values=True).run()
        out[name] = res.save(tmp_path_factory.mktemp(name))["transcript"]
        out[name + "-t"] = res.transcript
    return out


def test_view_per_coalition(runs):
    v = view(runs["plain-t"], "server")[("stats", "stats")]
    assert v.clear_uploads == set(range(5)) and v.form == "clear"
    v = view(runs["secure-t"], "server")[("stats", "stats")]
    assert not v.clear_uploads and v.form == "masked" and v.sums["clear"] == 1
    v = view(runs["secure-t"], "clients:2")[("stats", "stats")]
    assert v.form == "nothing" and v.own == {0, 1}


def test_audit_threat_exit_status(runs, capsys):
    assert main(["audit", str(runs["plain"]), "--threat", "server"]) == 5
    out = capsys.readouterr().out
    assert "READABLE" in out and "label histogram: recovered for 5/5 clients" in out
    assert main(["audit", str(runs["secure"]), "--threat", "server+2"]) == 0
    out = capsys.readouterr().out
    assert "read in the clear by: active-server, server+3" in out
    assert "label histogram: recovered for 0/5" in out
    assert main(["audit", str(runs["secure"]), "--threat", "server+3"]) == 5
    assert main(["audit", str(runs["secure"]), "--threat", "server+bogus"]) == 1
