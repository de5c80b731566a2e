"""Audit a transcript: per phase and field, who sent what, what each party saw, under which
DP guarantee, and what the traffic cost.

:func:`audit` condenses a :class:`~secagg.transcript.Transcript` into

* ``complete``: whether the transcript's closing record matches its body (a truncated or
  altered transcript is reported as incomplete, with the reason);
* ``traffic``: messages and framed wire bytes per direction (``up``, ``down``,
  ``internal``) and per (phase, direction), from the transcript's ``message`` records --
  the same figures, by construction, as the run's ``costs.csv``;
* ``fields``: one entry per (phase, field): the clients that sent it, the form in which
  each party saw it (``server: masked upload x20, noised sum x2``), the bytes of the field
  as uploaded, the DP guarantee (mechanism, noise, adjacency, epsilon at delta, or why there
  is none) and notes;
* ``privacy``: the transcript's privacy records;
* ``attestation``: with public keys held outside the transcript (``identities``), every
  problem :func:`secagg.attest.verify` finds (missing, forged or contradicted statements,
  replaced keys), each naming its record; without them, None: the transcript is then
  *unattested* -- whatever it says was written by the server and only checked for
  accidental damage.

:func:`format_audit` prints it as text.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from secagg.costs import DIRECTIONS, SERVER
from secagg.transcript import Transcript

#: Suffix DistributedDP gives the secure-sum label of its noised ring vector.
_NOISED_SUFFIX = " (dp-noised)"


def _ranges(ids: list[int]) -> str:
    """Compress sorted ints into ``0-3,7,9-10``."""
    if not ids:
        return "-"
    out, start, prev = [], ids[0], ids[0]
    for i in ids[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def _components(label: str) -> tuple[str, list[str]]:
    """The audit row name of an observed label and the upload fields it carries
    (``"a+b (dp-noised)"`` -> ``("a+b", ["a", "b"])``)."""
    name = label.removesuffix(_NOISED_SUFFIX)
    return name, name.split("+") if label.endswith(_NOISED_SUFFIX) else [name]


def _dp_layers(desc: Any) -> list[dict[str, Any]]:
    """The DP layer descriptions inside a (possibly nested) layer description."""
    out: list[dict[str, Any]] = []
    if isinstance(desc, dict):
        if "noise_multiplier" in desc or str(desc.get("name", "")).endswith("-dp"):
            out.append(desc)
        for v in desc.values():
            out.extend(_dp_layers(v))
    elif isinstance(desc, list | tuple):
        for v in desc:
            out.extend(_dp_layers(v))
    return out


def traffic(transcript: Transcript) -> dict[str, Any]:
    """Messages and framed wire bytes per direction and per (phase, direction), from the
    transcript's ``message`` records."""
    total = {d: {"messages": 0, "bytes": 0} for d in DIRECTIONS}
    by_phase: dict[tuple[str, str], dict[str, int]] = {}
    for r in transcript.records:
        if r.get("type") != "message":
            continue
        d = r["direction"]
        total.setdefault(d, {"messages": 0, "bytes": 0})
        total[d]["messages"] += 1
        total[d]["bytes"] += int(r["bytes"])
        e = by_phase.setdefault((r["phase"], d), {"messages": 0, "bytes": 0})
        e["messages"] += 1
        e["bytes"] += int(r["bytes"])
    return {"total": total,
            "by_phase": [{"phase": p, "direction": d, **v} for (p, d), v in by_phase.items()]}


def reconcile(report: dict[str, Any], costs_csv: str | Path) -> dict[str, Any]:
    """Compare the audit's per-direction bytes with a ``costs.csv``: returns
    ``{direction: {"audit": bytes, "costs": bytes}}`` and ``"match": bool``."""
    costs: dict[str, int] = defaultdict(int)
    with Path(costs_csv).open() as fh:
        for row in csv.DictReader(fh):
            costs[row["direction"]] += int(row["wire_bytes"])
    out: dict[str, Any] = {}
    match = True
    for d in sorted(set(costs) | set(report["traffic"]["total"])):
        a = report["traffic"]["total"].get(d, {}).get("bytes", 0)
        out[d] = {"audit": a, "costs": costs.get(d, 0)}
        match = match and a == costs.get(d, 0)
    out["match"] = match
    return out


