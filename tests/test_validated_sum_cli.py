"""``secagg run --layer validated-sum``: the cheaters it rejects are listed in result.json,
and ``secagg audit`` shows that their vectors were never reconstructed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from secagg.audit import audit, format_audit
from secagg.cli import main
from secagg.costs import SERVER
from secagg.transcript import Transcript
from secagg.validated_sum import AGGREGATOR_B


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_run_lists_rejected_cheaters_and_audit_shows_them_never_reconstructed(
        tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = _main(["run", "--algorithm", "fedavg", "--clip", "5", "--layer",
                        "validated-sum", "--cheaters", "2", "--clients", "6", "--rounds", "1",
                        "--local-epochs", "1", "--quiet", "--out", str(out)], capsys)
    assert rc == 0, err
    res = json.loads((out / "result.json").read_text())
    assert res["layer"]["name"] == "validated-sum" and res["layer"]["cheaters"] == 2
    rejected = res["rejected"]
    assert [(r["round"], r["client"]) for r in rejected] == [(0, 0), (0, 1)]
    assert all("rejected" in r["why"] for r in rejected)
    assert res["participation"][0][2:] == [4, 6]  # 4 of the 6 in the sum

    rc, text, err = _main(["audit", str(out / "transcript.jsonl"), "--identities",
                           str(tmp_path / "run.keys" / "identities.json")], capsys)
    assert rc == 0, err  # attestation verified: each SHARE_X is signed as masked
    assert "attestation: verified" in text
    assert "no rejected client's vector was reconstructed" in text
    rc, js, _ = _main(["audit", str(out), "--json"], capsys)
    rep = json.loads(js)
    (v,) = rep["validation"]
    assert v["accepted"] == 4 and sorted(v["rejected"]) == ["0", "1"]
    assert v["reconstructed"] == []
    for c in ("0", "1"):  # each aggregator saw one masked share of it, nothing else
        assert v["seen"][c] == {SERVER: {"masked": 1}, AGGREGATOR_B: {"masked": 1}}


def _transcript(clear_from: int | None, in_sum: list[int]) -> Transcript:
    t = Transcript()
    for c in range(3):
        for party in (SERVER, AGGREGATOR_B):
            t.observe(round=0, phase="train", stage="share", party=party, sender=c,
                      field="update", form="masked", value=b"x" * 8)
    if clear_from is not None:
        t.observe(round=0, phase="train", stage="result", party=SERVER, sender=clear_from,
                  field="update", form="clear", value=np.zeros(2))
    t.verdict(round=0, phase="train", party=SERVER, accepted=in_sum,
              rejected={2: "proof failed"})
    return t


@pytest.mark.parametrize(("clear_from", "in_sum", "bad"), [
    (None, [0, 1], []),
    (2, [0, 1], [2]),  # an aggregator read the rejected client's vector
    (None, [0, 1, 2], [2]),  # the sum holds the rejected client all the same
])
def test_audit_flags_a_rejected_vector_that_was_reconstructed(clear_from, in_sum, bad):
    rep = audit(_transcript(clear_from, in_sum))
    (v,) = rep["validation"]
    assert v["reconstructed"] == bad
    text = format_audit(rep)
    assert ("WERE reconstructed" in text) == bool(bad)
    assert ("its vector was never reconstructed" in text) == (not bad)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--layer", "secure-sum", "--cheaters", "2"], "--cheaters does not apply"),
    (["--layer", "plaintext", "--bound", "3"], "--bound does not apply"),
    (["--layer", "validated-sum", "--cheaters", "-1"], "--cheaters must be >= 0"),
    (["--layer", "validated-sum", "--bound", "0"], "--bound must be a positive"),
])
def test_cli_refuses_validated_sum_options_elsewhere_or_out_of_range(argv, needle, capsys):
    rc, _, err = _main(["run", *argv, "--clients", "4", "--rounds", "1", "--quiet"], capsys)
    assert rc != 0 and needle in err, err


def test_flower_refuses_validated_sum_with_the_reason():
    """Until aggregator B has a node role, a remote runtime refuses the layer (alone or
    inside CentralDP) before any client step, saying why."""
    from secagg.errors import ConfigurationError
    from secagg.privacy import CentralDP
    from secagg.remote_layers import check_remote
    from secagg.validated_sum import ValidatedSum

    with pytest.raises(ConfigurationError, match="does not run on Flower") as e:
        check_remote(ValidatedSum())
    assert "protocol-step dispatch" in str(e.value)  # the registry entry's reason
    with pytest.raises(ConfigurationError, match="CentralDP around ValidatedSum"):
        check_remote(CentralDP(ValidatedSum(), epsilon=1.0, delta=1e-5))
