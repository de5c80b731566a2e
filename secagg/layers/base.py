"""The layer protocol: what every privacy layer takes and returns.

A :class:`Layer` takes one phase's validated uploads from a cohort and returns the
:class:`Aggregate` the server is allowed to see: sums of additive fields, per-client values
of the others, and the clients that actually contributed. Along the way it records one
ledger row per message (true wire bytes) and transcripts what each party saw, through the
:class:`RoundContext` it is handed.

Layers compose by wrapping (``CentralDP(SecureSum(...))``): a wrapper is itself a Layer
that delegates to its inner layer, so an order that makes no sense cannot be written.

A wrapper works around its inner layer in parts, as TensorFlow Federated's aggregation
factories do (the inner never learns it is wrapped):

* a :class:`ServerPart` (:meth:`Layer.server_part`) begins a phase on the aggregator (checks,
  budget, what the nodes need), tells the inner driver what it carries (a spec, a context,
  or a :class:`RingEncoding`: vectors the wrapper encodes and the inner only sums), and ends
  it (noise on the sums, accounting, notes);
* a :class:`NodePart` is what a client does before its upload leaves: transform the upload
  (:meth:`NodePart.prepare`) or encode it into the ring vector the inner sums
  (:meth:`NodePart.encode`).

A layer that wraps nothing has the identity parts (the defaults here).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER, CostRow, Ledger
from secagg.dropouts import DropoutModel
from secagg.errors import ConfigurationError, ProtocolError
from secagg.messages import Upload, UploadSpec
from secagg.stages import Stage
from secagg.transcript import Transcript, digest
from secagg.wire import Message, is_message, message_size


@dataclass
class Aggregate:
    """The server's view of one phase after a layer.

    Attributes:
        phase, round: where it comes from.
        sums: additive fields -> sum over :attr:`contributors` (float64, or int64 for
            integer fields; noised when a DP layer is in the stack).
        values: non-additive fields -> {client: value}.
        contributors: the clients whose inputs are in the result, after dropouts.
        notes: layer facts about the result (e.g. noise actually added per field).
        cohort: how many clients were sampled for the phase (set by the engine before the
            server step; public to the server, unlike who of them held which data). A mean
            with a fixed denominator divides by it rather than by the survivors, so that
            dropouts never scale the noise of a DP sum up (McMahan et al., ICLR 2018).
            None outside an engine.
    """

    phase: str
    round: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    contributors: tuple[int, ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)
    cohort: int | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.sums[name]
        except KeyError:
            if name in self.values:
                raise KeyError(
                    f"{name!r} is not additive; read aggregate.values[{name!r}] per client"
                ) from None
            raise

    def __contains__(self, name: object) -> bool:
        return name in self.sums or name in self.values


@dataclass
class RoundContext:
    """Everything a layer needs for one (round, phase): where to book costs and
    observations, which clients drop at which stage, and the run's privacy ledger."""

    round: int
    phase: str
    seed: int
    ledger: Ledger = field(default_factory=Ledger)
    transcript: Transcript = field(default_factory=Transcript)
    dropouts: DropoutModel = field(default_factory=DropoutModel)
    privacy: Any | None = None
    #: who signs (in one process) or collects (remote) the clients' statements about the
    #: messages they send (:mod:`secagg.attest`); None: no attestation
    attest: Any | None = None
    #: processes a layer may spread the simulated clients' own work over (the secure sum's
    #: parties, :mod:`secagg.secure_sum.parties`); 1: all in this process
    workers: int = 1

    def __post_init__(self) -> None:
        self.dropouts.at(self.round, self.phase)

    def message(
        self,
        sender: Any,
        receiver: Any,
        stage: str,
        wire_bytes: int | Message,
        plaintext_bytes: int = 0,
        fields: dict[str, int] | None = None,
        client_cpu_s: float = 0.0,
        server_cpu_s: float = 0.0,
        flops: float = 0.0,
        step_flops: float = 0.0,
        sha: str | None = None,
    ) -> None:
        """Book one message: a ledger row and a transcript ``message`` record, both with the
        same framed wire size. ``wire_bytes`` is the message itself (bytes, or a sequence of
        frames: sized by :func:`secagg.wire.message_size`, the one definition) or its size.
        ``flops`` is the deterministic client-side work the message took (see
        :mod:`secagg.costs`), of which ``step_flops`` is the client step's own; the
        ``*_cpu_s`` are measured host seconds (informative). With :attr:`attest` set, a
        message a client (or the decryptor) sent, given as bytes, gets its signed statement
        (:mod:`secagg.attest`). ``sha``: the message's digest
        (:func:`secagg.transcript.digest`) when the caller already has it (a broadcast
        booked once per client)."""
        size = message_size(wire_bytes) if is_message(wire_bytes) else int(wire_bytes)
        row = CostRow(
            round=self.round, phase=self.phase, stage=stage, sender=sender, receiver=receiver,
            fields=dict(fields or {}), plaintext_bytes=int(plaintext_bytes),
            wire_bytes=size, client_cpu_s=float(client_cpu_s),
            server_cpu_s=float(server_cpu_s), flops=float(flops),
            step_flops=float(step_flops),
        )
        self.ledger.record(row)
        signed = self.attest is not None and is_message(wire_bytes)
        if signed and sha is None:
            sha = digest(wire_bytes)  # type: ignore[arg-type]
        elif not signed:
            sha = None
        self.transcript.message(round=self.round, phase=self.phase, stage=stage,
                                sender=sender, receiver=receiver, direction=row.direction,
                                nbytes=size, digest=sha)
        if signed:
            # the one place every message of a client passes: its signed statement
            self.attest.sent(self, sender, receiver, stage, wire_bytes,
                             noised=getattr(self, "_noised", ()), digest=sha)

    def observe(
        self,
        party: str,
        sender: Any,
        stage: str,
        field: str,
        form: str,
        value: np.ndarray | Message,
        what: str = Stage.UPLOAD,
        nbytes: int | None = None,
        value_digest: str | None = None,
    ) -> None:
        """Record in the transcript that ``party`` saw ``value`` in ``form`` (see
        :meth:`secagg.transcript.Transcript.observe`)."""
        self.transcript.observe(
            round=self.round, phase=self.phase, stage=stage, party=party, sender=sender,
            field=field, form=form, value=value, what=what, nbytes=nbytes,
            value_digest=value_digest,
        )


