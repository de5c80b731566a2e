"""One round of the validated sum in one process: clients and both aggregators driven over
in-memory messages (the parties stay byte-in/byte-out, so a transport-backed driver can
replace this one message for message).

``tamper(client, kind, (to_a, to_b)) -> (to_a, to_b)`` lets tests play a network or client
attacker on any client message pair; ``randbytes`` (default ``secrets.token_bytes``) is the clients'
seed source; ``dropped`` maps a client to the step it does not finish
(``"upload"``: never uploads; ``"proof"``: uploads, then disappears).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from secagg.stages import Stage
from secagg.validated_sum import proof as proofs
from secagg.validated_sum import wire as W
from secagg.validated_sum.aggregator import ALL_CHECKS, Aggregator
from secagg.validated_sum.client import Client
from secagg.validated_sum.errors import ClientRejected

Tamper = Callable[[int, int, tuple[bytes, bytes]], tuple[bytes, bytes]]
#: ``on_message(sender, receiver, stage, msg, sender_cpu_s, receiver_cpu_s)``; parties are
#: client ids and the aggregators' names ``"A"`` and ``"B"``
OnMessage = Callable[[object, object, str, bytes, float, float], None]
AGGREGATORS = ("A", "B")


def _quiet(*_: object) -> None:
    return None


@dataclass
class RoundResult:
    """What one round produced.

    Attributes:
        total: the decoded sum over :attr:`accepted` (float64).
        total_field: the same sum as field elements.
        accepted: the clients in the sum.
        rejected: client -> the typed error that excluded it.
        absent: clients that did not finish (no error: simply not in the sum).
        upload_bytes: client -> (bytes to A, bytes to B).
        client_s: client -> seconds of its own work.
        aggregator_s: (A's seconds, B's seconds) for the whole round.
    """

    total: np.ndarray
    total_field: np.ndarray
    accepted: tuple[int, ...]
    rejected: dict[int, ClientRejected]
    absent: tuple[int, ...]
    upload_bytes: dict[int, tuple[int, int]] = field(default_factory=dict)
    client_s: dict[int, float] = field(default_factory=dict)
    aggregator_s: tuple[float, float] = (0.0, 0.0)


def _coin(aggs: tuple[Aggregator, Aggregator], timer: list[float], book: OnMessage,
          stage: str) -> None:
    secs = [0.0, 0.0]
    msgs: list[list[bytes]] = [[], []]
    for step in ("coin_commit", "coin_open"):
        for role in (0, 1):
            t0 = time.process_time()
            msgs[role].append(getattr(aggs[role], step)())
            secs[role] += time.process_time() - t0
    for role in (0, 1):
        t0 = time.process_time()
        aggs[role].coin_finish(*msgs[1 - role])
        secs[role] += time.process_time() - t0
    for role in (0, 1):
        timer[role] += secs[role]
        for m in msgs[role]:
            book(AGGREGATORS[role], AGGREGATORS[1 - role], stage, m, secs[role] / 2, 0.0)


def run_round(
    updates: Mapping[int, np.ndarray],
    params: proofs.Params,
    *,
    round: int = 0,
    run_id: bytes | None = None,
    cheaters: Mapping[int, float] | None = None,
    dropped: Mapping[int, str] | None = None,
    tamper: Tamper | None = None,
    checks: frozenset[str] = ALL_CHECKS,
    randbytes: Callable[[int], bytes] | None = None,
    on_message: OnMessage | None = None,
    noise: Callable[[int], np.ndarray] | None = None,
) -> RoundResult:
    """Run one round: ``updates`` (client -> float vector of length ``params.dim``);
    ``cheaters`` (client -> factor): those clients skip the clip and scale their update;
    ``noise(role)``: aggregator ``role``'s own noise (field elements of length ``params.dim``),
    added to its share of the sum before the shares meet (CentralDP in shares).
    BLAS runs on one thread: the proofs' matrix products are small, and threads only
    contend for the cores."""
    return run_rounds([updates], [params], round=round, run_id=run_id, cheaters=cheaters,
                      dropped=dropped, tamper=tamper, checks=checks, randbytes=randbytes,
                      on_message=on_message, noise=None if noise is None else [noise])[0]


def run_rounds(
    updates: Sequence[Mapping[int, np.ndarray]],
    params: Sequence[proofs.Params],
    *,
    round: int = 0,
    run_id: bytes | None = None,
    cheaters: Mapping[int, float] | None = None,
    dropped: Mapping[int, str] | None = None,
    tamper: Tamper | None = None,
    checks: frozenset[str] = ALL_CHECKS,
    randbytes: Callable[[int], bytes] | None = None,
    on_message: OnMessage | Sequence[OnMessage] | None = None,
    noise: Sequence[Callable[[int], np.ndarray]] | None = None,
) -> list[RoundResult]:
    """One round over several parts of each client's upload, each with its own proof and
    bound (``updates[k]``, ``params[k]``: e.g. one per field, each field's own L2 bound, or a
    field proved to be a centred bit): every part is verified first, then each part's sum
    is over the clients whose every part passed (a client failing one part is rejected from
    all). ``on_message``: one callback, or one per part. Returns one result per part."""
    if len(updates) != len(params) or (noise is not None and len(noise) != len(params)):
        raise ValueError("one params (and one noise) per part")
    books = (list(on_message) if isinstance(on_message, Sequence)
             else [on_message or _quiet] * len(params))
    run_id = run_id if run_id is not None else os.urandom(16)
    with threadpool_limits(limits=1, user_api="blas"):
        states = [_decide(u, p, round, run_id, dict(cheaters or {}), dict(dropped or {}),
                          tamper, checks, randbytes or secrets.token_bytes,
                          books[k], k) for k, (u, p) in enumerate(zip(updates, params))]
        keep = set.intersection(*(set(st.aggs[0].accepted) for st in states)) if states else set()
        return [_finish(st, keep, None if noise is None else noise[k])
                for k, st in enumerate(states)]


@dataclass
class _Decided:
    """One part's round after both aggregators decided every client, before the sum."""

    aggs: tuple[Aggregator, Aggregator]
    params: proofs.Params
    clients: tuple[int, ...]
    agg_s: list[float]
    client_s: dict[int, float]
    up_bytes: dict[int, tuple[int, int]]
    book: OnMessage


