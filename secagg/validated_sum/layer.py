"""The ValidatedSum layer: secure summation that rejects a client whose update breaks its
L2 bound, for the embedded engine.

Trust assumption: two non-colluding aggregators. The server is aggregator A; aggregator B
(``"aggregator-b"`` in ledgers and transcripts) is a separate party, like the homomorphic
layer's decryptor, and its traffic with the server is booked as internal. Each sees only
additive shares of every upload (uniform on its own), the joint coins, and the other's
openings of the proof checks (pass/fail only; :mod:`.proof`). If A and B collude they see
every upload in the clear. Rejecting cheaters (robustness) assumes both aggregators follow
the protocol (one colluding with a client can make it pass); a single actively deviating
aggregator can stop a round, or learn one bit per client by selective failure (as in Prio),
but not read an update.

The layer carries the additive float fields of an upload, concatenated into one vector whose
L2 norm must be at most ``bound`` (a client-level bound); a client whose proof fails is
dropped (listed in ``aggregate.notes["rejected"]``) and the sum is over the rest, exactly.
``cheaters=K`` is an attack switch for demonstrations and tests: the first K live clients of
each cohort skip their clip and scale their update by 100.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER
from secagg.errors import InadmissibleField
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec
from secagg.stages import Stage
from secagg.transcript import digest
from secagg.validated_sum import proof as proofs
from secagg.validated_sum.protocol import run_round

#: the second aggregator's name in ledgers and transcripts
AGGREGATOR_B = "aggregator-b"
#: how much a cheater scales its update
CHEAT_FACTOR = 100.0


class ValidatedSum(Layer):
    """Two-aggregator secure sum with a verified L2 bound per client.

    Args:
        bound: the L2 bound on one client's upload (all additive fields together); None
            (the default): derived each round from the spec, sqrt(sum of the fields'
            declared client-level L2 bounds squared), refusing a field that declares none.
        cheaters: attack switch: the first ``cheaters`` live clients of each cohort skip the
            clip and scale their update by 100 (they are rejected; see module docstring).
    """

    name: ClassVar[str] = "validated-sum"

    def __init__(self, *, bound: float | None = None, cheaters: int = 0) -> None:
        if bound is not None and not (isinstance(bound, (int, float)) and np.isfinite(bound)
                                      and bound > 0):
            raise ValueError(f"bound must be a positive finite number, got {bound!r}")
        if cheaters < 0:
            raise ValueError("cheaters must be >= 0")
        self.bound = None if bound is None else float(bound)
        self.cheaters = int(cheaters)
        self.last_result: Any = None

    def dropout_stages(self) -> tuple[str, ...]:
        """A client can drop before its shares or before its proof."""
        return (Stage.SHARE, Stage.PROOF)

    def check(self, spec: UploadSpec) -> None:
        """Refuse non-additive and integer fields."""
        for f in spec.fields:
            if not f.additive:
                raise InadmissibleField(self.name, f.name,
                                        f.reason or "the validated sum carries sums only")
            if f.is_integer:
                raise InadmissibleField(self.name, f.name, "integer fields are not encoded "
                                        "yet; the L2 bound is a fixed-point bound on floats")
        self.bound_for(spec)

    def bound_for(self, spec: UploadSpec) -> float:
        """The L2 bound a client's upload must meet under ``spec``."""
        if self.bound is not None:
            return self.bound
        total = 0.0
        for f in spec.additive:
            b = f.bound
            if b is None or b.l2 is None or b.adjacency != "client":
                raise InadmissibleField(self.name, f.name, "declares no client-level L2 bound "
                                        "(Bound(l2=..., adjacency='client')); give "
                                        "ValidatedSum(bound=...)")
            total += float(b.l2) ** 2
        return float(np.sqrt(total))

    def describe(self) -> dict[str, Any]:
        """Name, bound, attack switch and the trust assumption."""
        return {"name": self.name, "bound": self.bound, "cheaters": self.cheaters,
                "aggregators": [SERVER, AGGREGATOR_B], "trust": "A and B do not collude"}

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
                  ) -> Aggregate:
        """Run one validated-sum round on the live clients' uploads."""
        self.check(spec)
        fields = list(spec.additive)
        dim = int(sum(int(np.prod(f.shape)) for f in fields))
        params = proofs.Params(dim, self.bound_for(spec))
        cohort = sorted(uploads)
        live = ctx.dropouts.survivors(Stage.SHARE, cohort)
        proved = set(ctx.dropouts.survivors(Stage.PROOF, live))
        dropped = {c: Stage.UPLOAD for c in cohort if c not in live}
        dropped.update({c: Stage.PROOF for c in live if c not in proved})
        vecs = {c: np.concatenate([np.asarray(uploads[c][f.name], dtype=np.float64).ravel()
                                   for f in fields]) for c in cohort}
        cheaters = {c: CHEAT_FACTOR for c in live[:self.cheaters]}
        party = {"A": SERVER, "B": AGGREGATOR_B}

        def book(sender: object, receiver: object, stage: str, msg: bytes,
                 sender_s: float, receiver_s: float) -> None:
            s = party.get(sender, sender)  # type: ignore[call-overload]
            r = party.get(receiver, receiver)  # type: ignore[call-overload]
            client_s = sender_s if isinstance(s, int) else 0.0
            server_s = receiver_s + (0.0 if isinstance(s, int) else sender_s)
            ctx.message(s, r, stage, wire_bytes=msg, client_cpu_s=client_s,
                        server_cpu_s=server_s)
            if isinstance(s, int) and stage == Stage.SHARE:
                sha = digest(msg)  # an additive share of every field: uniform on its own
                for f in fields:
                    ctx.observe(r, s, stage, f.name, "masked", msg, value_digest=sha)

        run_id = ctx.seed.to_bytes(8, "big", signed=True) + os.urandom(8)
        res = run_round(vecs, params, round=ctx.round, run_id=run_id, cheaters=cheaters,
                        dropped=dropped, on_message=book)
        self.last_result = res
        sums: dict[str, np.ndarray] = {}
        off = 0
        for f in fields:
            n = int(np.prod(f.shape))
            sums[f.name] = res.total[off:off + n].reshape(f.shape)
            off += n
        notes = {"rejected": {int(c): str(e) for c, e in res.rejected.items()},
                 "absent": list(res.absent)}
        for f in fields:  # A adds B's share of the sum to its own: the sum over the accepted
            ctx.observe(SERVER, SERVER, Stage.RESULT, f.name, "clear", sums[f.name],
                        what="sum")
        ctx.transcript.verdict(round=ctx.round, phase=ctx.phase, party=SERVER,
                               accepted=res.accepted, rejected=notes["rejected"])
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(res.accepted), notes)
