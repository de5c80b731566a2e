"""SecureSum inside the engine: FedLog under SecureSum equals Plaintext; the transcript and
the audit show masked uploads and one clear sum per field and round."""

import numpy as np
import pytest

from algorithms.fedlog import FedLog
from secagg.audit import audit, format_audit
from secagg.encoding import plan
from secagg.errors import InadmissibleField
from secagg.federation import ClientState, Federation
from secagg.layers import Plaintext, RoundContext
from secagg.messages import Field, Upload, UploadSpec
from secagg.secure_sum import SecureSum


@pytest.fixture(scope="module")
def fedlog_runs(digits_clients):
    plain = Federation(FedLog(local_epochs=2), Plaintext(), digits_clients, rounds=3, seed=0).run()
    secure = Federation(FedLog(local_epochs=2), SecureSum(threshold=0.7), digits_clients,
                        rounds=3, seed=0).run()
    return plain, secure


def test_fedlog_under_secure_sum_equals_plaintext(fedlog_runs):
    plain, secure = fedlog_runs
    assert secure.accuracy == pytest.approx(plain.accuracy, abs=1e-6)
    np.testing.assert_allclose(secure.history, plain.history, atol=1e-6)
    # the privacy has a price on the wire: more messages than the plaintext run
    assert secure.costs.total("up")["messages"] > plain.costs.total("up")["messages"]


def test_secure_sum_is_bit_exact_after_quantisation(digits_clients):
    algo = FedLog()
    states = [ClientState(c) for c in digits_clients]
    algo.setup(digits_clients.dataset, states, seed=0)
    phase = algo.phases(0, 1)[0]
    spec = phase.spec()
    spec = UploadSpec(spec.fields, max_records=max(s.n_records for s in states))
    uploads = {s.id: Upload.validate(spec, phase.client_step(s, {}), s.id, s.n_records)
               for s in states}
    layer = SecureSum(threshold=0.7, precision=1e-9)
    agg = layer.aggregate(uploads, spec, RoundContext(0, "stats", 1))
    plans = plan(spec, len(states), precision=1e-9)
    for name, p in plans.items():
        exact = sum(p.to_int(uploads[c][name]).astype(object) for c in uploads)  # Python ints
        want = np.array([int(v) for v in np.ravel(exact)], dtype=np.int64)
        got = agg.sums[name].ravel()
        if p.integer:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got, np.ldexp(want.astype(np.float64), -p.scale_bits))
    assert agg.contributors == tuple(range(10))


def test_transcript_and_audit_show_masked_uploads_and_one_sum(fedlog_runs):
    _, secure = fedlog_runs
    rep = audit(secure.transcript)
    fields = {e["field"]: e for e in rep["fields"]}
    assert set(fields) == {"stats"}
    for e in fields.values():
        assert e["server_saw"] == {"masked upload": 30, "clear sum": 3}
        assert e["clear_individual_uploads"] == 0
        assert len(e["senders"]) == 10
    text = format_audit(rep)
    assert text.count("server saw   : clear sum x3, masked upload x30") == 1
    assert "clear uploads: no" in text


def test_non_additive_field_refused_with_reason():
    spec = UploadSpec((Field("emb", (3,), additive=False),))
    with pytest.raises(InadmissibleField, match="emb"):
        SecureSum().check(spec)
