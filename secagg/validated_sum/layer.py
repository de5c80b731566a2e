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

The layer carries the additive float fields of an upload. Each field is proved against its
own declared client-level L2 bound (one proof per field), or, with ``bound=``, all of them
together against that bound; a field named in ``bits`` is proved to be a centred bit
(exactly +- its bound: adaptive clipping's count). Every proof of every client is decided
before any sum: a client whose proof fails is dropped from every field's sum (listed in
``aggregate.notes["rejected"]`` and in the transcript's ``verdict`` record) and the sums are
over the rest, exactly. Under :class:`~secagg.privacy.CentralDP` each aggregator adds its own
noise to its share of the sum (:meth:`ValidatedSum.noise_in_shares`).
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
from secagg.validated_sum import field as F
from secagg.validated_sum import proof as proofs
from secagg.validated_sum.errors import ClientRejected
from secagg.validated_sum.protocol import run_rounds

#: the second aggregator's name in ledgers and transcripts
AGGREGATOR_B = "aggregator-b"
#: how much a cheater scales its update
CHEAT_FACTOR = 100.0


class ValidatedSum(Layer):
    """Two-aggregator secure sum with a verified L2 bound per client.

    Args:
        bound: the L2 bound on one client's upload (all additive fields together, one
            proof); None (the default): each field is proved against its own declared
            client-level L2 bound (one proof per field), refusing a field that declares none.
        cheaters: attack switch: the first ``cheaters`` live clients of each cohort skip the
            clip and scale their update by 100 (they are rejected; see module docstring).
        bits: fields proved to be a centred bit: shape (1,), value exactly +- the field's
            declared client-level L2 bound (adaptive clipping's count ``unclipped``:
            ``ValidatedSum(bits=("unclipped",))``); each gets its own exact proof.
    """

    name: ClassVar[str] = "validated-sum"
    noises_in_shares: ClassVar[bool] = True
    share_parties: ClassVar[tuple[str, ...]] = (SERVER, AGGREGATOR_B)

    def __init__(self, *, bound: float | None = None, cheaters: int = 0,
                 bits: tuple[str, ...] = ()) -> None:
        if bound is not None and not (isinstance(bound, (int, float)) and np.isfinite(bound)
                                      and bound > 0):
            raise ValueError(f"bound must be a positive finite number, got {bound!r}")
        if cheaters < 0:
            raise ValueError("cheaters must be >= 0")
        self.bound = None if bound is None else float(bound)
        self.cheaters = int(cheaters)
        self.bits = tuple(str(b) for b in bits)
        self.last_result: Any = None
        self._noise: tuple[dict[str, float], dict[str, Any]] | None = None

    def dropout_stages(self) -> tuple[str, ...]:
        """A client can drop before its shares or before its proof."""
        return (Stage.SHARE, Stage.PROOF)

    def check(self, spec: UploadSpec) -> None:
        """Refuse non-additive and integer fields, and a field without the bound it is
        proved against."""
        for f in spec.fields:
            if not f.additive:
                raise InadmissibleField(self.name, f.name,
                                        f.reason or "the validated sum carries sums only")
            if f.is_integer:
                raise InadmissibleField(self.name, f.name, "integer fields are not encoded "
                                        "yet; the L2 bound is a fixed-point bound on floats")
        for name in self.bits:
            f = next((g for g in spec.fields if g.name == name), None)
            if f is not None and tuple(f.shape) != (1,):
                raise InadmissibleField(self.name, name, f"a centred bit has shape (1,), not "
                                        f"{tuple(f.shape)}")
        self.parts(spec)

    def _field_bound(self, f: Any) -> float:
        b = f.bound
        if b is None or b.l2 is None or b.adjacency != "client":
            raise InadmissibleField(self.name, f.name, "declares no client-level L2 bound "
                                    "(Bound(l2=..., adjacency='client')); give "
                                    "ValidatedSum(bound=...)")
        return float(b.l2)

    def parts(self, spec: UploadSpec) -> list[tuple[tuple[Any, ...], proofs.Params]]:
        """The proofs of one upload under ``spec``: (fields, parameters) each. The fields in
        :attr:`bits` each get an exact proof; the others one proof against ``bound``
        together, or (``bound`` None) one per field against its declared bound."""
        fields = list(spec.additive)
        out: list[tuple[tuple[Any, ...], proofs.Params]] = []
        rest = [f for f in fields if f.name not in self.bits]
        for f in fields:
            if f.name in self.bits:
                out.append(((f,), proofs.Params(1, self._field_bound(f), exact=True)))
        if self.bound is not None and rest:
            dim = int(sum(int(np.prod(f.shape)) for f in rest))
            out.insert(0, (tuple(rest), proofs.Params(dim, self.bound)))
        elif rest:
            out[:0] = [((f,), proofs.Params(int(np.prod(f.shape)), self._field_bound(f)))
                       for f in rest]
        return out

    def bound_for(self, spec: UploadSpec) -> float:
        """The L2 bound on a client's whole upload under ``spec`` (what its proofs imply
        together)."""
        return float(np.sqrt(sum(p.bound ** 2 for _, p in self.parts(spec))))

    def describe(self) -> dict[str, Any]:
        """Name, bound, attack switch and the trust assumption."""
        out = {"name": self.name, "bound": self.bound, "cheaters": self.cheaters,
               "aggregators": [SERVER, AGGREGATOR_B], "trust": "A and B do not collude"}
        if self.bits:
            out["bits"] = list(self.bits)
        return out

    def noise_in_shares(self, sigmas: Mapping[str, float], sources: Mapping[str, Any]
                        ) -> None:
        """Have the next :meth:`aggregate`'s aggregators A (:data:`SERVER`) and B
        (:data:`AGGREGATOR_B`) each add N(0, sigma^2) (``sources[party].rng``), rounded in
        fixed point, to their share of each field's sum before the shares meet: the sum A
        reconstructs carries B's noise and A's, so each alone sees a sum noised at least by
        the other's sigma (released: sqrt(2) sigma)."""
        missing = {SERVER, AGGREGATOR_B} - set(sources)
        if missing:
            raise ValueError(f"noise sources missing for {sorted(missing)}")
        self._noise = (dict(sigmas), dict(sources))

    def _noise_of(self, fields: tuple[Any, ...], params: proofs.Params,
                  plan: tuple[dict[str, float], dict[str, Any]]) -> Any:
        sigmas, sources = plan

        def draw(role: int) -> np.ndarray:
            rng = sources[SERVER if role == 0 else AGGREGATOR_B].rng  # N(0, sigma^2)
            parts = [np.rint(rng.normal(0.0, sigmas[f.name] * params.scale,
                                        int(np.prod(f.shape)))) if f.name in sigmas
                     else np.zeros(int(np.prod(f.shape))) for f in fields]
            return F.from_signed(np.concatenate(parts).astype(np.int64))
        return draw

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
                  ) -> Aggregate:
        """Run one validated-sum round on the live clients' uploads."""
        self.check(spec)
        parts = self.parts(spec)
        plan, self._noise = self._noise, None
        cohort = sorted(uploads)
        live = ctx.dropouts.survivors(Stage.SHARE, cohort)
        proved = set(ctx.dropouts.survivors(Stage.PROOF, live))
        dropped = {c: Stage.UPLOAD for c in cohort if c not in live}
        dropped.update({c: Stage.PROOF for c in live if c not in proved})
        vecs = [{c: np.concatenate([np.asarray(uploads[c][f.name], dtype=np.float64).ravel()
                                    for f in fields]) for c in cohort} for fields, _ in parts]
        cheaters = {c: CHEAT_FACTOR for c in live[:self.cheaters]}
        party = {"A": SERVER, "B": AGGREGATOR_B}

        steps = {c: (float(uploads[c].cpu_s), float(uploads[c].flops)) for c in live}

        def booker(fields: tuple[Any, ...]) -> Any:
            def book(sender: object, receiver: object, stage: str, msg: bytes,
                     sender_s: float, receiver_s: float) -> None:
                s = party.get(sender, sender)  # type: ignore[call-overload]
                r = party.get(receiver, receiver)  # type: ignore[call-overload]
                client_s = sender_s if isinstance(s, int) else 0.0
                server_s = receiver_s + (0.0 if isinstance(s, int) else sender_s)
                carried: dict[str, int] = {}
                flops = 0.0
                if isinstance(s, int) and r == SERVER and stage == Stage.SHARE:
                    # the upload's share to A carries its fields (in shares) and, on its
                    # first part, the client step's work (booked once per client)
                    carried = {f.name: f.nbytes for f in fields}
                    step_s, flops = steps.pop(s, (0.0, 0.0))
                    client_s += step_s
                ctx.message(s, r, stage, wire_bytes=msg, client_cpu_s=client_s,
                            server_cpu_s=server_s, plaintext_bytes=sum(carried.values()),
                            fields=carried, flops=flops, step_flops=flops)
                if isinstance(s, int) and stage == Stage.SHARE:
                    sha = digest(msg)  # an additive share of every field: uniform on its own
                    for f in fields:
                        ctx.observe(r, s, stage, f.name, "masked", msg, value_digest=sha)
            return book

        run_id = ctx.seed.to_bytes(8, "big", signed=True) + os.urandom(8)
        results = run_rounds(
            vecs, [p for _, p in parts], round=ctx.round, run_id=run_id,
            cheaters=cheaters, dropped=dropped, on_message=[booker(fs) for fs, _ in parts],
            noise=None if plan is None else [self._noise_of(fs, p, plan) for fs, p in parts])
        self.last_result = results[0] if len(results) == 1 else results
        sums: dict[str, np.ndarray] = {}
        rejected: dict[int, str] = {}
        for (fields, _), res in zip(parts, results):
            off = 0
            for f in fields:
                n = int(np.prod(f.shape))
                sums[f.name] = res.total[off:off + n].reshape(f.shape)
                off += n
            for c, e in res.rejected.items():  # the part that failed names why
                if c not in rejected or type(e) is not ClientRejected:
                    rejected[int(c)] = str(e)
        accepted = results[0].accepted
        notes = {"rejected": rejected, "absent": list(results[0].absent)}
        noised = set() if plan is None else set(plan[0])
        for f in spec.additive:  # A adds B's share of the sum to its own
            ctx.observe(SERVER, SERVER, Stage.RESULT, f.name,
                        "noised" if f.name in noised else "clear", sums[f.name], what="sum")
        ctx.transcript.verdict(round=ctx.round, phase=ctx.phase, party=SERVER,
                               accepted=accepted, rejected=rejected)
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(accepted), notes)