def _guarantee(names: list[str], saw: Counter, privacy: dict[str, list[dict[str, Any]]],
               totals: list[dict[str, Any]], dp_desc: list[dict[str, Any]]) -> dict[str, Any]:
    """The DP guarantee of a row: ``private`` (bool), ``text`` and the parameters."""
    recs = [p for n in names for p in privacy.get(n, [])]
    public = [p for p in recs if p.get("public")]
    if public:
        return {"private": False,
                "text": "no: declared public, released without DP noise"}
    acct = [p for p in recs if "epsilon" in p]
    noised = any(k.startswith("noised") for k in saw)
    if not acct:
        reasons = [r for t in totals for r in t.get("not_private_reasons", [])]
        mine = [r for r in reasons if any(repr(n) in r for n in names)]
        if mine:
            return {"private": False, "text": f"no: {mine[0]}"}
        if noised:
            return {"private": False, "text": "no: noised, but no guarantee was recorded"}
        return {"private": False, "text": "none (no DP layer noised this field)"}
    p = acct[-1]
    if p.get("private") is False:
        why = p.get("reason") or next(
            (r for t in totals for r in t.get("not_private_reasons", [])), "guarantee broken")
        return {"private": False, "text": f"no: {why}", "epsilon": p.get("epsilon"),
                "delta": p.get("delta")}
    if not noised and not any("masked" in k or "encrypted" in k for k in saw):
        return {"private": False, "text": "no: released un-noised (the server saw it in "
                "the clear)"}
    d = dp_desc[0] if dp_desc else {}
    mech = p.get("mechanism") or d.get("mechanism") or "gaussian"
    adjacency = p.get("adjacency") or d.get("adjacency") or "?"
    if p.get("sigma") is not None:
        noise = f"sigma={p['sigma']:.4g}"
    elif d.get("noise_multiplier") is not None:
        noise = f"noise multiplier z={d['noise_multiplier']:.4g} (sigma = z x sensitivity)"
    else:
        noise = "noise ?"
    eps, delta = float(p["epsilon"]), float(p.get("delta") or 0.0)
    layer = f"{d['name']}, " if d.get("name") else ""
    return {"private": True, "mechanism": mech, "adjacency": adjacency, "epsilon": eps,
            "delta": delta, "accountant": p.get("accountant"),
            "text": f"{layer}{mech}, {noise}, {adjacency}-level, "
                    f"eps={eps:.4g} at delta={delta:.2g}"
                    + (f" ({p['accountant']})" if p.get("accountant") else "")}


#: What a transcript checked only by its running digest guarantees (the audit's first line).
UNATTESTED = ("transcript: UNATTESTED - checked without the clients' keys (--identities): "
              "the server wrote every record below and could have rewritten any of them with "
              "its digest; this audit detects accidental truncation or corruption only")


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

    from secagg.attest import AttestationError, Statement, check_applied

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
        for i, r in enumerate(records, 1):
            if r.get("type") != "attestation":
                continue
            try:
                st = Statement.from_json(r.get("statement") or {})
                sig = bytes.fromhex(str(r.get("signature", "")))
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