def _decide(updates: Mapping[int, np.ndarray], params: proofs.Params, round: int,
            run_id: bytes, cheaters: dict[int, float], dropped: dict[int, str],
            tamper: Tamper | None, checks: frozenset[str],
            randbytes: Callable[[int], bytes], book: OnMessage, part: int) -> _Decided:
    # a part after the first is bound to its own run id (its shares and coins are its own)
    rid = run_id if part == 0 else hashlib.sha256(run_id + part.to_bytes(4, "big")
                                                  ).digest()[:16]
    aggs = (Aggregator(0, params, rid, round, checks=checks),
            Aggregator(1, params, rid, round, checks=checks))
    agg_s = [0.0, 0.0]
    clients = {c: Client(c, params, rid, round, honest=c not in cheaters,
                         scale_by=cheaters.get(c, 1.0), randbytes=randbytes) for c in updates}
    client_s = dict.fromkeys(clients, 0.0)
    up_bytes = {c: (0, 0) for c in clients}

    def deliver(c: int, kind: int, msgs: tuple[bytes, bytes], step: str, stage: str,
                sent_s: float) -> None:
        if tamper is not None:
            msgs = tamper(c, kind, msgs)
        for role in (0, 1):
            msg = msgs[role]
            up_bytes[c] = tuple(up_bytes[c][i] + (len(msg) if i == role else 0)
                                for i in (0, 1))  # type: ignore[assignment]
            t0 = time.process_time()
            try:
                getattr(aggs[role], step)(c, msg)
            except ClientRejected:
                pass  # recorded in aggs[role].rejected
            finally:
                spent = time.process_time() - t0
                agg_s[role] += spent
                book(c, AGGREGATORS[role], stage, msg, sent_s / 2, spent)

    for c, cl in clients.items():
        if dropped.get(c) == Stage.UPLOAD:
            continue
        t0 = time.process_time()
        msgs = cl.upload(updates[c])
        spent = time.process_time() - t0
        client_s[c] += spent
        deliver(c, W.SHARE_X, msgs, "receive_upload", Stage.SHARE, spent)
    _coin(aggs, agg_s, book, "coin-wrap")
    live = set(aggs[0].live) & set(aggs[1].live)
    for c in sorted(live):
        if dropped.get(c) == Stage.PROOF:
            continue
        chal = []
        for role in (0, 1):
            t0 = time.process_time()
            chal.append(aggs[role].challenge(c))
            spent = time.process_time() - t0
            agg_s[role] += spent
            book(AGGREGATORS[role], c, "challenge", chal[role], spent, 0.0)
        t0 = time.process_time()
        msgs = clients[c].respond(*chal)
        spent = time.process_time() - t0
        client_s[c] += spent
        deliver(c, W.SHARE_PROOF, msgs, "receive_proof", Stage.PROOF, spent)
    _coin(aggs, agg_s, book, "coin-check")
    checks_msgs = []
    for role in (0, 1):
        t0 = time.process_time()
        checks_msgs.append(aggs[role].check_message())
        agg_s[role] += time.process_time() - t0
    for role in (0, 1):
        t0 = time.process_time()
        aggs[role].receive_check(checks_msgs[1 - role])
        spent = time.process_time() - t0
        agg_s[role] += spent
        book(AGGREGATORS[1 - role], AGGREGATORS[role], Stage.CHECK, checks_msgs[1 - role], 0.0,
             spent)
    return _Decided(aggs, params, tuple(clients), agg_s, client_s, up_bytes, book)


def _finish(st: _Decided, keep: set[int], noise: Callable[[int], np.ndarray] | None
            ) -> RoundResult:
    aggs, agg_s, book, params = st.aggs, st.agg_s, st.book, st.params
    for agg in aggs:
        agg.keep_only(keep, "another part of its upload failed its check")
        if noise is not None:
            t0 = time.process_time()
            agg.add_noise(noise(agg.role))
            agg_s[agg.role] += time.process_time() - t0
    t0 = time.process_time()
    sum_msg = aggs[1].sum_message()
    spent_b = time.process_time() - t0
    t0 = time.process_time()
    total_field = aggs[0].finish(sum_msg)
    spent_a = time.process_time() - t0
    agg_s[0] += spent_a
    agg_s[1] += spent_b
    book("B", "A", "sum", sum_msg, spent_b, spent_a)
    rejected = dict(aggs[0].rejected)
    for c, err in aggs[1].rejected.items():  # the aggregator that saw the fault names it
        if c not in rejected or type(rejected[c]) is ClientRejected:
            rejected[c] = err
    accepted = aggs[0].accepted
    absent = tuple(sorted(c for c in st.clients if c not in accepted and c not in rejected))
    return RoundResult(
        total=proofs.decode(total_field, params), total_field=total_field,
        accepted=accepted, rejected=rejected, absent=absent, upload_bytes=st.up_bytes,
        client_s=st.client_s, aggregator_s=(agg_s[0], agg_s[1]),
    )
