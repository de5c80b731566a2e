"""The Plaintext layer: the baseline in which the server sees every upload in the clear."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from secagg.costs import SERVER
from secagg.layers.base import Aggregate, Layer, RoundContext
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
