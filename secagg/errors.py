"""Typed errors raised by secagg.

Every error the toolkit raises on purpose derives from :class:`SecaggError`, so callers can
catch the whole family; most also derive from :class:`ValueError` because they describe
bad input. Each carries the structured facts (client, field, stage, ...) as attributes.
"""

from __future__ import annotations


class SecaggError(Exception):
    """Root of every error secagg raises on purpose."""


class UploadError(SecaggError, ValueError):
    """A client's upload does not match its declared :class:`~secagg.messages.UploadSpec`.

    Attributes:
        client: the client that produced the upload.
        field: the offending field name (``"*"`` for problems with the upload as a whole).
        problem: what is wrong, in words.
    """

    def __init__(self, client: int | str, field: str, problem: str) -> None:
        self.client = client
        self.field = field
        self.problem = problem
        super().__init__(f"client {client}, field {field!r}: {problem}")


class InadmissibleField(SecaggError, ValueError):
    """A layer cannot carry a field (e.g. secure summation of a non-additive field)."""

    def __init__(self, layer: str, field: str, reason: str) -> None:
        self.layer = layer
        self.field = field
        self.reason = reason
        super().__init__(f"layer {layer!r} cannot carry field {field!r}: {reason}")


class EncodingOverflow(SecaggError, ValueError):
    """A fixed-point plan cannot represent a field's sum in the available ring."""


class ProtocolError(SecaggError):
    """A protocol message is malformed, unauthenticated, replayed or misaddressed."""


class SecureSumAborted(SecaggError):
    """Too few clients survived a secure-summation stage to finish safely.

    Attributes:
        stage: the protocol stage at which the cohort fell below the threshold.
        survivors: how many clients were still live at that stage.
        threshold: the minimum the protocol needs.
    """

    def __init__(self, stage: str, survivors: int, threshold: int) -> None:
        self.stage = stage
        self.survivors = survivors
        self.threshold = threshold
        super().__init__(
            f"secure sum aborted at stage {stage!r}: {survivors} live clients, "
            f"threshold is {threshold}"
        )


class DataError(SecaggError, ValueError):
    """A data set is missing, corrupt, or cannot be partitioned as asked."""


class PrivacyError(SecaggError, ValueError):
    """Differential privacy misuse: an unbounded field, an event no accountant can bound."""


class BudgetExceeded(PrivacyError):
    """A release would exceed the user's privacy budget; nothing was released."""


class ConfigurationError(SecaggError, ValueError):
    """An invalid combination of algorithm, layer or run parameters."""


class StreamConsumed(ConfigurationError):
    """A layer read a streamed upload twice (:class:`secagg.stream.UploadStream`): a layer
    that does must leave :attr:`secagg.layers.base.Layer.streams` False."""


class TranscriptError(SecaggError, ValueError):
    """A file is not a transcript, or a transcript is truncated or altered."""
