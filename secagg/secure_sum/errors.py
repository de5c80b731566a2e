"""Protocol errors of the secure-sum protocol.

Every one derives from :class:`secagg.errors.ProtocolError`, so a caller can catch the whole
family; the subclasses say what went wrong with a message (and carry the facts as attributes).
"""

from __future__ import annotations

from secagg.errors import ProtocolError


class MalformedMessage(ProtocolError):
    """A message does not decode: bad magic, version or type, inconsistent counts, trailing
    bytes, or a value outside its allowed range."""


class TruncatedMessage(MalformedMessage):
    """A message is shorter than its header or its declared body length."""


class ReplayedMessage(ProtocolError):
    """A message belongs to another session, or repeats one the party already processed."""


class MisaddressedMessage(ProtocolError):
    """A message (or an entry inside it) names a receiver or sender it must not name."""


class AuthenticationFailed(ProtocolError):
    """An encrypted share failed AEAD authentication (tampered, or encrypted for someone else).

    Attributes:
        sender: the party whose share failed.
    """

    def __init__(self, sender: int, detail: str = "") -> None:
        self.sender = sender
        super().__init__(f"share from client {sender} failed authentication{detail}")


class UnmaskingRefused(ProtocolError):
    """An honest client refused an unmasking request (e.g. it asked for both the self-mask
    share and the pairwise-key share of the same peer, which would reveal that peer's input).

    Attributes:
        client: the refusing client.
        peers: the peers the offending request named.
    """

    def __init__(self, client: int, peers: tuple[int, ...], reason: str) -> None:
        self.client = client
        self.peers = peers
        super().__init__(f"client {client} refuses to unmask {list(peers)}: {reason}")


class StageOrderError(ProtocolError):
    """A party was asked to run a protocol stage out of order (or twice)."""
