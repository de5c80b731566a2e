"""Protocol errors of the secure-sum protocol.

Every one derives from :class:`secagg.errors.ProtocolError`, so a caller can catch the whole
family; the subclasses say what went wrong with a message (and carry the facts as attributes).
"""

from __future__ import annotations

from secagg.errors import ProtocolError, SecureSumAborted
from secagg.stages import Stage


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


class UnsafeThreshold(ProtocolError):
    """A ROSTER asks a client to share its secrets with a threshold that would let a malicious
    server rebuild both of them: t_k must exceed half the holders, so that no two disjoint
    groups of t_k holders (one asked for self-mask shares, one for mask-key shares) exist.

    Attributes:
        client: the refusing client.
        share_threshold: the t_k the roster announced.
        holders: how many parties would hold a share (the listed neighbours and the client).
    """

    def __init__(self, client: int, share_threshold: int, holders: int) -> None:
        self.client = client
        self.share_threshold = share_threshold
        self.holders = holders
        super().__init__(
            f"client {client}: ROSTER share threshold {share_threshold} with {holders} holders "
            f"is unsafe; it must be more than half the holders (>= {holders // 2 + 1}), or a "
            "malicious server can rebuild both the self-mask seed and the mask key"
        )


class RejectedKey(ProtocolError):
    """The server refused a client's ADVERTISE: a low-order X25519 key, a key another client
    already advertised, the same key twice, or a bad signature. The client is dropped from the
    session; the others go on.

    Attributes:
        client: the refused client.
        reason: what is wrong with its keys.
    """

    def __init__(self, client: int, reason: str) -> None:
        self.client = client
        self.reason = reason
        super().__init__(f"ADVERTISE of client {client} refused: {reason}")


class InconsistentView(ProtocolError):
    """The consistency round failed at a client: the server showed it a survivor set that
    the other clients did not sign (an equivocating server), too few valid signatures, or an
    unmasking request that contradicts the survivor set. The client releases no share.

    Attributes:
        client: the aborting client.
        reason: what did not check out.
    """

    def __init__(self, client: int, reason: str) -> None:
        self.client = client
        self.reason = reason
        super().__init__(f"client {client} aborts before unmasking: {reason}")


class TooFewShares(SecureSumAborted):
    """Fewer than t_k shares of a secret the server must rebuild reached it: the live holders
    that accepted the owner's shares are too few (the others dropped, were excluded, or
    rejected the owner's shares). The round aborts rather than return a wrong sum.

    Attributes:
        owner: whose secret it is.
        secret: "self-mask seed" or "mask key".
        (and :class:`SecureSumAborted`'s ``stage`` = "unmask", ``survivors`` = the shares that
        arrived, ``threshold`` = t_k.)
    """

    def __init__(self, owner: int, secret: str, shares: int, threshold: int) -> None:
        super().__init__(Stage.UNMASK, shares, threshold)
        self.owner = owner
        self.secret = secret
        self.args = (
            f"secure sum aborted at stage 'unmask': {shares} shares of client {owner}'s "
            f"{secret} reached the server, t_k = {threshold} are needed (its other holders "
            "dropped, were excluded, or rejected its shares)",
        )


class BadIntegrityTag(MalformedMessage):
    """A MASKED vector's integrity tag (its sender's Ed25519 signature over session, round,
    sender and the vector's SHA-256) does not verify: the vector was altered, or the tag was
    made for another round or session. The vector is refused and its sender treated as
    dropped; the others go on.

    Attributes:
        sender: the client whose vector was refused.
    """

    def __init__(self, sender: int) -> None:
        self.sender = sender
        super().__init__(
            f"MASKED from client {sender}: integrity tag does not verify for this session and "
            "round; its vector is refused and the client counts as dropped"
        )


class WrongShare(ProtocolError):
    """An UNMASK_RESPONSE returns a share that contradicts the digest its dealer signed for
    that holder: the holder lied (an honest holder checked the same share against the same
    signed digest when it accepted it). The server records the fault and uses none of the
    holder's shares; the round goes on.

    Attributes:
        holder: the client whose response lied.
        owner: whose secret the wrong share is of.
        secret: "self-mask seed" or "mask key".
    """

    def __init__(self, holder: int, owner: int, secret: str) -> None:
        self.holder, self.owner, self.secret = holder, owner, secret
        super().__init__(
            f"UNMASK_RESPONSE from client {holder}: its share of client {owner}'s {secret} "
            "contradicts the digest the dealer signed; none of its shares is used"
        )


class UnrecoverableSecret(SecureSumAborted, ProtocolError):
    """A secret the server must rebuild does not decode: more of its h shares are wrong than
    the Reed-Solomon code corrects (floor((h - t_k) / 2)), or it decodes to a mask key other
    than its owner advertised. The round aborts rather than return a wrong sum. (Both an
    abort and a protocol error: the shares that arrived are inconsistent.)

    Attributes:
        owner: whose secret it is.
        secret: "self-mask seed" or "mask key".
        holders: h, the shares that arrived.
        max_errors: the bound floor((h - t_k) / 2).
        reason: what did not check out.
        (and :class:`SecureSumAborted`'s ``stage`` = "unmask", ``survivors`` = h,
        ``threshold`` = t_k.)
    """

    def __init__(self, owner: int, secret: str, holders: int, threshold: int,
                 reason: str) -> None:
        super().__init__(Stage.UNMASK, holders, threshold)
        self.owner = owner
        self.secret = secret
        self.holders = holders
        self.max_errors = max(0, (holders - threshold) // 2)
        self.reason = reason
        self.args = (
            f"secure sum aborted at stage 'unmask': client {owner}'s {secret} cannot be "
            f"rebuilt from its {holders} shares (t_k = {threshold}, at most {self.max_errors} "
            f"wrong shares correctable): {reason}",
        )
