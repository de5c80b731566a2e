"""An auditor's check of a server's transcript against the parties' statements and keys
held outside it (:func:`verify`): signatures, messages and observations matched both
ways, and each party's sequence numbers and closing statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secagg.attest.identities import public_hex
from secagg.attest.signers import _is_signer
from secagg.attest.statement import (
    SCHEME,
    SCHEME_V1,
    STAGE,
    UNCLOSED,
    UNSIGNED_PHASE,
    Statement,
    attestation_records,
    params_digest,
)
from secagg.attest.told import told_contradiction
from secagg.stages import Stage


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One failed check: the transcript line (1-based) and what is wrong."""

    line: int
    kind: str  # missing | forged | contradicted | key | unverified
    text: str

    def __str__(self) -> str:
        return f"record {self.line}: {self.kind}: {self.text}"


def _same_party(a: Any, b: Any) -> bool:
    return str(a) == str(b)


def _label(st: Statement) -> str:
    return f"round {st.round}, phase {st.phase!r}, stage {st.stage!r}"


def verify(records: list[dict[str, Any]], identities: Mapping[str, Ed25519PublicKey], *,
           scheme: str | None = None,
           closings: dict[int, Statement] | None = None) -> list[Problem]:
    """Check a transcript's records against public keys held outside it.

    Every ``attestation`` record must carry a valid signature by its sender's key in
    ``identities`` on a statement of this run; the header's keys must be those keys. Then
    completeness, both ways: every message a client or the decryptor sent has its
    statement (same round, phase, stage, sender, receiver and digest) and every statement
    its message; every server observation of something a client sent agrees with the
    client's statements of the stage (the same form; for arrays the same digest per
    field, encrypted: the message's digest) and every statement of an upload has its
    observations (each field it names, in the form it left, with its digest).

    Under ``scheme`` :data:`SCHEME` (default: the scheme ``identities`` names, else
    :data:`SCHEME_V1`) every party in ``identities`` must also have signed one closing
    statement, and its statements must be numbered 0 .. n-1 with no gap, no repeat and in
    file order: a party's records removed whole, a message removed with its statement,
    or a statement moved, all fail.

    ``closings``, when given, receives every closing statement whose signature verified
    (line -> statement), so that a caller reading their DP terms
    (:func:`secagg.audit.signed_dp`) need not parse and verify them again.
    """
    scheme = scheme or getattr(identities, "scheme", SCHEME_V1)
    problems: list[Problem] = []
    header_i, header = next(((i, r) for i, r in enumerate(records, 1)
                             if r.get("type") == "run"), (0, {}))
    block = header.get("attestation") if isinstance(header, dict) else None
    if not isinstance(block, dict):
        return [Problem(line=header_i or 1, kind="missing",
                        text="the transcript carries no client attestation")]
    run = block.get("run")
    for party, key in sorted((block.get("keys") or {}).items()):
        want = identities.get(str(party))  # (a party absent from the file: any
        if want is not None and public_hex(want) != key:  # statement of it is refused)
            problems.append(Problem(line=header_i, kind="key", text=(
                f"run header: the key of party {party} is not its key in the identities "
                "file (replaced)")))
    good: dict[tuple[Any, ...], list[Statement]] = {}
    signed: list[tuple[int, Statement]] = []  # (line, statement), in file order
    for i, st, sig, unreadable in attestation_records(records):
        if st is None:
            problems.append(Problem(line=i, kind="forged",
                                    text=f"unreadable statement: {unreadable}"))
            continue
        key = identities.get(str(st.sender))
        if key is None:
            problems.append(Problem(line=i, kind="forged", text=(
                f"statement of {st.sender}, who has no key in the identities file")))
            continue
        try:
            key.verify(sig, st.signed_bytes())
        except InvalidSignature:
            problems.append(Problem(line=i, kind="forged", text=(
                f"the signature of {st.sender}'s statement ({_label(st)}) does not "
                "verify")))
            continue
        if st.run != run:
            problems.append(Problem(line=i, kind="forged", text=(
                f"{st.sender}'s statement is from another run ({st.run})")))
            continue
        if "layer" in header and (told_contradiction(st.params, header["layer"]) or (
                "layer" in st.params and st.params["layer"] != params_digest(header["layer"]))):
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{st.sender} was told other layer parameters than the run header states "
                f"({_label(st)})")))
        signed.append((i, st))
        if st.closing and closings is not None:
            closings[i] = st
        if not st.closing:
            good.setdefault((st.round, st.phase, st.stage, str(st.sender), str(st.receiver)),
                            []).append(st)
    problems += _messages_match(records, good)
    problems += _observations_match(records, good)
    unclosed = {str(r.get("party")): (i, str(r.get("reason", "")))
                for i, r in enumerate(records, 1) if r.get("type") == UNCLOSED}
    problems += _sequences(signed, identities, scheme, unclosed,
                           remote=bool(block.get("announced")))
    problems.sort(key=lambda p: (p.line == 0, p.line))  # records first, then wholes
    return problems


