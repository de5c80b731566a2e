"""Auditing a DP layer's release of several fields at once (a joint Gaussian mechanism).

A layer that noises k fields together splits its noise multiplier z between them
(:func:`secagg.privacy.sensitivity.noise_split`): field f gets sigma_f = z sqrt(W / w_f)
Delta_f, so that sum_f (Delta_f / sigma_f)^2 = 1 / z^2 and the joint release is one Gaussian
mechanism of multiplier z. :class:`FieldsRelease` audits that joint release: ``fields``
scalar fields, each bounded by ``bound`` (L2, at the layer's adjacency), a canary that sits
at the bound in every field, and the observation the k noised sums (CentralDP) or the
canary client's k noised values (LocalDP). The test statistic is the sum over the fields,
the likelihood-ratio direction when the fields have equal bounds and weights (so the
Gaussian-DP fit of :mod:`threat_models.dp_audit_gdp` measures the joint mu).

As :class:`threat_models.dp_audit.SumRelease`, ``n`` releases are drawn as one release of
fields of ``n`` entries through the layer's own noise path, with the noise std checked
against a real release of the scalar fields through ``layer.aggregate``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from threat_models.dp_audit import (
    DEFAULT_DELTA,
    AuditError,
    AuditResult,
    LayerClaim,
    Statistic,
    audit,
    make_layer,
    shift_statistic,
)
from threat_models.dp_audit_sum import layer_kind

__all__ = ["FieldsRelease", "audit_fields"]

PHASE = "dp-audit-fields"


class FieldsRelease(LayerClaim):
    """A CentralDP or LocalDP layer releasing ``fields`` bounded scalar sums together.

    Args:
        layer: the layer (planned for one release) or its name for
            :func:`~threat_models.dp_audit.make_layer` (with ``layer_kwargs``).
        fields: how many fields (>= 1), named ``f0``, ``f1``, ...
        bound: each field's L2 bound.
    """

    def __init__(self, layer: Any, *, fields: int = 3, bound: float = 1.0,
                 **layer_kwargs: Any) -> None:
        from secagg.messages import Bound, Field, Upload, UploadSpec

        if isinstance(layer, str):
            layer = make_layer(layer, **layer_kwargs)
        elif layer_kwargs:
            raise AuditError("layer options are for a layer given by name only")
        what = "FieldsRelease audits CentralDP or LocalDP"
        kind = layer_kind(layer, what)
        if kind not in ("central", "local"):
            raise AuditError(f"{what}, got {type(layer).__name__}")
        if not (isinstance(fields, int) and fields >= 1):
            raise AuditError(f"fields must be a positive integer, got {fields!r}")
        if not (math.isfinite(bound) and bound > 0):
            raise AuditError(f"bound must be a positive number, got {bound!r}")
        self.layer = layer
        self.kind = kind
        self.names = tuple(f"f{i}" for i in range(fields))
        self.bound = float(bound)
        self._bound = Bound(l2=self.bound, adjacency=layer.adjacency)
        self._field, self._spec_cls, self._upload = Field, UploadSpec, Upload
        self.spec = self._spec(1)
        raw = {n: np.array([self.bound]) for n in self.names}
        clipped = Upload.validate(self.spec, raw, 0, 1, on_violation="clip")
        self.canary_values = {n: float(clipped[n][0]) for n in self.names}
        self._round = 0
        self.scalar_notes = self._scalar_release()

    def _spec(self, n: int) -> Any:
        return self._spec_cls(tuple(self._field(name, (n,), bound=self._bound, additive=True)
                                    for name in self.names), max_records=1)

    def _ctx(self) -> Any:
        from secagg.layers.base import RoundContext
        from secagg.privacy.accountant import PrivacyLedger

        self._round += 1
        return RoundContext(self._round, PHASE, self._round, privacy=PrivacyLedger())

    def _scalar_release(self) -> dict[str, Any]:
        ups = {0: self._upload.validate(self.spec, {n: np.zeros(1) for n in self.names}, 0, 1)}
        return dict(self.layer.aggregate(ups, self.spec, self._ctx()).notes["dp"])

    def _check(self, sigmas: dict[str, Any]) -> None:
        for n in self.names:
            want = self.scalar_notes["fields"][n]["sigma"]
            if not math.isclose(float(sigmas[n]), float(want), rel_tol=1e-9):
                raise AuditError(f"{self.mechanism}: field {n} has noise std {sigmas[n]!r} in "
                                 f"the batched release but {want!r} in a real one")

    @property
    def mechanism(self) -> str:
        """The layer's name and the number of fields."""
        return f"{self.layer.name} ({len(self.names)} fields)"

    @property
    def canary(self) -> str:
        """The canary, in words."""
        who = "record" if self.layer.adjacency == "record" else "client"
        return f"{who} at +{self.bound:g} in each of {len(self.names)} fields"

    @property
    def statistics(self) -> list[Statistic]:
        """The sum over the fields (the likelihood-ratio direction for equal bounds)."""
        return [shift_statistic()]

    def details(self) -> dict[str, Any]:
        """Noise facts of a real release."""
        return {"fields": len(self.names), "noise_multiplier":
                self.scalar_notes.get("noise_multiplier"),
                "sigma": {n: self.scalar_notes["fields"][n]["sigma"] for n in self.names},
                "adjacency": self.layer.adjacency}

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n releases, (n, fields); the noise from the layer's own streams."""
        from secagg.layers.base import Aggregate
        from secagg.privacy.layers import noise_source

        spec, ctx = self._spec(n), self._ctx()
        values = {name: np.full(n, self.canary_values[name] if with_canary else 0.0)
                  for name in self.names}
        if self.kind == "central":
            ledger = self.layer.begin(spec, ctx)
            agg = Aggregate(PHASE, ctx.round, dict(values), {}, (0,))
            agg = self.layer.release(agg, spec, ctx, ledger)
            self._check({k: v["sigma"] for k, v in agg.notes["dp"]["fields"].items()})
            out = agg.sums
        else:
            sigmas, wide = self.layer.noise_plan(spec)
            self._check(sigmas)
            src = noise_source(self.layer.seed, ctx.round, PHASE, 0)
            out = self.layer.noise_upload(self._upload(values, spec, 0, 1), spec, sigmas,
                                          wide, src.rng)
        return np.stack([np.asarray(out[name], dtype=np.float64) for name in self.names],
                        axis=1)


def audit_fields(layer: Any = "central-dp", *, epsilon: float | None = None,
                 delta: float = DEFAULT_DELTA, fields: int = 3, trials: int = 1_000_000,
                 seed: int | None = 0, confidence: float = 0.95, mode: str = "tight",
                 progress: bool | None = None) -> AuditResult:
    """Audit a layer's joint release of ``fields`` fields (:class:`FieldsRelease`)."""
    if isinstance(layer, str):
        if epsilon is None:
            raise AuditError(f"audit_fields({layer!r}) needs epsilon")
        rel = FieldsRelease(layer, fields=fields, epsilon=epsilon, delta=delta, seed=seed)
    else:
        rel = FieldsRelease(layer, fields=fields)
    return audit(rel, epsilon=rel.epsilon, delta=rel.delta, trials=trials,
                 statistics=rel.statistics, confidence=confidence, seed=seed,
                 mechanism=rel.mechanism, canary=rel.canary, progress=progress,
                 details=rel.details(), mode=mode)
