"""L2 (and L1) sensitivity of a release, derived from the fields' declared bounds.

The sensitivity of a sum over clients depends on the adjacency the guarantee refers to:

* ``"record"`` — neighbouring datasets differ in one record (add/remove). A field whose
  :class:`~secagg.messages.Bound` is record-level changes by at most its bound. A
  client-level bound B also bounds a record's effect, by 2B (the client's value moves
  between two points of the ball of radius B).
* ``"client"`` — neighbouring datasets differ in one client's whole data (add/remove).
  A client-level bound B gives B; a record-level bound b gives ``max_records * b`` (the
  spec must declare ``max_records``, else the field is refused).

An L2 bound is used when declared; otherwise L-inf bound times sqrt(size). One record
touches every field at once, so a release of several fields has the joint sensitivity
sqrt(sum of squares).

Uploads computed from a model trained on the client's own records (FedAvg's ``n * theta``,
FedLog's statistics of a locally trained body, moments of features under a trained body)
need care at record level: removing one record changes the trained model, hence *every*
record's contribution, so a per-record bound on the contribution is not a sensitivity
(measured on digits: declared 16.03, observed 65-77 for FedLog). :func:`check_training_adjacency`
refuses such a record-level derivation unless the training ran under DP-SGD: then,
conditioned on the (DP) trained model, one record moves the upload by at most its bound,
and the release composes with the DP-SGD events on the same ledger (adaptive composition).
A *client-level* bound stays valid whatever the training: it bounds the client's whole
upload, so it also bounds a record's effect by twice itself.

Two sensitivities from the papers, as helpers for the algorithms' declarations:
:func:`fedlog_record_l2` (FedLog, Thm 3.1) and :func:`spherefed_record_l2`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from secagg.errors import InadmissibleField, PrivacyError
from secagg.messages import Field, UploadSpec

__all__ = [
    "check_training_adjacency",
    "dp_adjacency",
    "fedlog_record_l2",
    "field_l1",
    "field_l2",
    "joint_l2",
    "noise_split",
    "spherefed_record_l2",
]

Adjacency = Literal["record", "client"]


def _check_adjacency(adjacency: str) -> None:
    if adjacency not in ("record", "client"):
        raise PrivacyError(f"adjacency must be 'record' or 'client', got {adjacency!r}")


def _unit_l2(f: Field) -> float:
    """L2 bound on one contribution in the bound's own unit (record or client)."""
    b = f.bound
    assert b is not None
    cands = []
    if b.l2 is not None:
        cands.append(b.l2)
    if b.linf is not None:
        cands.append(b.linf * math.sqrt(max(f.size, 1)))
    return min(cands)


def _unit_l1(f: Field) -> float:
    """L1 bound on one contribution in the bound's own unit."""
    b = f.bound
    assert b is not None
    n = max(f.size, 1)
    cands = []
    if b.l2 is not None:
        cands.append(b.l2 * math.sqrt(n))
    if b.linf is not None:
        cands.append(b.linf * n)
    return min(cands)


def _scale(f: Field, spec: UploadSpec, adjacency: str, layer: str) -> float:
    _check_adjacency(adjacency)
    if f.bound is None:
        raise InadmissibleField(
            layer, f.name,
            "it has no Bound, so its DP sensitivity is unknown; declare Field(bound=Bound(...))"
            " or list the field as public",
        )
    if adjacency == "record":
        return 1.0 if f.bound.adjacency == "record" else 2.0
    if f.bound.adjacency == "client":
        return 1.0
    if spec.max_records is None:
        raise InadmissibleField(
            layer, f.name,
            "client-level DP needs a per-client bound, but the bound is per record and no "
            "public max_records was declared; pass Federation(max_records=...) (a public "
            "bound on records per client) or declare a client-level Bound",
        )
    return float(spec.max_records)


def field_l2(spec: UploadSpec, name: str, adjacency: Adjacency = "record",
             layer: str = "dp") -> float:
    """L2 sensitivity of the sum of field ``name`` under ``adjacency``.

    Raises:
        InadmissibleField: the field has no bound (or client adjacency lacks max_records).
        PrivacyError: bad adjacency.
    """
    f = spec[name]
    return _scale(f, spec, adjacency, layer) * _unit_l2(f)


def field_l1(spec: UploadSpec, name: str, adjacency: Adjacency = "record",
             layer: str = "dp") -> float:
    """L1 sensitivity of the sum of field ``name`` under ``adjacency`` (for Skellam)."""
    f = spec[name]
    return _scale(f, spec, adjacency, layer) * _unit_l1(f)


def joint_l2(spec: UploadSpec, names: Sequence[str], adjacency: Adjacency = "record",
             layer: str = "dp") -> float:
    """Joint L2 sensitivity of releasing the sums of ``names`` together:
    sqrt(sum of the squared per-field sensitivities)."""
    return math.sqrt(sum(field_l2(spec, n, adjacency, layer) ** 2 for n in names))