def _messages_match(records: list[dict[str, Any]],
                    good: Mapping[tuple[Any, ...], list[Statement]]) -> list[Problem]:
    """Every message a signer sent has its statement and every statement its message,
    one to one, on (round, phase, stage, sender, receiver, digest)."""
    problems: list[Problem] = []
    # a numbered statement (scheme v2) names its message exactly; an unnumbered one
    # (scheme v1), or one without a phase (a Flower node's advertise ahead of a phase it
    # does not know yet; its number still fixes its place), by sender, receiver and digest
    unmatched: dict[tuple[Any, ...], list[Statement]] = {}
    for k, v in good.items():
        for st in v:
            key = (*k, st.digest) if st.seq is not None and st.phase \
                else (k[3], k[4], st.digest)
            unmatched.setdefault(key, []).append(st)
    for i, r in enumerate(records, 1):
        if r.get("type") != "message" or r.get("stage") == STAGE:
            continue
        if not _is_signer(r.get("sender")) or r.get("receiver") != "server" \
                or str(r.get("stage", "")).startswith(Stage.DROPPED_PREFIX):
            continue
        base = (r.get("round"), r.get("phase"), r.get("stage"), str(r.get("sender")),
                str(r.get("receiver")))
        if "digest" in r:
            pool = unmatched.get((*base, str(r["digest"])), []) or unmatched.get(
                (*base[3:], str(r["digest"])), [])
        else:  # a record without a digest: one statement of the same labels
            pool = next((v for k, v in unmatched.items() if k[:5] == base and v), [])
        if pool:
            pool.pop(0)
            continue
        problems.append(Problem(line=i, kind="missing", text=(
            f"message from {r.get('sender')} to {r.get('receiver')} (round {r.get('round')}, "
            f"phase {r.get('phase')!r}, stage {r.get('stage')!r}) has no signed statement "
            "(of that round, phase, stage and digest)")))
    for v in unmatched.values():
        for st in v:
            problems.append(Problem(line=0, kind="missing", text=(
                f"{st.sender} signed a message ({_label(st)}, digest {st.digest[:12]}...) "
                "that the server's transcript does not record (removed or moved)")))
    return problems


def _observations_match(records: list[dict[str, Any]],
                        good: Mapping[tuple[Any, ...], list[Statement]]) -> list[Problem]:
    """Every server observation of what a signer sent agrees with its statements, and
    every statement of values (clear, noised, encrypted, masked) has its observations."""
    problems: list[Problem] = []
    seen: list[dict[str, Any]] = []
    for i, r in enumerate(records, 1):
        if r.get("type") != "observation" or not _is_signer(r.get("sender")):
            continue
        if r.get("phase") == UNSIGNED_PHASE:
            continue  # a node's evaluation reply is a measurement, not a signed message
        if _same_party(r.get("sender"), r.get("party")):
            continue  # a party's view of its own value
        seen.append(r)
        sts = good.get((r.get("round"), r.get("phase"), r.get("stage"), str(r.get("sender")),
                        "server"), [])
        sts = [s for s in sts if s.form != "protocol"]
        what = (f"{r.get('party')} saw {r.get('form')} {r.get('field')!r} from "
                f"{r.get('sender')} (round {r.get('round')}, phase {r.get('phase')!r}, stage "
                f"{r.get('stage')!r})")
        if not sts:
            problems.append(Problem(line=i, kind="missing", text=(
                f"{what}, but {r.get('sender')} signed no such message")))
            continue
        name = r.get("field")
        same = [s for s in sts if s.form_of(str(name)) == r.get("form")]
        if not same:
            forms = sorted({s.form_of(str(name)) for s in sts})
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}; {r.get('sender')} signed it as sent {'/'.join(forms)}")))
            continue
        if r.get("form") == "encrypted":
            ok = any(s.digest == r.get("digest") for s in same)
        elif r.get("form") in ("clear", "noised"):
            # a field the statement does not name (the flat vector a Flower decryptor
            # returns): bound by the message digest only
            ok = any(s.fields.get(str(name), r.get("digest")) == r.get("digest")
                     for s in same)
        else:
            ok = True  # masked slices: the statement binds the whole MASKED message
        if not ok:
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}: its digest is not the one {r.get('sender')} signed")))
    # the other way: what a signer says it sent, the server's transcript shows it saw
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in seen:
        if r.get("party") != "server":
            continue
        by_key.setdefault((r.get("round"), r.get("phase"), r.get("stage"),
                           str(r.get("sender"))), []).append(r)
    # (an observation that exists but disagrees is reported above as contradicted)
    for k, v in good.items():
        obs = by_key.get(k[:4], [])
        names = {str(o.get("field")) for o in obs}
        for st in v:
            if st.form == "protocol":
                continue
            if st.form in ("masked", "encrypted") or not names & set(st.fields):
                # masked: bound through the whole message; a field the server's record does
                # not name (a Flower decryptor's flat vector): any observation of the message
                if not obs:
                    problems.append(Problem(line=0, kind="missing", text=(
                        f"{st.sender} signed a {st.form} upload ({_label(st)}) that the "
                        "server's transcript never records seeing (deleted: the audit would "
                        "under-report what the server saw)")))
                continue
            for name in sorted(set(st.fields) - names):
                problems.append(Problem(line=0, kind="missing", text=(
                    f"{st.sender} signed {name!r} as sent {st.form_of(name)} ({_label(st)}); "
                    "the server's transcript has no observation of it (deleted: the audit "
                    "would under-report what the server saw)")))
    return problems


