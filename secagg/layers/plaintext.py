"""The Plaintext layer: the baseline in which the server sees every upload in the clear."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER
from secagg.errors import ProtocolError, UploadError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.link import (
    STEP_REPLY,
    Dropped,
    Link,
    PhaseCall,
    Reply,
    book_drops,
    malformed,
    reply_field,
)
from secagg.messages import ClipReport, Upload, UploadSpec
from secagg.stages import Key, Stage
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
        streamed cohort is never held whole. A client whose upload reads as missing
        (``uploads.get`` returns None: a server driver refused it when read) is left out."""
        live = ctx.dropouts.survivors(Stage.UPLOAD, sorted(uploads))
        sums = {f.name: np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
                for f in spec.additive}
        values: dict[str, dict[int, np.ndarray]] = {f.name: {} for f in spec.non_additive}
        sum_s = 0.0
        contributed = []
        for c in live:
            up = uploads.get(c)  # None: refused when read (a server driver's check)
            if up is None:
                continue
            contributed.append(c)
            t0 = time.process_time()
            wire = pack_arrays({f.name: up[f.name] for f in spec.fields})
            client_s = time.process_time() - t0 + up.cpu_s
            t0 = time.process_time()
            got = unpack_arrays(wire)
            server_s = time.process_time() - t0
            ctx.message(c, SERVER, Stage.UPLOAD, wire_bytes=wire,
                        plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.fields},
                        client_cpu_s=client_s, server_cpu_s=server_s, flops=up.flops,
                        step_flops=up.flops)
            for f in spec.fields:
                ctx.observe(SERVER, c, Stage.UPLOAD, f.name, "clear", got[f.name])
            t0 = time.process_time()
            for f in spec.additive:
                sums[f.name] += got[f.name]
            for f in spec.non_additive:
                values[f.name][c] = got[f.name]
            sum_s += time.process_time() - t0
        ctx.message(SERVER, SERVER, "sum", wire_bytes=0, server_cpu_s=sum_s)
        return Aggregate(ctx.phase, ctx.round, sums, values, tuple(contributed))

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

    #: the embedded engine runs this driver too (over a LocalLink)
    local: ClassVar[bool] = True

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
            link.count(Stage.UPLOAD, len(call.broadcast) * len(call.cohort))
        got, failed = link.exchange(
            Stage.UPLOAD, ctx,
            {c: {Key.STEP: Stage.UPLOAD, **call.instruction} for c in call.cohort},
            needs=STEP_REPLY, step=True)
        dropped: Dropped = {}
        book_drops(link, ctx, Stage.UPLOAD, failed, dropped)
        uploads = _Arrived(got, spec, link, ctx, dropped, call.clips)
        agg = self.layer.aggregate(uploads, spec, ctx)
        uploads.finish()
        agg.notes["dropped"] = dropped
        return agg


class _Arrived(Mapping[int, Upload]):
    """The uploads that arrived at the server, each unpacked and re-checked against the
    spec when the layer reads it (once: a streamed cohort is never held whole). The server
    re-checks with the public per-client bound (the spec's max_records records: a node's
    own count is private), since a node may be hostile; an upload that breaks it, a reply
    without its fields, or one whose reading failed (a lazy link raises ProtocolError) is
    refused: its client is booked as dropped and the entry reads as missing (KeyError).
    :meth:`finish` checks the replies the layer never read (their clip counts and bytes
    are counted as they would have been)."""

    def __init__(self, got: Mapping[int, Reply], spec: UploadSpec, link: Link,
                 ctx: RoundContext, dropped: Dropped, clips: ClipReport) -> None:
        self._got, self._spec, self._link, self._ctx = got, spec, link, ctx
        self._dropped, self._clips = dropped, clips
        self._order = sorted(got)
        self._read: set[int] = set()

    def __contains__(self, c: object) -> bool:
        return c in self._got

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, c: int) -> Upload:
        if c not in self._got or c in self._read:
            raise KeyError(c)
        self._read.add(c)
        up = self._check(c)
        if up is None:
            raise KeyError(c)
        return up

    def _refuse(self, c: int, why: str) -> None:
        book_drops(self._link, self._ctx, Stage.UPLOAD, {c: why}, self._dropped)

    def _check(self, c: int) -> Upload | None:
        spec = self._spec
        try:
            rec = self._got[c]
        except ProtocolError as exc:
            self._refuse(c, f"ProtocolError: {exc}")
            return None
        if (bad := malformed(rec, STEP_REPLY)) is not None:
            self._refuse(c, bad)
            return None
        raw = reply_field(rec, Key.MSG, bytes)
        self._link.count(Stage.UPLOAD, len(raw))
        try:
            up = Upload.validate(spec, unpack_arrays(raw), c, int(spec.max_records or 1),
                                 "raise")
        except (ProtocolError, UploadError) as exc:
            self._refuse(c, f"refused: {exc}")
            return None
        up.cpu_s = reply_field(rec, Key.CPU_S, float)
        up.flops = reply_field(rec, Key.FLOPS, float)
        up.clipped = json.loads(reply_field(rec, Key.CLIPPED, str))
        self._clips.add(up)
        return up

    def finish(self) -> None:
        """Check every reply the layer did not read (see the class docstring)."""
        for c in self._order:
            if c not in self._read:
                self._read.add(c)
                self._check(c)


def upload_on_node(rec: Reply, spec: UploadSpec, up: Upload, client: int, part: Any,
                   out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """The Plaintext layer's client side on a node, after the client step (``out`` holds
    its reply fields, ``cpu`` its CPU seconds): the upload packed as it is, for
    :class:`PlaintextServer`."""
    t0 = time.process_time()
    out[Key.MSG] = pack_arrays({f.name: up[f.name] for f in spec.fields})
    out[Key.CPU_S] = cpu + time.process_time() - t0
    return out
