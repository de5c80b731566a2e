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


class Plaintext(Layer):
    """Every client sends its upload in the clear; the server sums additive fields and
    keeps the others per client. Stage: ``"upload"`` (dropouts apply there). No privacy:
    use it as the baseline every other layer is compared with."""

    name: ClassVar[str] = "plaintext"

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Collect the surviving clients' uploads, transcript them as seen in the clear, and
        return their sums (additive fields) and per-client values (the others). Each upload
        is read once and added to the running sums as it arrives, in cohort order, so a
        streamed cohort is never held whole."""
        live = ctx.dropouts.survivors("upload", sorted(uploads))
        sums = {f.name: np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
                for f in spec.additive}
        values: dict[str, dict[int, np.ndarray]] = {f.name: {} for f in spec.non_additive}
        sum_s = 0.0
        for c in live:
            up = uploads[c]
            t0 = time.process_time()
            wire = pack_arrays({f.name: up[f.name] for f in spec.fields})
            client_s = time.process_time() - t0 + up.cpu_s
            t0 = time.process_time()
            got = unpack_arrays(wire)
            server_s = time.process_time() - t0
            ctx.message(c, SERVER, "upload", wire_bytes=wire,
                        plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.fields},
                        client_cpu_s=client_s, server_cpu_s=server_s, flops=up.flops,
                        step_flops=up.flops)
            for f in spec.fields:
                ctx.observe(SERVER, c, "upload", f.name, "clear", got[f.name])
            t0 = time.process_time()
            for f in spec.additive:
                sums[f.name] += got[f.name]
            for f in spec.non_additive:
                values[f.name][c] = got[f.name]
            sum_s += time.process_time() - t0
        ctx.message(SERVER, SERVER, "sum", wire_bytes=0, server_cpu_s=sum_s)
        return Aggregate(ctx.phase, ctx.round, sums, values, tuple(live))

    @property
    def streams(self) -> bool:
        """True: each upload is read once and added to the running sums."""
        return True

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


def upload_on_node(rec: Reply, spec: UploadSpec, up: Upload, client: int, part: Any,
                   out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """The Plaintext layer's client side on a node, after the client step (``out`` holds
    its reply fields, ``cpu`` its CPU seconds): the upload packed as it is, for
    :class:`PlaintextServer`."""
    t0 = time.process_time()
    out["msg"] = pack_arrays({f.name: up[f.name] for f in spec.fields})
    out["cpu_s"] = cpu + time.process_time() - t0
    return out
