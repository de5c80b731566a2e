"""The transcript's closing record: counts and a running digest that expose truncation and
tampering, and a clear refusal of files that are not transcripts."""

import json

import numpy as np
import pytest

from secagg.errors import TranscriptError
from secagg.transcript import Transcript


def _transcript(rounds=3):
    t = Transcript()
    t.meta(algorithm={"name": "x"}, layer={"name": "plaintext"}, seed=0, rounds=rounds,
           clients=2)
    for r in range(rounds):
        for c in (0, 1):
            t.message(round=r, phase="p", stage="upload", sender=c, receiver="server",
                      direction="up", nbytes=40)
            t.observe(round=r, phase="p", stage="upload", party="server", sender=c,
                      field="f", form="clear", value=np.arange(3.0) + r + c)
    t.privacy(field=None, epsilon=1.0, delta=1e-5, private=True, n_events=rounds)
    return t


def test_close_counts_records_and_survives_a_round_trip(tmp_path):
    t = _transcript()
    t.close()
    end = t.records[-1]
    assert end["type"] == "end" and end["records"] == 14
    assert end["counts"] == {"run": 1, "message": 6, "observation": 6, "privacy": 1}
    assert end["rounds_completed"] == 3
    assert t.check() is None
    back = Transcript.read(t.write(tmp_path / "t.jsonl"))
    assert back.check() is None and back.records == json.loads(json.dumps(t.records))


def test_write_closes_an_open_transcript(tmp_path):
    back = Transcript.read(_transcript().write(tmp_path / "t.jsonl"))
    assert back.records[-1]["type"] == "end" and back.check() is None


def test_truncation_and_tampering_are_detected(tmp_path):
    path = _transcript().write(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    (tmp_path / "head.jsonl").write_text("".join(lines[:5]))  # header says 3 rounds, body 1
    assert "no closing record" in Transcript.read(tmp_path / "head.jsonl").check()
    (tmp_path / "gap.jsonl").write_text("".join(lines[:4] + lines[6:]))  # a record removed
    assert "counts" in Transcript.read(tmp_path / "gap.jsonl").check()
    rec = json.loads(lines[2])
    rec["sender"] = 1 - rec["sender"]
    (tmp_path / "alt.jsonl").write_text("".join(lines[:2]) + json.dumps(rec) + "\n"
                                        + "".join(lines[3:]))
    assert "digest" in Transcript.read(tmp_path / "alt.jsonl").check()
    (tmp_path / "cut.jsonl").write_text("".join(lines)[:-25])
    assert "cut mid-record" in Transcript.read(tmp_path / "cut.jsonl").check()
    (tmp_path / "more.jsonl").write_text("".join(lines + lines[1:3]))
    assert "after the closing record" in Transcript.read(tmp_path / "more.jsonl").check()


def test_result_json_and_garbage_are_refused_with_what_to_pass(tmp_path):
    res = tmp_path / "result.json"
    res.write_text(json.dumps({"algorithm": {"name": "fedlog"}, "layer": {"name": "x"},
                               "accuracy": 0.9}, indent=2))
    with pytest.raises(TranscriptError, match="result summary.*transcript.jsonl"):
        Transcript.read(res)
    (tmp_path / "g.jsonl").write_text('{"type": "run"}\nnot json\n{"type": "end"}\n')
    with pytest.raises(TranscriptError, match="g.jsonl:2"):
        Transcript.read(tmp_path / "g.jsonl")
