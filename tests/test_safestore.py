"""secagg.safestore: state read back without pickle (arrays + JSON, digest checked)."""

import pickle

import numpy as np
import pytest
import torch

from secagg import safestore
from secagg.costs import CostRow
from secagg.layers.base import Aggregate


def test_the_types_a_run_stores_round_trip():
    agg = Aggregate("stats", 2, sums={"a": np.arange(3.0)}, values={"e": {4: np.ones(2)}},
                    contributors=(1, 4), notes={"dropped": {}, "sigma": 0.5}, cohort=5)
    row = CostRow(round=1, phase="p", stage="upload", sender=3, receiver="server",
                  fields={"a": 24}, wire_bytes=99)
    obj = {"agg": agg, "rows": [row], "keys": {(0, "p"): "x"}, "b": b"\x00\xff",
           "s": {3, 1}, "t": (1, [2.5, None]), "n": np.int64(7), "__odd": 1}
    back = safestore.loads(safestore.dumps(obj))
    assert back["rows"] == [row] and back["keys"] == {(0, "p"): "x"}
    assert back["b"] == b"\x00\xff" and back["s"] == {1, 3} and back["t"] == (1, [2.5, None])
    assert back["n"] == 7 and back["__odd"] == 1
    got = back["agg"]
    assert isinstance(got, Aggregate) and got.contributors == (1, 4) and got.cohort == 5
    np.testing.assert_array_equal(got.sums["a"], agg.sums["a"])
    np.testing.assert_array_equal(got.values["e"][4], np.ones(2))


def test_a_model_is_stored_as_weights_and_loaded_into_the_readers_own():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    raw = safestore.dumps({"model": model})
    fresh = torch.nn.Linear(3, 2)
    back = safestore.loads(raw, lambda path, cls: fresh)
    assert back["model"] is fresh
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    with pytest.raises(safestore.StoreError, match="no Linear"):
        safestore.loads(raw)  # never constructed from the file


@pytest.mark.parametrize("value", [object(), np.array([object()], dtype=object), len])
def test_what_would_need_pickle_is_refused_on_write(value):
    with pytest.raises(safestore.StoreError):
        safestore.dumps({"x": value})


def test_a_pickle_or_an_altered_blob_is_refused_on_read(tmp_path):
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (marker.write_text, ("code ran",))

    with pytest.raises(safestore.StoreError):
        safestore.loads(pickle.dumps(Planted()))
    raw = bytearray(safestore.dumps({"a": np.arange(100)}))
    raw[-30] ^= 1
    with pytest.raises(safestore.StoreError, match="digest"):
        safestore.loads(bytes(raw))
    # a class outside the allow-list is not rebuilt
    desc = {"__class__": "Popen", "fields": {"args": "true"}}
    with pytest.raises(safestore.StoreError, match="not allowed"):
        safestore.decode(desc, {})
    assert not marker.exists()


def test_files_are_written_0600_and_digests_are_checked(tmp_path):
    base = tmp_path / "tape"
    npz, js = safestore.save(base, {"a": np.arange(4)})
    assert npz.stat().st_mode & 0o777 == 0o600 and js.stat().st_mode & 0o777 == 0o600
    assert safestore.exists(base)
    np.testing.assert_array_equal(safestore.load(base)["a"], np.arange(4))
    import json

    meta = json.loads(js.read_text())
    meta["desc"] = meta["desc"].replace('"a"', '"b"')
    js.write_text(json.dumps(meta))
    with pytest.raises(safestore.StoreError, match="digest"):
        safestore.load(base)
    safestore.remove(base)
    assert not safestore.exists(base)


# -- planted links (issue 33, item 7): the writer never follows one ------------------------

def _victim(tmp_path):
    """A file another user owns in spirit: its content and mode must survive any save."""
    v = tmp_path / "elsewhere" / "victim.txt"
    v.parent.mkdir()
    v.write_text("precious")
    v.chmod(0o644)
    return v


def _intact(v):
    return v.read_text() == "precious" and v.stat().st_mode & 0o777 == 0o644


def test_a_link_planted_at_the_old_predictable_temporary_name_is_not_followed(tmp_path):
    # the name the writer used before (".<name>.tmp<pid>"): a link there was opened with
    # O_TRUNC and chmod-ed, overwriting its target
    import os

    v = _victim(tmp_path)
    base = tmp_path / "store" / "state"
    base.parent.mkdir()
    for suffix in (".npz", ".json"):
        (base.parent / f".state{suffix}.tmp{os.getpid()}").symlink_to(v)
    safestore.save(base, {"a": np.arange(3)})
    assert _intact(v)
    np.testing.assert_array_equal(safestore.load(base)["a"], np.arange(3))


def test_a_link_planted_at_the_next_random_name_is_skipped_not_followed(tmp_path, monkeypatch):
    # the attacker guesses the random name (here: told it): O_EXCL | O_NOFOLLOW refuses
    # the planted link and the writer takes a fresh name
    v = _victim(tmp_path)
    base = tmp_path / "state"
    names = iter(["guessed", "guessed", "fresh1", "fresh2"])
    monkeypatch.setattr(safestore.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".state.npz.guessed.tmp").symlink_to(v)
    (tmp_path / ".state.json.guessed.tmp").symlink_to(tmp_path / "elsewhere" / "new")
    safestore.save(base, {"a": np.arange(3)})
    assert _intact(v) and not (tmp_path / "elsewhere" / "new").exists()
    assert (tmp_path / ".state.npz.guessed.tmp").is_symlink()  # left alone
    np.testing.assert_array_equal(safestore.load(base)["a"], np.arange(3))


def test_only_planted_names_is_a_typed_error_not_a_write_through(tmp_path, monkeypatch):
    v = _victim(tmp_path)
    monkeypatch.setattr(safestore.secrets, "token_hex", lambda n: "always")
    (tmp_path / ".state.npz.always.tmp").symlink_to(v)
    with pytest.raises(safestore.StoreError, match="no fresh temporary name"):
        safestore.save(tmp_path / "state", {"a": np.arange(3)})
    assert _intact(v)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_a_symlinked_target_is_refused_on_write_and_on_read(tmp_path, suffix):
    v = _victim(tmp_path)
    base = tmp_path / "state"
    safestore.save(base, {"a": np.arange(3)})
    target = base.with_suffix(suffix)
    target.unlink()
    target.symlink_to(v)
    with pytest.raises(safestore.StoreError, match="symbolic link"):
        safestore.save(base, {"a": np.arange(4)})
    with pytest.raises(safestore.StoreError, match="symbolic link"):
        safestore.load(base)
    assert _intact(v) and target.is_symlink()


def test_no_temporary_file_is_left_behind(tmp_path):
    safestore.save(tmp_path / "state", {"a": np.arange(3)})
    safestore.save(tmp_path / "state", {"a": np.arange(5)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.npz"]
