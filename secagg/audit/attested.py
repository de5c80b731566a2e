"""The audit's checks against what the parties signed, with keys held outside the
transcript: the trust root (:func:`trusted_root`), the DP terms the parties signed
(:func:`signed_dp`), and the audit's own DP figures recomputed from them against the
server's privacy records (:func:`check_privacy`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

#: relative tolerance between the server's epsilon and the audit's own recomputation
_EPS_RTOL = 1e-6


def _close(a: Any, b: Any) -> bool:
    """Whether two recorded epsilons agree (None and infinity compare as themselves)."""
    if a is None or b is None:
        return a is None and b is None
    a, b = float(a), float(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= _EPS_RTOL * max(1.0, abs(b))


def signed_dp(records: list[dict[str, Any]], identities: Mapping[str, Any],
              closings: Mapping[int, Any] | None = None,
              ) -> tuple[dict[str, Any] | None, list[str], list[str], dict[str, Any] | None]:
    """(the DP terms the parties signed in their closing statements, the parties that
    signed one, problems, remote): only statements whose signature verifies under
    ``identities`` count; parties that signed different terms are a problem. Remote nodes
    (Flower) sign the releases they noised themselves beside the terms (``applied``),
    which must agree (:func:`secagg.attest.check_applied`); ``remote`` is then
    ``{"releases_checked": distinct releases the nodes noised}``, else None.
    ``closings``: the closing statements :func:`secagg.attest.verify` already verified
    (line -> statement; the only ones then read), else every record is parsed and checked
    here."""
    from cryptography.exceptions import InvalidSignature

    from secagg.attest import AttestationError, attestation_records, check_applied

    terms: dict[str, Any] | None = None
    first: str | None = None
    signers: list[str] = []
    problems: list[str] = []
    applied: set[tuple[Any, Any]] = set()
    remote = [False]

    def verified() -> Iterator[tuple[int, Any]]:
        if closings is not None:
            yield from sorted(closings.items())
            return
        for i, st, sig, _ in attestation_records(records):
            if st is None:
                continue  # attest.verify reports it
            try:
                key = identities.get(str(st.sender))
                if not st.closing or key is None:
                    continue
                key.verify(sig, st.signed_bytes())
            except (AttestationError, ValueError, InvalidSignature):
                continue  # attest.verify reports it
            yield i, st

    for i, st in verified():
        dp = st.params.get("dp")
        if "applied" in st.params:  # a remote node: the releases it noised itself
            mine = st.params.get("applied")
            wrong = check_applied(dp, mine) if isinstance(mine, list) and all(
                isinstance(a, dict) for a in mine) else ["its list is unreadable"]
            if wrong:
                problems.append(f"record {i}: contradicted: party {st.sender} signed DP terms "
                                "that misdescribe the releases it noised itself: "
                                + "; ".join(wrong))
            applied.update((a.get("round"), a.get("phase")) for a in mine or []
                           if isinstance(a, dict))
            remote[0] = True
        if first is None:
            terms, first = dp, str(st.sender)
        elif dp != terms:
            problems.append(f"record {i}: contradicted: party {st.sender} signed other DP "
                            f"terms than party {first}")
        signers.append(str(st.sender))
    nodes = {"releases_checked": len(applied)} if remote[0] else None
    return terms, signers, problems, nodes


def check_privacy(records: list[dict[str, Any]], identities: Mapping[str, Any],
                  closings: Mapping[int, Any] | None = None,
                  ) -> tuple[dict[str, Any] | None, list[str]]:
    """The audit's own DP figures, recomputed by its own accountant
    (:func:`secagg.attest.recompute_dp`) from the DP terms the parties signed, and every
    server-written ``privacy`` record that disagrees with them (epsilon, delta, private)
    as a problem. (None, []) when no party signed a closing statement (scheme v1): the
    DP figures are then the server's word, and the report says so."""
    from secagg.attest import AttestationError, recompute_dp

    terms, signers, problems, remote = signed_dp(records, identities, closings)
    if not signers:
        return None, problems
    nodes = {} if remote is None else {"remote": remote}
    claims = [(i, r) for i, r in enumerate(records, 1) if r.get("type") == "privacy"]
    if terms is None:
        for i, r in claims:
            if r.get("epsilon") is not None and r.get("private") is not False \
                    and not math.isinf(float(r["epsilon"])):
                problems.append(f"record {i}: contradicted: the server's privacy record "
                                f"claims eps={r['epsilon']:.4g}, but no party signed any DP "
                                "terms (no DP noise was applied)")
        return {"signers": len(signers), "events": 0, "epsilon": None, "fields": {},
                **nodes}, problems
    try:
        led = recompute_dp(terms)
    except AttestationError as exc:
        return None, [*problems, f"record 0: contradicted: {exc}"]
    delta = led.delta
    total = None if delta is None else led.epsilon()
    fields = {f: led.field_guarantee(f) for f in led.fields}
    for i, r in claims:
        f = r.get("field")
        mine = {"epsilon": total, "private": led.private} if not f else fields.get(f)
        if mine is None:
            if r.get("epsilon") is not None and not math.isinf(float(r["epsilon"])):
                problems.append(f"record {i}: contradicted: the server's privacy record "
                                f"claims eps={r['epsilon']:.4g} for {f!r}, a field no signed "
                                "DP release covers")
            continue
        what = "in total" if not f else f"for {f!r}"
        if r.get("delta") != delta:
            problems.append(f"record {i}: contradicted: the server's privacy record states "
                            f"delta={r.get('delta')} {what}; the parties signed delta={delta}")
        if not _close(r.get("epsilon"), mine["epsilon"]):
            problems.append(
                f"record {i}: contradicted: the server's privacy record claims eps="
                f"{r.get('epsilon')} {what}; this audit's accountant, from the DP terms "
                f"{len(signers)} parties signed, gives eps={mine['epsilon']}")
        if bool(r.get("private", True)) and not mine["private"]:
            problems.append(f"record {i}: contradicted: the server's privacy record calls "
                            f"the release private {what}; the signed terms say it is not: "
                            f"{mine.get('reason') or '; '.join(led.not_private_reasons)}")
    return {"signers": len(signers), "events": len(led.events), "delta": delta,
            "epsilon": total, "private": led.private,
            "not_private_reasons": list(led.not_private_reasons),
            "fields": {f: g["epsilon"] for f, g in fields.items()}, **nodes}, problems


def trusted_root(identities: Mapping[str, Any], transcript_path: Path | None
                 ) -> tuple[dict[str, Any], list[str]]:
    """What the audit trusts (the identities file, its scheme and parties) and, as a
    problem, an identities file inside the transcript's own folder: the server writes that
    folder, so a file there is the server's word, not a trust root."""
    from secagg.attest import SCHEME

    path = getattr(identities, "path", None)
    scheme = getattr(identities, "scheme", None)
    info: dict[str, Any] = {"identities": None if path is None else str(path),
                            "scheme": scheme, "parties": sorted(map(str, identities)),
                            "sequenced": scheme == SCHEME}
    problems = []
    if path is not None and transcript_path is not None:
        run_dir = Path(transcript_path).resolve().parent
        if run_dir == Path(path).resolve().parent or run_dir in Path(path).resolve().parents:
            problems.append(f"record 0: key: the identities file {path} lies in the run folder "
                            f"{run_dir}, which the server writes: it is the server's word, "
                            "not a trust root (use the key directory the clients published, "
                            "e.g. <run folder>.keys/identities.json, or your PKI's keys)")
    return info, problems
