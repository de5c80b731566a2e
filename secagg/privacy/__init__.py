"""Differential privacy for secagg: noise samplers, accounting events, the run's privacy
ledger (composed with Google's dp-accounting), calibration, sensitivity from field bounds,
the CentralDP / LocalDP / DistributedDP layers and record-level DP-SGD through Opacus.

Heavy parts load lazily: ``import secagg.privacy`` does not import torch or Opacus.
"""

from __future__ import annotations

from secagg.lazy import lazy_exports

_EXPORTS = {
    "PrivacyLedger": "secagg.privacy.accountant",
    "calibrate": "secagg.privacy.calibrate",
    "epsilon_for": "secagg.privacy.calibrate",
    "delta_for": "secagg.privacy.calibrate",
    "GaussianEvent": "secagg.privacy.events",
    "SampledGaussianEvent": "secagg.privacy.events",
    "DiscreteGaussianEvent": "secagg.privacy.events",
    "SkellamEvent": "secagg.privacy.events",
    "NonPrivateEvent": "secagg.privacy.events",
    "PrivacyEvent": "secagg.privacy.events",
    "CentralDP": "secagg.privacy.central",
    "LocalDP": "secagg.privacy.local",
    "DistributedDP": "secagg.privacy.distributed",
    "noise_generator": "secagg.privacy.samplers",
    "discrete_gaussian": "secagg.privacy.samplers",
    "skellam": "secagg.privacy.samplers",
    "field_l2": "secagg.privacy.sensitivity",
    "joint_l2": "secagg.privacy.sensitivity",
    "fedlog_record_l2": "secagg.privacy.sensitivity",
    "spherefed_record_l2": "secagg.privacy.sensitivity",
    "DPSGD": "secagg.privacy.dpsgd",
    "make_private": "secagg.privacy.dpsgd",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("secagg.privacy", _EXPORTS, globals())