def audit(transcript: Transcript, identities: Mapping[str, Any] | None = None, *,
          transcript_path: str | Path | None = None) -> dict[str, Any]:
    """Summarise a transcript. Returns a JSON-able dict: ``run`` (the header),
    ``complete`` and ``incomplete_reason``, ``end`` (the closing record), ``traffic``,
    ``fields`` (one entry per (phase, field)), ``privacy`` (the records) and
    ``attestation`` (with ``identities``, party -> Ed25519 public key from outside the
    transcript: the problems found, as text, each naming its record; else None), and with
    ``identities`` also ``trusted`` (:func:`trusted_root`; ``transcript_path``: where the
    transcript was read, to refuse keys from its own folder) and ``dp_recomputed``
    (:func:`check_privacy`: the DP figures of the audit's own accountant from the signed
    terms, whose disagreements with the server's privacy records are attestation
    problems)."""
    header = next((r for r in transcript.records if r.get("type") == "run"), {})
    end = next((r for r in transcript.records if r.get("type") == "end"), None)
    reason = transcript.check()
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    senders: dict[tuple[str, str], set[int]] = defaultdict(set)
    rounds: dict[tuple[str, str], set[int]] = defaultdict(set)
    comps: dict[tuple[str, str], list[str]] = {}
    for r in transcript.observations():
        name, names = _components(r["field"])
        key = (r["phase"], name)
        comps.setdefault(key, names)
        e = entries.setdefault(key, {
            "phase": r["phase"], "field": name, "server_saw": Counter(),
            "others_saw": defaultdict(Counter), "bytes_uploaded": 0, "bytes_to_server": 0,
            "clear_individual_uploads": 0, "noise_share_in_uploads": False,
        })
        rounds[key].add(r["round"])
        label = f"{r['form']} {r['what']}"
        if isinstance(r["sender"], int) and r["what"] == "upload":
            senders[key].add(r["sender"])
            e["bytes_uploaded"] += int(r["bytes"])
            if r["field"].endswith(_NOISED_SUFFIX):
                e["noise_share_in_uploads"] = True
        if r["party"] == SERVER:
            e["server_saw"][label] += 1
            e["bytes_to_server"] += int(r["bytes"])
            if r["form"] == "clear" and r["what"] == "upload":
                e["clear_individual_uploads"] += 1
        else:
            e["others_saw"][str(r["party"])][label] += 1
    privacy = [r for r in transcript.records if r.get("type") == "privacy"]
    per_field: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in privacy:
        if p.get("field"):
            per_field[p["field"]].append(p)
    totals = [p for p in privacy if not p.get("field")]
    dp_desc = _dp_layers(header.get("layer", {}))
    out = []
    for key, e in entries.items():
        names = comps[key]
        e["components"] = names
        e["senders"] = sorted(senders[key])
        e["rounds"] = len(rounds[key])
        e["server_saw"] = dict(e["server_saw"])
        e["others_saw"] = {k: dict(v) for k, v in e["others_saw"].items()}
        e["dp"] = _guarantee(names, Counter(e["server_saw"]), per_field, totals, dp_desc)
        notes = []
        if e["clear_individual_uploads"] and e["dp"].get("private"):
            notes.append("the DP guarantee covers only what is released after the noise; "
                         "the aggregator read the uploads in the clear")
        if e["noise_share_in_uploads"]:
            notes.append("each upload carries the client's share of the DP noise, then is "
                         "masked; the server sees only the noised sum")
        if not e["senders"]:
            src = [k[1] for k in entries if k[0] == key[0] and key[1] in comps[k]
                   and k != key and senders[k]]
            notes.append("no client sent this directly: it is the server's result"
                         + (f" of {', '.join(repr(s) for s in src)}" if src else ""))
        e["notes"] = notes
        out.append(e)
    attestation = None
    extra: dict[str, Any] = {}
    if identities is not None:
        from secagg.attest import verify

        trusted, root = trusted_root(identities, None if transcript_path is None
                                     else Path(transcript_path))
        closings: dict[int, Any] = {}
        found = [str(p) for p in verify(transcript.records, identities, closings=closings)]
        dp, wrong = check_privacy(transcript.records, identities, closings)
        attestation = [*root, *found, *wrong]
        extra = {"trusted": trusted, "dp_recomputed": dp}
    return {"run": header, "complete": reason is None, "incomplete_reason": reason,
            "end": end, "traffic": traffic(transcript), "fields": out, "privacy": privacy,
            "attestation": attestation, **extra}


def _layer_text(desc: dict[str, Any]) -> str:
    """``name(k=v, ...)`` of a layer description, nested layers inline."""
    if not isinstance(desc, dict):
        return str(desc)
    params = []
    for k, v in desc.items():
        if k == "name" or v is None or v == [] or v == {}:
            continue
        if isinstance(v, dict) and "name" in v:
            params.append(f"{k}={_layer_text(v)}")
        elif isinstance(v, dict):
            params.append(f"{k}={{" + ", ".join(f"{a}: {_layer_text(b)}"
                                              for a, b in v.items()) + "}")
        elif isinstance(v, float):
            params.append(f"{k}={v:.4g}")
        elif isinstance(v, list):
            params.append(f"{k}=[{', '.join(str(x) for x in v)}]")
        else:
            params.append(f"{k}={v}")
    return f"{desc.get('name', '?')}({', '.join(params)})"