def _sequences(signed: list[tuple[int, Statement]], identities: Mapping[str, Any],
               scheme: str, unclosed: Mapping[str, tuple[int, str]] | None = None,
               remote: bool = False) -> list[Problem]:
    """Per-party sequence numbers (scheme :data:`SCHEME`): each party in ``identities``
    closes with one statement whose ``seq`` counts those before it, numbered 0 .. n-1,
    each once, in file order; under :data:`SCHEME_V1`, only the numbers present. A party
    the server records as not answering its closing request (``unclosed``: party ->
    (line, reason)) is a problem too (``unverified``): what it cannot check is named.
    ``remote``: the signers were remote nodes (a gap may be a reply lost in transit, which
    the text then says)."""
    unclosed = unclosed or {}
    problems: list[Problem] = []
    by_party: dict[str, list[tuple[int, Statement]]] = {}
    for i, st in signed:
        by_party.setdefault(str(st.sender), []).append((i, st))
    parties = sorted(set(by_party) | (set(map(str, identities)) if scheme == SCHEME
                                      else set()))
    for party in parties:
        mine = by_party.get(party, [])
        if scheme != SCHEME and all(st.seq is None for _, st in mine):
            continue
        if any(st.seq is None for _, st in mine):
            problems.append(Problem(line=next(i for i, st in mine if st.seq is None),
                                    kind="forged", text=(
                f"party {party}: a statement without a sequence number under scheme "
                f"{scheme}")))
            continue
        closes = [(i, st) for i, st in mine if st.closing]
        if not closes:
            n = 1 + max((st.seq for _, st in mine), default=-1)  # type: ignore[type-var]
            if party in unclosed:
                line, why = unclosed[party]
                problems.append(Problem(line=line, kind="unverified", text=(
                    f"party {party} signed no closing statement; the server records that it "
                    f"did not answer the closing request ({why}). Unverifiable for it: how "
                    f"many statements it signed (so whether any after number {n - 1} were "
                    "removed with their messages) and the DP terms it applied")))
            else:
                problems.append(Problem(line=0, kind="missing", text=(
                    f"party {party} signed no closing statement: "
                    + ("all its records were removed" if not mine else
                       f"its last statements were removed (it has {len(mine)} left)"))))
        else:
            if len(closes) > 1:
                problems.append(Problem(line=closes[1][0], kind="forged", text=(
                    f"party {party}: {len(closes)} closing statements (replayed)")))
            n = int(closes[0][1].seq)  # type: ignore[arg-type]
            if closes[0][1].params.get("statements") != n:
                problems.append(Problem(line=closes[0][0], kind="contradicted", text=(
                    f"party {party}: its closing statement counts "
                    f"{closes[0][1].params.get('statements')} statements at number {n}")))
        counts: dict[int, int] = {}
        for _, st in mine:
            if not st.closing:
                counts[int(st.seq)] = counts.get(int(st.seq), 0) + 1  # type: ignore[arg-type]
        gone = [k for k in range(n) if k not in counts]
        if gone:
            problems.append(Problem(line=0, kind="missing", text=(
                f"party {party}: statements number {_spans(gone)} of its 0-{n - 1} are "
                "missing (its messages were removed with their statements"
                + ("; or, on this remote runtime, replies that reached the server after "
                   "their stage's timeout or not at all: the audit cannot tell those from "
                   "deleted ones" if remote else "") + ")")))
        extra = sorted(k for k, c in counts.items() if c > 1 or k >= n)
        if extra:
            problems.append(Problem(line=0, kind="forged", text=(
                f"party {party}: statements number {_spans(extra)} repeat or lie past its "
                f"closing count {n} (replayed)")))
        last = -1
        for i, st in mine:
            if st.seq is not None and st.seq < last:  # type: ignore[operator]
                problems.append(Problem(line=i, kind="contradicted", text=(
                    f"party {party}: statement number {st.seq} stands after number {last} "
                    "(records moved)")))
                break
            last = max(last, st.seq if st.seq is not None else last)
    return problems


def _spans(nums: list[int]) -> str:
    """``0-3,7`` of sorted ints."""
    out: list[str] = []
    for k in sorted(nums):
        if out and out[-1].endswith(f"-{k - 1}") or out and out[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ",".join(out)