@dataclass(frozen=True)
class RingEncoding:
    """How a wrapper has an inner sum carry a phase: each client's upload encoded (by the
    wrapper's node part) into one vector of ``ring_bits``-bit ring elements, which the inner
    layer sums without decoding it; the wrapper's server part decodes the sum
    (:meth:`ServerPart.finish`).

    Attributes:
        ring_bits: the ring Z_2^k the vectors are summed in.
        segments: each field's slice of the vector.
        nbytes: each field's plaintext bytes (for the cost ledger).
        label: the name the whole vector is transcripted under in one process.
    """

    ring_bits: int
    segments: Mapping[str, slice]
    nbytes: Mapping[str, int]
    label: str

    @property
    def length(self) -> int:
        """Entries in one client's vector."""
        return sum(s.stop - s.start for s in self.segments.values())


class ServerPart:
    """The aggregator's part of one phase around an inner layer's driver: begun by
    :meth:`Layer.server_part`, then the inner driver carries :attr:`carried` under
    :attr:`ctx` (or, with an :attr:`encoding`, sums the vectors the clients encoded and hands
    the ring sum to :meth:`finish`), then :meth:`end`. This base is the identity: a layer
    that wraps nothing.

    Attributes:
        spec: the phase's spec; ``carried``: the spec the inner layer carries.
        ctx: the context the inner layer records under.
        node_params: JSON the nodes rebuild their :class:`NodePart` from (None: the identity).
        encoding: set when the clients encode their uploads for the inner sum themselves.
    """

    def __init__(self, spec: UploadSpec, ctx: RoundContext) -> None:
        self.spec = spec
        self.carried = spec
        self.ctx = ctx
        self.node_params: str | None = None
        self.encoding: RingEncoding | None = None

    @property
    def local_ctx(self) -> RoundContext:
        """The context the inner layer records under in one process (the default:
        :attr:`ctx`)."""
        return self.ctx

    def client_vector(self, client: int, up: Upload) -> np.ndarray:
        """In one process, ``client``'s ring vector under :attr:`encoding`."""
        raise ProtocolError("this layer's clients encode nothing for an inner sum")

    def finish(self, ring_sum: np.ndarray, contributors: Sequence[int],
               ctx: RoundContext) -> Aggregate:
        """The aggregate from the inner sum of the vectors under :attr:`encoding`."""
        raise ProtocolError("this layer's clients encode nothing for an inner sum")

    def end(self, agg: Aggregate, ctx: RoundContext) -> Aggregate:
        """The aggregator's side after the inner layer (the identity here)."""
        return agg