def _trusted_lines(report: dict[str, Any]) -> list[str]:
    """The lines saying what an attested audit trusted (the keys and where they came
    from)."""
    t = report.get("trusted")
    if not t:
        return []
    where = t.get("identities") or "keys given in memory"
    return [f"trusted: the public keys in {where} ({len(t['parties'])} parties: "
            f"{', '.join(t['parties'][:8])}{', ...' if len(t['parties']) > 8 else ''}; "
            f"scheme {t.get('scheme')}), held outside the transcript; nothing the server "
            "wrote is taken on its word where a signed statement covers it"]


def _saw_text(saw: dict[str, int]) -> str:
    return ", ".join(f"{form} x{n}" for form, n in sorted(saw.items())) or "nothing"


def format_audit(report: dict[str, Any]) -> str:
    """The audit as text: completeness, the run, traffic per direction, then one block
    per (phase, field)."""
    run = report.get("run", {})
    lines = []
    att = report.get("attestation")
    if att is None:
        lines.append(UNATTESTED)
    elif att:
        unverified = sum(1 for p in att if ": unverified: " in p)
        lines.append(f"attestation: FAILED - {len(att)} record(s) contradict, lack or forge "
                     "the clients' signed statements"
                     + (f" ({unverified} of them: a party whose statements cannot be checked "
                        "to the end)" if unverified else "") + ":")
        lines.extend(f"  {p}" for p in att[:20])
        if len(att) > 20:
            lines.append(f"  ... and {len(att) - 20} more")
    elif (report.get("trusted") or {}).get("sequenced", True):
        lines.append("attestation: verified - every message the clients sent carries their "
                     "signed statement, and every server record of it agrees (form, digest); "
                     "every party's numbered statements are all there, each matched by the "
                     "server's records both ways")
    else:
        lines.append("attestation: verified (scheme v1: partial) - every message the server "
                     "recorded carries its sender's signed statement and agrees with it; the "
                     "statements are not numbered, so a party's records removed whole, or a "
                     "message removed with its statement, would not show")
    lines.extend(_trusted_lines(report))
    if report.get("complete"):
        end = report.get("end") or {}
        stopped = f"; stopped early: {end['stopped']}" if end.get("stopped") else ""
        lines.append(f"transcript: complete ({end.get('records', '?')} records, "
                     f"{end.get('rounds_completed', '?')} rounds, digest verified{stopped})")
    else:
        lines.append(f"transcript: INCOMPLETE - {report.get('incomplete_reason')}; the "
                     "figures below cover only what the file holds")
    if run:
        alg = run.get("algorithm", {})
        lines.append(f"algorithm : {_layer_text(alg)}")
        lines.append(f"layer     : {_layer_text(run.get('layer', {}))}")
        lines.append(f"run       : seed={run.get('seed')} rounds={run.get('rounds')} "
                     f"clients={run.get('clients')} fraction={run.get('fraction')}")
    t = report["traffic"]["total"]
    lines.append("\ntraffic (framed wire bytes; the same definition as costs.csv):")
    for d in DIRECTIONS:
        if d in t:
            what = {"up": "clients -> server/decryptor", "down": "to clients",
                    "internal": "between non-client parties (server, decryptor)"}[d]
            lines.append(f"  {d:<9}{t[d]['messages']:>8,} messages {t[d]['bytes']:>14,} B"
                         f"   {what}")
    rec = report.get("reconcile")
    if rec is not None:
        lines.append("  costs.csv: " + ("matches, per direction" if rec["match"] else
                     "DOES NOT MATCH: " + ", ".join(
                         f"{d} audit {v['audit']:,} vs costs {v['costs']:,}"
                         for d, v in rec.items() if d != "match")))
    for e in report["fields"]:
        lines.append(f"\nphase {e['phase']!r}  field {e['field']!r}")
        if e["senders"]:
            lines.append(f"  senders      : {len(e['senders'])} clients "
                         f"({_ranges(e['senders'])}) over {e['rounds']} rounds")
        else:
            lines.append(f"  senders      : none (over {e['rounds']} rounds)")
        lines.append(f"  server saw   : {_saw_text(e['server_saw'])}")
        for party, saw in sorted(e["others_saw"].items()):
            lines.append(f"  {party + ' saw':<13}: {_saw_text(saw)}")
        verdict = ("YES - the server read individual uploads in the clear"
                   if e["clear_individual_uploads"] else "no")
        lines.append(f"  clear uploads: {verdict}")
        lines.append(f"  bytes        : {e['bytes_uploaded']:,} uploaded by clients, "
                     f"{e['bytes_to_server']:,} seen by the server in all")
        lines.append(f"  DP guarantee : {e['dp']['text']}")
        for n in e["notes"]:
            lines.append(f"  note         : {n}")
    totals = [p for p in report.get("privacy", []) if not p.get("field")]
    dp = report.get("dp_recomputed")
    if dp and dp.get("epsilon") is not None:
        lines.append(f"\ntotal DP guarantee (recomputed by this audit's accountant from the "
                     f"DP terms {dp['signers']} parties signed): eps={dp['epsilon']:.4g} at "
                     f"delta={dp['delta']:.2g} over {dp['events']} releases"
                     + ("" if dp.get("private") else " - NOT private: "
                        + "; ".join(dp.get("not_private_reasons", []))))
        if dp.get("remote") is not None:
            lines.append(
                f"  (remote nodes: each signed these terms at the end of the run after checking "
                f"them against the releases it noised itself, {dp['remote']['releases_checked']}"
                " in all; noise the server adds itself (CentralDP) is described as the server "
                "stated it then, which no node can check)")
    elif dp:
        lines.append(f"\nDP: no party signed any DP terms ({dp['signers']} closing "
                     "statements): no DP guarantee")
    elif report.get("attestation") is not None and totals:
        lines.append("\nDP: the figures below are the server's word (no party signed DP "
                     "terms under this scheme)")
    if totals:
        p = totals[-1]
        if p.get("private") is False:
            reasons = "; ".join(p.get("not_private_reasons", [])) or "guarantee broken"
            lines.append(f"\ntotal DP guarantee: no: {reasons}")
        elif "epsilon" in p:
            lines.append(f"\ntotal DP guarantee: eps={p['epsilon']:.4g} at "
                         f"delta={p.get('delta', 0):.2g} over {p.get('n_events', '?')} releases")
        if p.get("holds_against"):
            lines.append("  holds against: " + "; ".join(p["holds_against"]))
        if p.get("amplification"):
            lines.append(f"  {p['amplification']}")
    if not report["fields"]:
        lines.append("no observations in this transcript")
    lines.extend(format_clients(report.get("clients")))
    return "\n".join(lines)


