"""The Plaintext layer: the baseline in which the server sees every upload in the clear."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER
from secagg.errors import ProtocolError, UploadError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.link import STEP_REPLY, Dropped, Link, PhaseCall, Reply, book_drops, reply_field
from secagg.messages import Upload, UploadSpec
from secagg.wire import pack_arrays, unpack_arrays


def sum_fields(
    uploads: Mapping[int, Mapping[str, np.ndarray]], spec: UploadSpec, clients: list[int]
) -> dict[str, np.ndarray]:
    """Sum each additive field of ``spec`` over ``clients`` (float64, or int64 exactly)."""
    sums: dict[str, np.ndarray] = {}
    for f in spec.additive:
        acc = np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
        for c in clients:
            acc += uploads[c][f.name]
        sums[f.name] = acc
    return sums


class Plaintext(Layer):
    """Every client sends its upload in the clear; the server sums additive fields and
    keeps the others per client. Stage: ``"upload"`` (dropouts apply there). No privacy:
    use it as the baseline every other layer is compared with."""

    name: ClassVar[str] = "plaintext"

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Collect the surviving clients' uploads, transcript them as seen in the clear, and
        return their sums (additive fields) and per-client values (the others)."""
        live = ctx.dropouts.survivors("upload", sorted(uploads))
        received: dict[int, dict[str, np.ndarray]] = {}
        server_s = 0.0
        for c in live:
            up = uploads[c]
            t0 = time.process_time()
            wire = pack_arrays({f.name: up[f.name] for f in spec.fields})
            client_s = time.process_time() - t0 + up.cpu_s
            t0 = time.process_time()
            received[c] = unpack_arrays(wire)
            server_s = time.process_time() - t0
            ctx.message(c, SERVER, "upload", wire_bytes=wire,
                        plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.fields},
                        client_cpu_s=client_s, server_cpu_s=server_s, flops=up.flops,
                        step_flops=up.flops)
            for f in spec.fields:
                ctx.observe(SERVER, c, "upload", f.name, "clear", received[c][f.name])
        t0 = time.process_time()
        sums = sum_fields(received, spec, live)
        values = {f.name: {c: received[c][f.name] for c in live} for f in spec.non_additive}
        server_s = time.process_time() - t0
        ctx.message(SERVER, SERVER, "sum", wire_bytes=0, server_cpu_s=server_s)
        return Aggregate(ctx.phase, ctx.round, sums, values, tuple(live))

    @property
    def server_sees_clear_uploads(self) -> bool:
        """Always True: that is what plaintext means."""
        return True


class PlaintextServer:
    """The Plaintext layer's server side when the clients run elsewhere (a
    :class:`~secagg.link.LayerServer`): one ``upload`` exchange that runs the client step
    on each node, the server's re-check of every upload against the spec, then the layer
    on the uploads that arrived, exactly as in one process."""

    def __init__(self, *, layer: Layer) -> None:
        self.layer = layer

    def hello(self, round: int, phase: str, n: int) -> dict[str, Any]:
        """Nothing rides on the hello."""
        return {}

    def greeted(self, client: int, reply: Reply) -> None:
        """Nothing to keep from the hello."""

    def start(self, cohort: Sequence[int], announced: int) -> None:
        """Nothing to prepare."""

    def aggregate(self, call: PhaseCall, link: Link) -> Aggregate:
        """Collect the cohort's uploads, refuse (drop) any that breaks the spec, aggregate."""
        spec, ctx = call.release.carried, call.release.ctx
        if call.broadcast:  # it rides in the upload instruction
            link.count("upload", len(call.broadcast) * len(call.cohort))
        got, failed = link.exchange(
            "upload", ctx, {c: {"step": "upload", **call.instruction} for c in call.cohort},
            needs=STEP_REPLY, step=True)
        dropped: Dropped = {}
        book_drops(link, ctx, "upload", failed, dropped)
        uploads: dict[int, Upload] = {}
        for c, rec in sorted(got.items()):
            raw = reply_field(rec, "msg", bytes)
            link.count("upload", len(raw))
            # the server re-checks what arrived against the spec (a node may be hostile)
            # with the public per-client bound (the spec's max_records records: a node's own
            # count is private); an upload that breaks it is refused, its client dropped
            try:
                up = Upload.validate(spec, unpack_arrays(raw), c, int(spec.max_records or 1),
                                     "raise")
            except (ProtocolError, UploadError) as exc:
                book_drops(link, ctx, "upload", {c: f"refused: {exc}"}, dropped)
                continue
            up.cpu_s = reply_field(rec, "cpu_s", float)
            up.flops = reply_field(rec, "flops", float)
            up.clipped = json.loads(reply_field(rec, "clipped", str))
            call.clips.add(up)
            uploads[c] = up
        agg = self.layer.aggregate(uploads, spec, ctx)
        agg.notes["dropped"] = dropped
        return agg


def upload_on_node(rec: Reply, spec: UploadSpec, up: Upload, client: int, noiser: Any,
                   rng: Any, out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """The Plaintext layer's client side on a node, after the client step (``out`` holds
    its reply fields, ``cpu`` its CPU seconds): the upload packed as it is, for
    :class:`PlaintextServer`."""
    t0 = time.process_time()
    out["msg"] = pack_arrays({f.name: up[f.name] for f in spec.fields})
    out["cpu_s"] = cpu + time.process_time() - t0
    return out