class NodePart:
    """A client's part of a wrapper, on its own upload before it leaves (rebuilt on a node
    from :attr:`ServerPart.node_params`). This base is the identity.

    Attributes:
        name: the wrapper's layer name (attested by the node).
        noise_multiplier: the noise multiplier it applies, if any.
        seeded: its noise comes from a user seed (reproducible, not private).
        upload_noised: the fields it noises on the upload itself (None: it does not touch
            the upload's fields).
    """

    name: str = ""
    noise_multiplier: float | None = None
    seeded: bool = False
    upload_noised: tuple[str, ...] | None = None

    def prepare(self, up: Upload, spec: UploadSpec) -> tuple[Upload, UploadSpec]:
        """(the upload as it leaves, the spec the inner layer carries)."""
        return up, spec

    def encode(self, up: Upload, spec: UploadSpec, n: int
               ) -> tuple[np.ndarray, int, int] | None:
        """The ring vector an inner sum over a cohort of ``n`` carries for this client, as
        (vector, ring bits, the fewest survivors the vector is sized for), or None: the inner
        layer encodes the upload itself."""
        return None


class Layer(ABC):
    """A privacy layer: turns a cohort's uploads into the server's :class:`Aggregate`."""

    name: ClassVar[str] = "layer"
    #: a DP layer: its releases are spent on a privacy ledger (a runtime keeps the
    #: clients' un-noised accuracies to themselves under it)
    is_dp: ClassVar[bool] = False
    #: its clients encode the vectors the inner layer sums (:class:`RingEncoding`), so the
    #: inner must be a layer that sums them (``sum_encoded`` in one process; over a link,
    #: a driver the layer registry marks ``sums_encoded``)
    needs_encoded_sum: ClassVar[bool] = False
    #: the aggregator adds the noise after seeing the un-noised result, so the layer's
    #: guarantee does not hold against the server
    aggregator_noises: ClassVar[bool] = False
    #: two non-colluding aggregators each add their own noise to their share of the sum
    #: (:meth:`noise_in_shares`), so a CentralDP around it holds against each of them
    noises_in_shares: ClassVar[bool] = False
    #: the parties that each add noise to their share (:meth:`noise_in_shares`)
    share_parties: ClassVar[tuple[str, ...]] = ()

    def noise_in_shares(self, sigmas: Mapping[str, float], sources: Mapping[str, Any]
                        ) -> None:
        """Have the next :meth:`aggregate` add, by each aggregator (``sources``: party ->
        its noise source, with an ``rng``), Gaussian noise of std ``sigmas[field]`` (real
        units) to its share of each field's sum, before the shares meet. Only a layer that
        declares :attr:`noises_in_shares` does."""
        raise ConfigurationError(f"layer {self.name!r} does not add noise in shares")

    @property
    def wrapped(self) -> Layer | None:
        """The layer this one wraps (None: it wraps nothing and carries the uploads)."""
        return None

    def dropout_stages(self) -> tuple[str, ...]:
        """The stages, in order, at which this layer asks which clients are still live
        (``ctx.dropouts.survivors(stage, ...)``); a per-round dropout rate is spread over
        them. The default is the single ``"upload"`` stage."""
        return (Stage.UPLOAD,)

    def check(self, spec: UploadSpec) -> None:  # noqa: B027 - default admits everything
        """Refuse (raise :class:`~secagg.errors.InadmissibleField`) a field this layer
        cannot carry. The default admits every field."""

    @abstractmethod
    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Run the layer on one phase's uploads and return what the server learns."""

    def describe(self) -> dict[str, Any]:
        """JSON-able description (name and parameters), for results and transcripts."""
        return {"name": self.name}

    def server_part(self, spec: UploadSpec, ctx: RoundContext, n: int) -> ServerPart:
        """Begin one phase's release of ``spec`` by a cohort of ``n`` on the aggregator
        (:class:`ServerPart`). The default, for a layer that wraps nothing, is the
        identity."""
        return ServerPart(spec, ctx)

    def unnoised_fields(self, spec: UploadSpec) -> dict[str, str]:
        """The fields of ``spec`` this layer releases without DP noise, each with the
        reason (the privacy ledger marks them). The default: every field, as a layer that
        is not a DP layer adds no noise."""
        return {f.name: f"layer {self.name!r} adds no DP noise" for f in spec.fields}

    @property
    def server_sees_clear_uploads(self) -> bool:
        """True when the aggregator reads individual uploads in the clear."""
        return False

    @property
    def streams(self) -> bool:
        """True when :meth:`aggregate` reads each client's upload at most once and keeps
        nothing of it but what the server keeps (a running sum, a non-additive value), so
        that the engine may compute each upload only when the layer reads it
        (:class:`secagg.stream.UploadStream`) and a cohort costs the memory of one upload.
        The default, False, has the engine compute and hold every upload first."""
        return False


def server_party() -> str:
    """The name of the aggregator in ledgers and transcripts."""
    return SERVER
