"""secagg: privacy-preserving federated learning, written as uploads.

An algorithm declares what each client uploads (typed, bounded fields); a privacy layer
(plaintext, secure summation, homomorphic encryption, differential privacy) decides what the
server sees of it; the engine runs rounds and books the cost of every message.

Top-level names are imported lazily so that ``import secagg`` stays fast and optional
back-ends (TenSEAL, Opacus) load only when used.
"""

from __future__ import annotations

from secagg.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # messages
    "Bound": "secagg.messages", "Field": "secagg.messages", "Upload": "secagg.messages",
    "UploadSpec": "secagg.messages",
    # layers
    "Aggregate": "secagg.layers.base", "Layer": "secagg.layers.base",
    "RoundContext": "secagg.layers.base", "Plaintext": "secagg.layers.plaintext",
    "PerGroup": "secagg.layers.per_group", "SecureSum": "secagg.secure_sum",
    "Homomorphic": "secagg.homomorphic",
    "ValidatedSum": "secagg.validated_sum",
    "CentralDP": "secagg.privacy", "LocalDP": "secagg.privacy", "DistributedDP": "secagg.privacy",
    "PrivacyLedger": "secagg.privacy", "calibrate": "secagg.privacy",
    # engine, costs, transcript
    "Federation": "secagg.federation", "Result": "secagg.federation",
    "DropoutModel": "secagg.dropouts", "ScheduledDropouts": "secagg.dropouts",
    "Ledger": "secagg.costs", "HardwareProfile": "secagg.costs", "PROFILES": "secagg.costs",
    "Transcript": "secagg.transcript",
    # the trained model of a run folder
    "load_model": "secagg.model_io",
    # data
    "load_dataset": "secagg.data", "iid_split": "secagg.data",
    "dirichlet_split": "secagg.data", "shard_split": "secagg.data",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("secagg", _EXPORTS, globals())
