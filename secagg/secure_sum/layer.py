"""The :class:`SecureSum` layer: dropout-tolerant secure aggregation of additive fields.

Each client's additive fields are encoded with one fixed-point plan
(:func:`secagg.encoding.plan`) into a single vector of ring elements; the ring is the
smallest whole number of bytes that holds the cohort's sum (at most ``ring_bits``), so the
masked vector costs ``ceil(k/8)`` bytes per value on the wire. The vectors are summed by the
secure-sum protocol (:mod:`secagg.secure_sum.protocol`) and the server decodes only the sum.

Server model. Without pinned keys the layer protects the inputs against an honest-but-curious
server (and a minority of colluding clients). With ``identities`` (each simulated client's
long-term Ed25519 key, whose public halves every client pins -- in a deployment, a PKI) it
follows Bonawitz et al.'s active variant: clients check that every roster key is signed by its
owner, refuse share thresholds of at most half the holders, and release shares only after a
consistency round proves that enough clients signed the same survivor set, so an actively
malicious server (colluding with fewer than 2t - n clients) learns no individual input.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.encoding import FixedPoint, plan, plan_ring_bits
from secagg.errors import ConfigurationError, InadmissibleField
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec
from secagg.secure_sum.graph import GraphKind, check_threshold, degree_for, resolve_threshold
from secagg.secure_sum.protocol import SessionReport, run_secure_sum
from secagg.stages import Stage
from secagg.stream import Booked


def _encoded(uploads: Mapping[int, Upload], plans: dict[str, FixedPoint]) -> Booked[np.ndarray]:
    """Client -> its concatenated ring vector, encoded when the protocol reads it (each
    upload read once, never all held at once), its step and encoding booked in ``costs``."""

    def encode(u: int, up: Upload) -> np.ndarray:
        parts = [p.encode(np.asarray(up[name])) for name, p in plans.items()]
        if len(parts) == 1:  # one field: its fresh encoding as it is (no copy of m words)
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    return Booked(uploads, encode)


class SecureSum(Layer):
    """Secure aggregation (Bonawitz et al. 2017) with the optional SecAgg+ graph (Bell et al.
    2020): the server learns the sum of the surviving clients' additive fields and nothing
    else, exactly (after fixed-point quantisation), as long as enough clients stay live.

    Args:
        threshold: fraction of the cohort (float in (0, 1]) or count (int >= 2) that must stay
            live at every stage; it is also the Shamir reconstruction threshold (per
            neighbourhood, scaled to k + 1 holders, on the SecAgg+ graph).
        graph: "complete" (every pair of clients masks), "harary" (each client pairs with k
            neighbours on a random k-regular Harary graph) or "auto" (harary when the
            automatic k is below n - 1).
        k: the Harary degree; None picks 2 * ceil(2 log2 n), raised for ``dropout``.
        precision: quantisation step target for float fields.
        ring_bits: the largest ring Z_{2^k} to use (2..64); the layer uses the smallest whole
            number of bytes that holds the cohort's sum, up to this.
        identities: client id -> its long-term Ed25519 private key (the simulated clients'
            identity keys; every client pins the public halves). None: fresh keys per session,
            nothing pinned -- then the layer is secure against an honest-but-curious server
            only (see the module docstring).
        dropout: the fraction of a cohort expected to drop before its masked input. On the
            SecAgg+ graph with ``k`` None the degree is then raised until a session aborts
            for want of share holders with probability at most 1e-6 at that rate
            (:func:`~secagg.secure_sum.graph.degree_for`; e.g. n = 10,000 at 10 %: k = 126
            instead of 54, whose abort chance is about 10 %). 0 (default): the plain degree.
    """

    name: ClassVar[str] = "secure-sum"

    def __init__(
        self,
        threshold: float | int = 0.7,
        graph: GraphKind = "complete",
        k: int | None = None,
        precision: float = 1e-9,
        ring_bits: int = 64,
        identities: Mapping[int, Ed25519PrivateKey] | None = None,
        dropout: float = 0.0,
    ) -> None:
        check_threshold(threshold)
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not (
                0.0 <= dropout < 1.0):
            raise ConfigurationError(f"dropout must be a fraction in [0, 1), got {dropout!r}")
        if identities is not None and not all(
            isinstance(k, Ed25519PrivateKey) for k in identities.values()
        ):
            raise ConfigurationError("identities must map client ids to Ed25519 private keys")
        if graph not in ("complete", "harary", "auto"):
            raise ConfigurationError(f"graph must be 'complete', 'harary' or 'auto', got {graph!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigurationError(f"k must be a positive integer or None, got {k!r}")
        if not (isinstance(precision, int | float) and precision > 0 and math.isfinite(precision)):
            raise ConfigurationError(f"precision must be a positive number, got {precision!r}")
        if isinstance(ring_bits, bool) or not isinstance(ring_bits, int) or not (
            2 <= ring_bits <= 64
        ):
            raise ConfigurationError(f"ring_bits must be an integer in 2..64, got {ring_bits!r}")
        self.threshold = threshold
        self.graph = graph
        self.k = k
        self.precision = float(precision)
        self.ring_bits = ring_bits
        self.identities = dict(identities) if identities is not None else None
        self.dropout = float(dropout)
        self.last_report: SessionReport | None = None

    def describe(self) -> dict[str, Any]:
        """Name and parameters."""
        return {"name": self.name, "threshold": self.threshold, "graph": self.graph,
                "k": self.k, "dropout": self.dropout, "precision": self.precision,
                "ring_bits": self.ring_bits,
                "pinned_identities": self.identities is not None}

    def dropout_stages(self) -> tuple[str, ...]:
        """The protocol's five rounds: key advertisement, share exchange, masked input, the
        consistency check and unmasking."""
        return (Stage.ADVERTISE, Stage.SHARE, Stage.MASKED_INPUT, Stage.CONSISTENCY, Stage.UNMASK)

    def degree(self, n: int) -> int | None:
        """The SecAgg+ degree for a cohort of n: ``k`` if given, else the plain degree
        (None) or, with ``dropout``, :func:`~secagg.secure_sum.graph.degree_for`."""
        if self.k is not None or self.dropout == 0.0 or self.graph == "complete":
            return self.k
        return degree_for(n, self.threshold, self.dropout)

    def min_survivors(self, n: int) -> int:
        """The fewest contributors a run over a cohort of n can return a sum for (t)."""
        return resolve_threshold(self.threshold, n)

    def check(self, spec: UploadSpec) -> None:
        """Refuse non-additive fields and additive fields without a bound."""
        if spec.non_additive:
            f = spec.non_additive[0]
            raise InadmissibleField(
                self.name, f.name,
                (f"{f.reason}; " if f.reason else "")
                + "secure summation reveals only the sum over clients, but this field is "
                "not additive (the server needs each client's own value)",
            )
        for f in spec.additive:
            try:
                spec.client_linf(f.name)
            except ValueError as exc:
                raise InadmissibleField(
                    self.name, f.name,
                    f"no per-client bound, so no overflow-free ring encoding exists ({exc})",
                ) from None

    def plan(self, spec: UploadSpec, n_clients: int) -> dict[str, FixedPoint]:
        """The fixed-point plan for a cohort: every field in one ring, the smallest whole
        number of bytes that holds the sum (raises EncodingOverflow if even ``ring_bits``
        cannot)."""
        plans = plan(spec, max(n_clients, 1), self.precision, self.ring_bits)
        need = plan_ring_bits(plans)
        bits = min(self.ring_bits, 8 * math.ceil(need / 8))
        return {name: dataclasses.replace(p, ring_bits=bits) for name, p in plans.items()}

    def layout(self, spec: UploadSpec, n_clients: int) -> tuple[
            dict[str, FixedPoint], int, dict[str, slice], dict[str, int]]:
        """Check ``spec``, then plan one summed vector for ``n_clients``: the fixed-point plan
        per field, the ring bits, each additive field's slice of the vector and its
        plaintext bytes (shared by this layer and the Flower runtime)."""
        self.check(spec)
        plans = self.plan(spec, n_clients)
        bits = next(iter(plans.values())).ring_bits if plans else 8
        segments, off = {}, 0
        for f in spec.additive:
            segments[f.name] = slice(off, off + f.size)
            off += f.size
        return plans, bits, segments, {f.name: f.nbytes for f in spec.additive}

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Securely sum the additive fields of ``uploads``; see the class docstring."""
        plans, bits, segments, fields = self.layout(spec, len(uploads))
        off = sum(f.size for f in spec.additive)
        vectors = _encoded(uploads, plans)
        report = run_secure_sum(
            vectors, bits, ctx,
            threshold=self.threshold, graph=self.graph, k=self.degree(len(uploads)),
            segments=segments, length=off,
            plaintext_bytes=sum(fields.values()), fields=fields,
            upload_costs=vectors.costs,  # filled as each vector is read, before its row
            identities=self.identities, workers=ctx.workers,
        )
        self.last_report = report
        sums = {
            f.name: plans[f.name].decode_sum(report.total[segments[f.name]]).reshape(f.shape)
            for f in spec.additive
        }
        notes = report.notes  # the one driver's, as on Flower: secure_sum and dropped
        notes["secure_sum"]["scale_bits"] = {n: p.scale_bits for n, p in plans.items()}
        return Aggregate(phase=ctx.phase, round=ctx.round, sums=sums, values={},
                         contributors=report.contributors, notes=notes)

    @property
    def streams(self) -> bool:
        """True: the protocol reads each vector once, when its client masks it, and the
        server adds the masked vector to its running total."""
        return True

    def sum_encoded(
        self,
        vectors: Mapping[int, np.ndarray],
        ring_bits: int,
        ctx: RoundContext,
        label: str = Stage.UPLOAD,
        upload_costs: Mapping[int, tuple[float, float]] | None = None,
        length: int | None = None,
        fields: Mapping[str, int] | None = None,
    ) -> tuple[np.ndarray, tuple[int, ...]]:
        """Run the protocol on already-encoded vectors (uint64 ring elements, one length:
        ``length``, or read from the first vector). Each vector is read once, when its
        client masks it (a lazy mapping is fine). ``upload_costs``: client -> (CPU seconds,
        FLOPs) of its client step, booked on its masked-input row (as :meth:`aggregate`
        does); it is read after the client's vector. ``fields``: the plaintext bytes of each
        field the vectors carry, booked on the masked-input rows (as on a remote runtime).

        Returns:
            (the sum mod 2^ring_bits of the contributors' vectors as uint64, the contributors).

        Raises:
            SecureSumAborted: too few clients stayed live at some stage.
        """
        report = run_secure_sum(vectors, ring_bits, ctx, threshold=self.threshold,
                                graph=self.graph, k=self.degree(len(vectors)), label=label,
                                length=length, fields=fields,
                                plaintext_bytes=sum((fields or {}).values()),
                                identities=self.identities, upload_costs=upload_costs,
                                workers=ctx.workers)
        self.last_report = report
        return report.total, report.contributors
