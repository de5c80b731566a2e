"""Typed errors of the validated sum.

A client's message that does not decode, has the wrong length, belongs to another run,
round or client, or whose proof fails, raises an error that names the client; the
aggregators catch it, exclude that client and go on (only the faulty party pays).
"""

from __future__ import annotations

from secagg.errors import ProtocolError, SecaggError


class ClientRejected(ProtocolError):
    """A client's contribution is excluded from the sum.

    Attributes:
        client: the client excluded.
        reason: what was wrong, in words.
    """

    def __init__(self, client: int, reason: str) -> None:
        self.client = client
        self.reason = reason
        super().__init__(f"client {client} rejected: {reason}")


class MalformedShare(ClientRejected):
    """A client's message does not decode (bad magic, header, field element >= p, trailing
    bytes) or a share has the wrong length."""


class ReplayedShare(ClientRejected):
    """A client's message names another run, round, client or aggregator, or the two
    aggregators received pieces of different uploads from it."""


class ProofRejected(ClientRejected):
    """A client's proof that its update is within the bound failed joint verification."""


class BoundExceeded(SecaggError, ValueError):
    """An honest client was asked to prove an update whose L2 norm exceeds the bound (it
    refuses rather than send a proof that will fail).

    Attributes:
        norm: the update's L2 norm; bound: the declared bound.
    """

    def __init__(self, norm: float, bound: float) -> None:
        self.norm = norm
        self.bound = bound
        super().__init__(f"update L2 norm {norm:.6g} exceeds the bound {bound:.6g}; clip it")


class CoinError(ProtocolError):
    """The other aggregator deviates: its coin opening does not match its commitment, its
    CHECK or SUM message is malformed, or it names other accepted clients. The round stops
    and no sum is released (one deviating aggregator can deny the result, never bias it)."""