def client_distribution(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The per-client epsilons of a run (``result.json``'s ``privacy.clients``) as a
    distribution per observer: ``{"delta", "clients", observer: {min, median, max,
    no_guarantee, worst}}``, beside the run's global figure (``global``); None when the
    run kept no client ledgers."""
    from secagg.result import client_spread

    priv = result.get("privacy") or {}
    clients = priv.get("clients")
    if not clients:
        return None
    out: dict[str, Any] = {"delta": priv.get("clients_delta", priv.get("delta")),
                           "clients": len(clients), "global": priv.get("epsilon"),
                           "refusals": sum(int(c.get("refusals", 0))
                                           for c in clients.values()),
                           "exhausted": sum(1 for c in clients.values()
                                            if c.get("status") == "exhausted")}
    for obs in ("release", "server"):
        out[obs] = client_spread(clients, obs)
    return out


def format_clients(dist: Mapping[str, Any] | None) -> list[str]:
    """Lines for :func:`format_audit`: the per-client distribution per observer."""
    if not dist:
        return []
    glob = dist.get("global")
    glob_text = "n/a" if glob is None else f"{glob:.4g}"
    lines = [f"\nper-client epsilon ({dist['clients']} clients, delta={dist['delta']:.2g}; "
             f"the run's global figure: {glob_text}):"]
    for obs in ("release", "server"):
        sp = dist.get(obs)
        if not sp:
            continue
        if "max" not in sp:
            lines.append(f"  vs {obs:<8}: no guarantee for any client")
            continue
        none = f", {sp['no_guarantee']} with no guarantee" if sp["no_guarantee"] else ""
        lines.append(f"  vs {obs:<8}: min {sp['min']:.4g}  median {sp['median']:.4g}  "
                     f"max {sp['max']:.4g}{none}; worst: {', '.join(sp['worst'])}")
    if dist.get("refusals"):
        lines.append(f"  refusals   : {dist['refusals']} ({dist['exhausted']} clients "
                     "exhausted their budget or refused the terms)")
    return lines
