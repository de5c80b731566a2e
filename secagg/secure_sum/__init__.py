"""Secure summation: Bonawitz et al. (2017) secure aggregation with the SecAgg+ graph,
including the active-security variant's consistency round (see :mod:`.client` for what holds
with and without pinned client keys).

Modules: :mod:`.keys` (X25519, HKDF), :mod:`.shamir` (vectorised Shamir over 2^127 - 1),
:mod:`.prg` (AES-CTR mask expansion), :mod:`.wire` (the message format), :mod:`.graph`
(complete / Harary neighbours and thresholds), :mod:`.client` and :mod:`.server` (the parties'
state machines), :mod:`.protocol` (one session end to end) and :mod:`.layer` (the
:class:`SecureSum` layer).
"""

from secagg.secure_sum.errors import (
    AuthenticationFailed,
    BadIntegrityTag,
    InconsistentView,
    MalformedMessage,
    MisaddressedMessage,
    RejectedKey,
    ReplayedMessage,
    StageOrderError,
    TooFewShares,
    TruncatedMessage,
    UnmaskingRefused,
    UnrecoverableSecret,
    UnsafeThreshold,
    WrongShare,
)
from secagg.secure_sum.layer import SecureSum
from secagg.secure_sum.protocol import SessionReport, run_secure_sum

__all__ = [
    "AuthenticationFailed",
    "BadIntegrityTag",
    "InconsistentView",
    "MalformedMessage",
    "MisaddressedMessage",
    "RejectedKey",
    "ReplayedMessage",
    "SecureSum",
    "SessionReport",
    "StageOrderError",
    "TooFewShares",
    "TruncatedMessage",
    "UnmaskingRefused",
    "UnrecoverableSecret",
    "UnsafeThreshold",
    "WrongShare",
    "run_secure_sum",
]
