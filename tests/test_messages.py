"""Upload validation: every bad upload is a typed error naming client and field."""

import numpy as np
import pytest

from secagg.errors import UploadError
from secagg.messages import Bound, Field, Upload, UploadSpec

SPEC = UploadSpec((
    Field("stats", (2, 3), "float64", bound=Bound(l2=2.0, linf=1.5), additive=True),
    Field("n", (1,), "int64", bound=Bound(l2=1.0, linf=1.0), additive=True),
    Field("emb", (4,), "float32", additive=False),
), max_records=10)


def good(n=3):
    return {"stats": np.full((2, 3), 0.5), "n": np.array([n]), "emb": np.zeros(4, np.float32)}


def test_valid_upload_is_readonly_and_typed():
    up = Upload.validate(SPEC, good(), client=7, n_records=3)
    assert up.client == 7 and up["n"].dtype == np.int64 and up["emb"].dtype == np.float32
    with pytest.raises(ValueError):
        up["stats"][0, 0] = 1.0


@pytest.mark.parametrize("field,value,problem", [
    ("stats", np.zeros((3, 2)), "shape"),
    ("n", np.array([1.5]), "dtype"),
    ("stats", np.array([[np.nan, 0, 0], [0, 0, 0]]), "NaN"),
    ("stats", np.array([[np.inf, 0, 0], [0, 0, 0]]), "inf"),
    ("stats", np.full((2, 3), 4.6), "L-inf bound"),
    ("stats", np.full((2, 3), 1.4), "L2 bound"),
    ("emb", np.array(["a", "b", "c", "d"]), "dtype"),
    ("n", np.array([5]), "L-inf bound"),
    ("n", np.array([1, 1]), "shape"),
])
def test_bad_uploads_name_client_and_field(field, value, problem):
    vals = good(n=1)
    vals[field] = value
    # with 1 record, linf bound of stats is 1.5 and l2 bound 2.0
    with pytest.raises(UploadError) as ei:
        Upload.validate(SPEC, vals, client=4, n_records=1)
    assert ei.value.client == 4 and ei.value.field == field
    assert problem in str(ei.value) and "client 4" in str(ei.value) and repr(field) in str(ei.value)


def test_record_bounds_scale_with_records():
    vals = good()
    vals["stats"] = np.full((2, 3), 1.4)  # norm 3.43: over 1 record's 2.0, under 3 records' 6.0
    Upload.validate(SPEC, vals, client=0, n_records=3)
    with pytest.raises(UploadError):
        Upload.validate(SPEC, vals, client=0, n_records=1)


def test_missing_and_extra_fields():
    vals = good(n=1)
    del vals["n"]
    with pytest.raises(UploadError, match="missing"):
        Upload.validate(SPEC, vals, client=1, n_records=1)
    vals = good(n=1)
    vals["secret"] = np.zeros(1)
    with pytest.raises(UploadError, match="not declared"):
        Upload.validate(SPEC, vals, client=1, n_records=1)


def test_clipping_is_counted_and_respects_bound():
    vals = good(n=1)
    vals["stats"] = np.full((2, 3), 1.4)
    up = Upload.validate(SPEC, vals, client=2, n_records=1, on_violation="clip")
    assert up.clipped == {"stats": 1}
    assert np.linalg.norm(up["stats"]) <= 2.0
    assert np.max(np.abs(up["stats"])) <= 1.5
    vals["stats"] = np.full((2, 3), 3.0)
    up = Upload.validate(SPEC, vals, client=2, n_records=1, on_violation="clip")
    assert up.clipped["stats"] == 2  # clamped to linf, then scaled to l2
    assert np.linalg.norm(up["stats"]) <= 2.0


def test_float64_to_float32_overflow_refused():
    vals = good(n=1)
    vals["emb"] = np.array([1e300, 0, 0, 0])
    with pytest.raises(UploadError, match="overflows"):
        Upload.validate(SPEC, vals, client=3, n_records=1)


def test_spec_client_linf_and_errors():
    assert SPEC.client_linf("stats") == 15.0  # min(linf, l2) * max_records
    with pytest.raises(ValueError, match="no Bound"):
        SPEC.client_linf("emb")
    with pytest.raises(ValueError, match="max_records"):
        UploadSpec(SPEC.fields).client_linf("stats")
    with pytest.raises(ValueError):
        Bound()
    with pytest.raises(ValueError):
        Bound(l2=-1.0)
    with pytest.raises(ValueError, match="duplicate"):
        UploadSpec((Field("a", (1,), additive=True), Field("a", (2,), additive=True)))


def test_a_client_above_the_public_max_records_is_refused():
    """Per-client bounds are max_records x the record bound: a client holding more records
    would break the ring plan and the sensitivity, so its upload is refused."""
    vals = good(n=1)
    Upload.validate(SPEC, vals, client=2, n_records=10)  # at the bound: fine
    with pytest.raises(UploadError, match="11 records.*max_records=10") as info:
        Upload.validate(SPEC, vals, client=2, n_records=11)
    assert info.value.client == 2
    with pytest.raises(ValueError, match=r"Federation\(max_records"):
        UploadSpec(SPEC.fields).client_linf("stats")


def test_additive_must_be_declared() -> None:
    # a silent default let a per-client mean through SecureSum as if it were a sum
    with pytest.raises(TypeError, match="additive"):
        Field("mean", (3,), bound=Bound(linf=1.0))  # type: ignore[call-arg]
    assert Field("mean", (3,), additive=False).additive is False
