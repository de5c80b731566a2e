"""Reading a coalition's observations of one field back as arrays, and scoring attacks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError
from secagg.messages import Field, UploadSpec
from secagg.transcript import Transcript
from threat_models.views import _parties, senders


@dataclass
class Observed:
    """What a coalition saw of one (phase, field) in one round, as arrays.

    Attributes:
        uploads: client -> its upload as seen (only where seen in ``form``).
        form: ``"clear"``, ``"noised"`` or ``"none"`` (no single upload readable).
        sum: the clear sum when seen, else the noised sum, else None.
        sum_form: ``"clear"``, ``"noised"`` or ``"none"``.
        contributors: clients who sent something (masked, encrypted, clear...).
    """

    uploads: dict[int, np.ndarray] = field(default_factory=dict)
    form: str = "none"
    sum: np.ndarray | None = None
    sum_form: str = "none"
    contributors: list[int] = field(default_factory=list)


def _value(r: dict[str, Any]) -> np.ndarray:
    if "values" not in r:
        raise ConfigurationError(
            "the transcript holds no values: record the run with include_values=True "
            "(secagg run --include-values) to run attacks on it")
    return np.asarray(r["values"], dtype=np.float64)


def _secure_sum_desc(desc: Mapping[str, Any], field: Field) -> Mapping[str, Any] | None:
    name = desc.get("name")
    if name == "secure-sum":
        return desc
    if name == "per-group":
        return _secure_sum_desc(desc.get("routes", {}).get(field.group,
                                                            desc.get("default") or {}), field)
    if name in ("central-dp", "local-dp"):
        return _secure_sum_desc(desc.get("inner", {}), field)
    return None


def decode_ring_sum(transcript: Transcript, spec: UploadSpec, field: str, n_clients: int,
                    ring: np.ndarray) -> np.ndarray | None:
    """Decode a secure sum recorded as ring elements, as the server does: the fixed-point
    plan is public (the layer's precision and ring, the spec's bounds, the cohort size).
    None when the run's layer for ``field`` is not a plain secure sum."""
    head = next((r for r in transcript.records if r.get("type") == "run"), {})
    desc = _secure_sum_desc(head.get("layer", {}), spec[field])
    if desc is None:
        return None
    from secagg.secure_sum import SecureSum

    layer = SecureSum(precision=desc.get("precision", 1e-9),
                      ring_bits=desc.get("ring_bits", 64))
    plans = layer.plan(spec, n_clients)
    return plans[field].decode_sum(np.asarray(ring, dtype=np.uint64)).reshape(spec[field].shape)


def observed(transcript: Transcript, coalition: Any, phase: str, field: str,
             round: int | None = None, spec: UploadSpec | None = None) -> Observed:
    """The coalition's observations of ``phase``/``field`` in ``round`` (default: the last
    round with observations of that field).

    A secure sum is recorded as ring elements; with the phase's ``spec`` (public: it fixes
    the fixed-point plan) it is decoded as the server decodes it, otherwise it is not used.

    Raises:
        ConfigurationError: nothing of that field was recorded, or values were not stored.
    """
    recs = [r for r in transcript.observations() if r["phase"] == phase and r["field"] == field]
    if not recs:
        raise ConfigurationError(f"the transcript has no observations of {phase}/{field}")
    rnd = max(r["round"] for r in recs) if round is None else round
    recs = [r for r in recs if r["round"] == rnd]
    members = _parties(coalition, senders(transcript))
    out = Observed(contributors=sorted({r["sender"] for r in recs
                                        if isinstance(r["sender"], int) and r["what"] == "upload"}))
    for r in recs:
        if r["party"] not in members:
            continue
        if r["what"] == "upload" and r["form"] in ("clear", "noised"):
            out.uploads[int(r["sender"])] = _value(r)
            out.form = "clear" if r["form"] == "clear" and out.form != "noised" else r["form"]
        elif r["what"] == "sum" and r["form"] in ("clear", "noised"):
            if out.sum_form == "clear":  # prefer an un-noised sum when one was seen
                continue
            if r.get("dtype") == "uint64":  # a ring sum (secure summation)
                n = len(out.contributors)
                dec = None if spec is None else decode_ring_sum(
                    transcript, spec, field, n, np.asarray(r["values"], dtype=np.uint64))
                if dec is not None:
                    out.sum, out.sum_form = dec, r["form"]
                continue
            out.sum, out.sum_form = _value(r), r["form"]
    if not transcript.include_values and not any("values" in r for r in recs):
        raise ConfigurationError(
            "the transcript holds no values: record the run with include_values=True")
    return out


@dataclass
class AttackResult:
    """An attack's per-client estimates.

    Attributes:
        name: the attack.
        basis: what it worked from: ``"clear uploads"``, ``"noised uploads"``, ``"sum"``
            (each client estimated as the mean share of the sum) or ``"nothing"``.
        estimates: client -> estimate (absent when the attack has nothing for a client).
    """

    name: str
    basis: str
    estimates: dict[int, Any] = field(default_factory=dict)

    def score(self, truth: Mapping[int, Any],
              correct: Callable[[Any, Any], bool] | None = None,
              error: Callable[[Any, Any], float] | None = None) -> dict[str, float]:
        """Success rate (share of ``truth``'s clients estimated ``correct``ly; default exact
        equality of arrays) and the largest ``error`` (default max abs difference; inf for a
        client with no estimate)."""
        correct = correct or (lambda e, t: bool(np.array_equal(np.asarray(e), np.asarray(t))))
        error = error or (lambda e, t: float(np.max(np.abs(np.asarray(e, float)
                                                           - np.asarray(t, float)))))
        hits, worst = 0, 0.0
        for c, t in truth.items():
            if c not in self.estimates:
                worst = float("inf")
                continue
            hits += int(correct(self.estimates[c], t))
            worst = max(worst, error(self.estimates[c], t))
        return {"success_rate": hits / max(len(truth), 1), "max_error": worst,
                "clients": float(len(truth))}


def per_client(obs: Observed, fn: Callable[[np.ndarray], Any], name: str) -> AttackResult:
    """Apply ``fn`` to each single upload the coalition read; without any, to the sum divided
    by the number of contributors (the best per-client guess from a sum alone)."""
    if obs.uploads:
        basis = "clear uploads" if obs.form == "clear" else "noised uploads"
        return AttackResult(name, basis, {c: fn(v) for c, v in obs.uploads.items()})
    if obs.sum is not None and obs.contributors:
        share = obs.sum / len(obs.contributors)
        return AttackResult(name, "sum", {c: fn(share) for c in obs.contributors})
    return AttackResult(name, "nothing", {})
