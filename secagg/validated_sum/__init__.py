"""Validated sum: secure aggregation over two non-colluding aggregators that rejects a
client whose update breaks its L2 bound, without either aggregator seeing any update.

Modules: :mod:`.field` (F_p arithmetic, p = 2^61 - 1, AES-CTR expansion), :mod:`.proof`
(the statement, the client's proof, the checks on shares, the soundness derivation),
:mod:`.wire` (messages), :mod:`.client` and :mod:`.aggregator` (the parties as
byte-in/byte-out state machines), :mod:`.protocol` (one round in one process) and
:mod:`.layer` (the :class:`ValidatedSum` layer of the embedded engine).
"""

from secagg.validated_sum.errors import (
    BoundExceeded,
    ClientRejected,
    CoinError,
    MalformedShare,
    ProofRejected,
    ReplayedShare,
)
from secagg.validated_sum.layer import AGGREGATOR_B, ValidatedSum
from secagg.validated_sum.proof import Params
from secagg.validated_sum.protocol import RoundResult, run_round

__all__ = ["AGGREGATOR_B", "BoundExceeded", "ClientRejected", "CoinError", "MalformedShare",
           "Params", "ProofRejected", "ReplayedShare", "RoundResult", "ValidatedSum",
           "run_round"]
