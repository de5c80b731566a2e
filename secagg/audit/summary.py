"""A transcript condensed (:func:`audit`): per phase and field, who sent what, what each
party saw and under which DP guarantee, and the traffic per direction (:func:`traffic`),
reconciled with the run's ``costs.csv`` (:func:`reconcile`).
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from secagg.audit.attested import check_privacy, trusted_root
from secagg.costs import DIRECTIONS, SERVER
from secagg.stages import Stage
from secagg.transcript import Transcript

#: Suffix DistributedDP gives the secure-sum label of its noised ring vector.
_NOISED_SUFFIX = " (dp-noised)"


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
        if isinstance(r["sender"], int) and r["what"] == Stage.UPLOAD:
            senders[key].add(r["sender"])
            e["bytes_uploaded"] += int(r["bytes"])
            if r["field"].endswith(_NOISED_SUFFIX):
                e["noise_share_in_uploads"] = True
        if r["party"] == SERVER:
            e["server_saw"][label] += 1
            e["bytes_to_server"] += int(r["bytes"])
            if r["form"] == "clear" and r["what"] == Stage.UPLOAD:
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
            "attestation": attestation, "validation": validation(transcript), **extra}


def validation(transcript: Transcript) -> list[dict[str, Any]]:
    """One entry per ``verdict`` record (a validating layer's decision of one phase, e.g.
    :class:`~secagg.validated_sum.ValidatedSum`): ``round``, ``phase``, ``accepted`` (how
    many clients the sum holds), ``rejected`` (client -> why), and for the rejected clients
    what the transcript shows of their uploads: ``seen`` (client -> party -> the forms it
    saw them in) and ``reconstructed`` (the rejected clients that some party saw in the
    clear, or that the sum holds all the same: empty when none was ever reconstructed)."""
    obs: dict[tuple[int, str, int], dict[str, Counter]] = defaultdict(
        lambda: defaultdict(Counter))
    for r in transcript.observations():
        if isinstance(r.get("sender"), int) and not isinstance(r.get("sender"), bool):
            obs[(r["round"], r["phase"], r["sender"])][str(r["party"])][r["form"]] += 1
    out = []
    for v in transcript.records:
        if v.get("type") != "verdict":
            continue
        rejected = {int(c): str(w) for c, w in v.get("rejected", {}).items()}
        accepted = set(v.get("accepted", []))
        seen = {c: {p: dict(forms) for p, forms in obs.get((v["round"], v["phase"], c),
                                                             {}).items()}
                for c in sorted(rejected)}
        rebuilt = [c for c in sorted(rejected) if c in accepted
                   or any("clear" in forms for forms in seen[c].values())]
        out.append({"round": v["round"], "phase": v["phase"], "party": v.get("party"),
                    "accepted": len(accepted), "rejected": rejected, "seen": seen,
                    "reconstructed": rebuilt})
    return out
