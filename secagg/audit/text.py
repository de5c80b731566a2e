"""An audit report as text (:func:`format_audit`), opening with what the transcript's
attestation guarantees (:data:`UNATTESTED` when it was checked without keys).
"""

from __future__ import annotations

from typing import Any

from secagg.audit.clients import format_clients
from secagg.costs import DIRECTIONS

#: What a transcript checked only by its running digest guarantees (the audit's first line).
UNATTESTED = ("transcript: UNATTESTED - checked without the clients' keys (--identities): "
              "the server wrote every record below and could have rewritten any of them with "
              "its digest; this audit detects accidental truncation or corruption only")


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


def _validation_lines(entries: list[dict[str, Any]]) -> list[str]:
    """The rejected clients of a validating layer, and whether their vectors were ever
    reconstructed (see :func:`secagg.audit.summary.validation`)."""
    if not entries:
        return []
    n_rej = sum(len(e["rejected"]) for e in entries)
    lines = [f"\nvalidation ({len(entries)} verified phase(s), {n_rej} rejection(s); the "
             "decisions are the aggregators' record):"]
    for e in entries:
        head = f"  round {e['round'] + 1} phase {e['phase']!r}: {e['accepted']} accepted"
        if not e["rejected"]:
            lines.append(head + ", none rejected")
            continue
        lines.append(head + f", rejected {_ranges(sorted(e['rejected']))}")
        for c, why in sorted(e["rejected"].items()):
            saw = "; ".join(f"{p} saw {', '.join(f'{k} x{n}' for k, n in sorted(f.items()))}"
                            for p, f in sorted(e["seen"].get(c, {}).items())) or "nothing seen"
            state = ("RECONSTRUCTED" if c in e["reconstructed"] else
                     "never reconstructed")
            lines.append(f"    client {c}: {why} - {saw}; its vector was {state}")
    bad = [c for e in entries for c in e["reconstructed"]]
    lines.append("  verdict: " + (
        f"the vectors of rejected client(s) {_ranges(sorted(set(bad)))} WERE reconstructed "
        "(seen in the clear or summed)" if bad else
        "no rejected client's vector was reconstructed: no party saw it in the clear and "
        "no released sum holds it"))
    return lines


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
                     "server's records both ways; every layer parameter a client signed it was "
                     "told is the one the run header states")
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
    lines.extend(_validation_lines(report.get("validation") or []))
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