def noise_split(fields: Sequence[Field]) -> dict[str, float]:
    """Per noised field, the factor sqrt(W / w_f) its noise carries over z * Delta_f, from
    the fields' :attr:`~secagg.messages.Field.dp_weight` (W their sum). Equal weights give
    sqrt(k) for k fields. With sigma_f = z * factor_f * Delta_f,
    sum_f (Delta_f / sigma_f)^2 = sum_f w_f / (W z^2) = 1 / z^2: one Gaussian mechanism of
    multiplier z on the joint release."""
    total = sum(float(f.dp_weight) for f in fields)
    return {f.name: math.sqrt(total / float(f.dp_weight)) for f in fields}


def fedlog_record_l2(m: int, b: float) -> float:
    """FedLog's per-record L2 sensitivity sqrt(1 + (m - 1) b^2) (FedLog, Theorem 3.1).

    A record adds [1, phi] (phi clamped to [-b, b]^(m-1)) to the row of its class in the
    C x m statistic, so adding or removing it moves the statistic by a vector with one
    entry 1 and m - 1 entries of magnitude <= b.
    """
    if not (isinstance(m, int) and m >= 1):
        raise PrivacyError(f"m must be a positive integer, got {m!r}")
    if not (isinstance(b, (int, float)) and b >= 0 and math.isfinite(b)):
        raise PrivacyError(f"b must be a non-negative number, got {b!r}")
    return math.sqrt(1.0 + (m - 1) * float(b) ** 2)


def spherefed_record_l2(joint: bool = False) -> float:
    """SphereFed calibration statistics with unit-norm features z: one record adds z z^T
    to V (Frobenius norm ||z||^2 = 1) and z onehot(y)^T to U (norm 1), so each has
    per-record sensitivity 1 and the pair sqrt(2)."""
    return math.sqrt(2.0) if joint else 1.0


def dp_adjacency(layer: Any, spec: UploadSpec) -> dict[str, str]:
    """For each field of ``spec`` that ``layer`` releases with DP noise, the adjacency its
    sensitivity is derived under (fields released without DP noise are absent).

    Looks through :class:`~secagg.layers.PerGroup` routes; a DP layer is one with an
    ``adjacency`` and a ``public`` list (the layers of :mod:`secagg.privacy.layers`).
    """
    routes = getattr(layer, "routes", None)
    if isinstance(routes, Mapping):
        out: dict[str, str] = {}
        default = getattr(layer, "default", None)
        for f in spec.fields:
            sub = routes.get(f.group, default)
            if sub is not None:
                out.update(dp_adjacency(sub, spec.subset([f.name])))
        return out
    adjacency = getattr(layer, "adjacency", None)
    if adjacency not in ("record", "client") or not hasattr(layer, "public"):
        return {}
    public = set(getattr(layer, "public", ()))
    allow = bool(getattr(layer, "allow_non_additive", False))
    return {f.name: adjacency for f in spec.fields
            if f.name not in public and (f.additive or allow)}


def check_training_adjacency(phase: str, spec: UploadSpec, trained: Iterable[str],
                             adjacency: Mapping[str, str], dpsgd: bool = False,
                             why: str = "", max_records_given: bool = True) -> None:
    """Refuse a DP sensitivity the engine cannot defend, before anything is released.

    Args:
        phase: the phase name (quoted in the error).
        spec: the phase's upload spec.
        trained: the fields computed from a model trained on the client's own records
            (:meth:`algorithms.base.Phase.trained_fields`).
        adjacency: field -> adjacency of the DP release (:func:`dp_adjacency`).
        dpsgd: the training ran under record-level DP-SGD (its events are on the ledger).
        why: how the field depends on the training (quoted in the error).
        max_records_given: whether the user gave a public ``max_records``; client-level DP
            on a record-level bound needs one given explicitly, not a planning default.

    Raises:
        PrivacyError: a record-level release of a trained field whose bound is per record
            (and no DP-SGD), or a client-level release of a record-level bound without an
            explicit public max_records; the message names the phase, the field and why.
    """
    trained = set(trained)
    for f in spec.fields:
        adj = adjacency.get(f.name)
        if adj is None or f.bound is None or f.bound.adjacency != "record":
            continue
        if adj == "client" and not max_records_given:
            raise PrivacyError(
                f"phase {phase!r}, field {f.name!r}: client-level DP scales the per-record "
                "bound by a public max_records, and none was given; pass "
                "Federation(max_records=...) (never the largest client's size: that is "
                "private) or declare a client-level Bound"
            )
        if adj == "record" and f.name in trained and not dpsgd:
            how = why or "it is computed from a model trained on the client's own records"
            raise PrivacyError(
                f"phase {phase!r}, field {f.name!r}: record-level DP is refused because "
                f"{how}; removing one record changes that model and so every record's "
                f"contribution, so the per-record bound is not a sensitivity. Use "
                "client-level adjacency (adjacency='client'), a client-level bound (the "
                "algorithm's client bound parameter, e.g. FedLog(client_l2=...)), or train "
                "with DP-SGD (dpsgd=DPSGD(...)), whose events then compose with the release"
            )
