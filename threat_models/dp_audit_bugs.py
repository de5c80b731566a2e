"""Injected miscalibrations of 10-30%: the bugs a reviewer would miss, for the audit to catch.

Each is a subclass of a real DP layer that changes one calibration step and leaves its
claim (its ``epsilon``, and what its ledger charges) as the correct layer's; the audit
side builds it, nothing in :mod:`secagg.privacy` is changed. ``size`` is the factor by
which the noise's real Gaussian-equivalent epsilon (``epsilon_for_mu`` of the canary's
shift over the real noise) exceeds the claim, computed from the layer's own numbers.

* :class:`ShareCountDistributedDP` -- **noise sized for a different count than the one
  accounted**: each client's share is sized for the whole cohort (n) while the ledger
  charges, and the secure sum accepts, the fewest survivors t < n; with t survivors the sum
  carries sigma sqrt(t / n).
* :class:`StaleBoundCentralDP` -- **a sensitivity computed from the wrong bound**: the noise
  is scaled to a bound ``ratio`` x the one the uploads are clipped to (e.g. an adaptive
  clip's previous value).
* :class:`DroppedFieldShareCentralDP` -- **a noise share dropped for one field of several**:
  the split of z between k fields forgets one field (sqrt(k - 1) instead of sqrt(k)), so
  the joint release's multiplier is z sqrt((k - 1) / k).
* :class:`DeltaMixupCentralDP` -- **a delta mixed up between phases**: the noise is
  calibrated at another phase's delta (``factor`` x the claimed one) while the claim is at
  the layer's delta.

:func:`injected_audits` audits each at one claimed epsilon (the benchmark and the tests).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from secagg.layers.plaintext import Plaintext
from secagg.messages import Field, UploadSpec
from secagg.privacy.calibrate import calibrate
from secagg.privacy.layers import CentralDP, DistributedDP, DistributedRelease
from secagg.privacy.sensitivity import field_l2, noise_split
from secagg.secure_sum import SecureSum
from threat_models.dp_audit import DEFAULT_DELTA, AuditResult, SumRelease, audit_sum
from threat_models.dp_audit_fields import FieldsRelease, audit_fields
from threat_models.dp_audit_gdp import epsilon_for_mu

__all__ = [
    "DeltaMixupCentralDP",
    "DroppedFieldShareCentralDP",
    "InjectedAudit",
    "ShareCountDistributedDP",
    "StaleBoundCentralDP",
    "injected_audits",
]


class ShareCountDistributedDP(DistributedDP):
    """DistributedDP whose noise shares are sized for all n clients of the cohort, not for
    the fewest survivors the secure sum accepts (its events and claim are unchanged)."""

    def release_plan(self, spec: UploadSpec, n: int) -> DistributedRelease:
        """The correct plan with every share std times sqrt(worst / n)."""
        plan = super().release_plan(spec, n)
        f = math.sqrt(plan.worst / n)
        return dataclasses.replace(plan, share_std={k: v * f for k, v in plan.share_std.items()})


class StaleBoundCentralDP(CentralDP):
    """CentralDP whose noise is scaled to ``ratio`` x each field's real L2 bound."""

    def __init__(self, inner: Any, *, ratio: float = 0.8, **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.ratio = float(ratio)

    def _sigmas(self, spec: UploadSpec, noised: Sequence[Field]) -> dict[str, float]:
        return {k: v * self.ratio for k, v in super()._sigmas(spec, noised).items()}


class DroppedFieldShareCentralDP(CentralDP):
    """CentralDP whose split of z between k fields leaves the last field out of the
    total (each field's factor is sqrt(k - 1), not sqrt(k))."""

    def _sigmas(self, spec: UploadSpec, noised: Sequence[Field]) -> dict[str, float]:
        z = self.noise_multiplier
        split = noise_split(noised[:-1] or noised)
        return {f.name: z * split.get(f.name, split[noised[0].name])
                * field_l2(spec, f.name, self.adjacency, self.name) for f in noised}


class DeltaMixupCentralDP(CentralDP):
    """CentralDP whose noise multiplier is calibrated at ``factor`` x its claimed delta
    (another phase's delta), while its claim stays at its own delta."""

    def __init__(self, inner: Any, *, factor: float = 20.0, **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.factor = float(factor)

    @property
    def noise_multiplier(self) -> float:
        """z calibrated at the mixed-up delta."""
        if self._z is None:
            self._z = calibrate(self.epsilon, min(0.5, self.delta * self.factor),
                                rounds=self._planned_events(), event=self._event_factory())
        return self._z


@dataclasses.dataclass
class InjectedAudit:
    """One injected bug's audit.

    Attributes:
        bug: what was injected, in words.
        size: the real Gaussian-equivalent epsilon over the claim (1.25: 25% above).
        result: the audit.
    """

    bug: str
    size: float
    result: AuditResult


def _size(mu: float, claimed: float, delta: float) -> float:
    return epsilon_for_mu(mu, delta) / claimed


def _sum_sigma(rel: SumRelease) -> float:
    return float(rel.details()["sigma"])


def injected_audits(epsilon: float = 1.0, *, delta: float = DEFAULT_DELTA,
                    trials: int = 1_000_000, seed: int = 0, mode: str = "tight",
                    confidence: float = 0.95, which: Sequence[str] | None = None,
                    options: Mapping[str, Any] | None = None) -> list[InjectedAudit]:
    """Audit every injected bug (or those named in ``which``: ``share-count``,
    ``stale-bound``, ``dropped-field-share``, ``delta-mixup``) at claimed ``epsilon``.
    ``options`` overrides a bug's knob (``threshold`` of the share-count bug's secure sum,
    ``ratio`` of the stale bound, ``fields`` of the dropped share, ``factor`` of the delta
    mix-up)."""
    # share-count: 7 of 10 survivors is sqrt(10/7) = 1.20x in mu, 1.22x in epsilon against
    # the (exact) claim; 0.6 gave 1.21x only while the claim was the RDP bound, 8% above
    opt = {"threshold": 0.7, "ratio": 0.8, "fields": 3, "factor": 20.0, **(options or {})}
    names = list(which) if which is not None else list(BUGS)
    common = {"epsilon": epsilon, "delta": delta, "rounds": 1, "seed": seed}
    out = []
    for name in names:
        if name == "share-count":
            lay = ShareCountDistributedDP(SecureSum(threshold=opt["threshold"]), **common)
            rel = SumRelease(lay, clients=10, survivors="fewest")
            mu = rel.canary_value / _sum_sigma(rel)
            res = audit_sum(lay, clients=10, trials=trials, seed=seed, mode=mode,
                            confidence=confidence)
            what = (f"noise shares sized for all 10 clients, accounted for the fewest "
                    f"survivors ({rel._plan.worst})")
        elif name == "stale-bound":
            lay = StaleBoundCentralDP(Plaintext(), ratio=opt["ratio"], **common)
            res = audit_sum(lay, trials=trials, seed=seed, mode=mode, confidence=confidence)
            mu = 1.0 / _sum_sigma(SumRelease(lay))
            what = f"sensitivity from a bound {opt['ratio']:g}x the clip"
        elif name == "dropped-field-share":
            lay = DroppedFieldShareCentralDP(Plaintext(), **common)
            frel = FieldsRelease(lay, fields=opt["fields"])
            mu = math.sqrt(sum((1.0 / s) ** 2 for s in frel.details()["sigma"].values()))
            res = audit_fields(lay, fields=opt["fields"], trials=trials, seed=seed,
                               mode=mode, confidence=confidence)
            what = f"noise split forgets one field of {opt['fields']}"
        elif name == "delta-mixup":
            lay = DeltaMixupCentralDP(Plaintext(), factor=opt["factor"], **common)
            res = audit_sum(lay, trials=trials, seed=seed, mode=mode, confidence=confidence)
            mu = 1.0 / _sum_sigma(SumRelease(lay))
            what = f"noise calibrated at another phase's delta ({opt['factor']:g}x)"
        else:
            raise ValueError(f"unknown injected bug {name!r}; one of {', '.join(BUGS)}")
        out.append(InjectedAudit(f"{name}: {what}", _size(mu, res.epsilon_claimed, delta),
                                 res))
    return out


#: The injected bugs :func:`injected_audits` knows.
BUGS = ("share-count", "stale-bound", "dropped-field-share", "delta-mixup")
