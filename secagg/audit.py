"""Audit a transcript: per phase and field, who sent what, and in what form each party saw it.

:func:`audit` condenses a :class:`~secagg.transcript.Transcript` into one entry per
(phase, field): the clients that sent it, how many rounds, the forms in which the server
saw it (e.g. ``masked`` uploads then one ``clear`` sum), bytes, what other parties (a
decryptor) saw, whether anyone saw an individual upload in the clear, and the DP guarantee
recorded for that field. :func:`format_audit` prints it as a table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from secagg.costs import SERVER
from secagg.transcript import Transcript


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


def audit(transcript: Transcript) -> dict[str, Any]:
    """Summarise a transcript per (phase, field). Returns a JSON-able dict with ``run``
    (the header), ``fields`` (one entry per phase/field) and ``privacy`` (guarantees)."""
    header = next((r for r in transcript.records if r.get("type") == "run"), {})
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    senders: dict[tuple[str, str], set[int]] = defaultdict(set)
    rounds: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in transcript.observations():
        key = (r["phase"], r["field"])
        e = entries.setdefault(key, {
            "phase": r["phase"], "field": r["field"], "server_saw": Counter(),
            "others_saw": Counter(), "bytes_to_server": 0, "clear_individual_uploads": 0,
        })
        rounds[key].add(r["round"])
        if isinstance(r["sender"], int) and r["what"] == "upload":
            senders[key].add(r["sender"])
        label = f"{r['form']} {r['what']}"
        if r["party"] == SERVER:
            e["server_saw"][label] += 1
            e["bytes_to_server"] += int(r["bytes"])
            if r["form"] == "clear" and r["what"] == "upload":
                e["clear_individual_uploads"] += 1
        else:
            e["others_saw"][f"{r['party']}: {label}"] += 1
    privacy = [r for r in transcript.records if r.get("type") == "privacy"]
    per_field_dp: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in privacy:
        if p.get("field"):
            per_field_dp[p["field"]].append(p)
    out = []
    for key, e in entries.items():
        e["senders"] = sorted(senders[key])
        e["rounds"] = len(rounds[key])
        e["server_saw"] = dict(e["server_saw"])
        e["others_saw"] = dict(e["others_saw"])
        e["dp"] = per_field_dp.get(e["field"], [])
        out.append(e)
    return {"run": header, "fields": out, "privacy": privacy}


def _dp_text(dp: list[dict[str, Any]]) -> str:
    if not dp:
        return "none"
    p = dp[-1]
    if "epsilon" in p:
        return f"eps={p['epsilon']:.3g}, delta={p.get('delta', 0):.2g}"
    return str({k: v for k, v in p.items() if k != "type"})


def format_audit(report: dict[str, Any]) -> str:
    """The audit as text: a header line, then one block per (phase, field)."""
    run = report.get("run", {})
    lines = []
    if run:
        alg = run.get("algorithm", {}).get("name", "?")
        layer = run.get("layer", {}).get("name", "?")
        lines.append(f"run: algorithm={alg} layer={layer} seed={run.get('seed')} "
                     f"rounds={run.get('rounds')} clients={run.get('clients')}")
    for e in report["fields"]:
        seen = ", ".join(f"{form} x{n}" for form, n in sorted(e["server_saw"].items())) or "nothing"
        lines.append(f"\nphase {e['phase']!r}  field {e['field']!r}")
        lines.append(f"  sent by      : {len(e['senders'])} clients ({_ranges(e['senders'])}) "
                     f"over {e['rounds']} rounds")
        lines.append(f"  server saw   : {seen}")
        if e["others_saw"]:
            others = ", ".join(f"{k} x{n}" for k, n in sorted(e["others_saw"].items()))
            lines.append(f"  others saw   : {others}")
        verdict = ("YES - the server read individual uploads in the clear"
                   if e["clear_individual_uploads"] else "no")
        lines.append(f"  clear uploads: {verdict}")
        lines.append(f"  bytes        : {e['bytes_to_server']:,} to the server")
        lines.append(f"  DP guarantee : {_dp_text(e['dp'])}")
    totals = [p for p in report.get("privacy", []) if not p.get("field")]
    if totals:
        lines.append(f"\ntotal DP guarantee: {_dp_text(totals[-1:])}")
    if not report["fields"]:
        lines.append("no observations in this transcript")
    return "\n".join(lines)
