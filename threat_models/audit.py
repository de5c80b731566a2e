"""``secagg audit --threat COALITION``: per field, who reads it, and what the attacks get.

:func:`threat_audit` judges every (phase, field) of a transcript against a coalition with
the admissibility rules (:mod:`threat_models.admissibility`), using the layer description
in the transcript header, lists which standard coalitions read single uploads of the field
in the clear (the server alone, with the decryptor, with 1..T colluding clients, an active
server), and, when the transcript holds values, runs the attacks that apply to the run's
algorithm from the named coalition's view. Without ground truth an attack's error cannot
be measured here: its success is reported as the share of clients whose value it recovered
from single uploads (the tests measure the errors). Across rounds, a field the run's header
declares round-invariant and the coalition read as exact sums over cohorts that determine
some client's value is reported as readable by differencing
(:func:`threat_models.differencing.transcript_risks`).
"""

from __future__ import annotations

from typing import Any

from secagg.messages import Field
from secagg.transcript import Transcript
from threat_models.admissibility import _rule, share_threshold
from threat_models.threat import ThreatModel
from threat_models.views import senders, view

_FORM_LAYER = {"clear": "plaintext", "masked": "secure-sum", "encrypted": "homomorphic"}


def _field_layer(desc: dict[str, Any], forms: set[str]) -> dict[str, Any]:
    """The layer description that carried a field (per-group routes are told apart by the
    form in which the server saw the uploads; the transcript does not name the group)."""
    if desc.get("name") != "per-group":
        return desc
    routes = list(desc.get("routes", {}).values()) + ([desc["default"]]
                                                      if desc.get("default") else [])
    for r in routes:
        inner = r
        while inner.get("inner"):
            inner = inner["inner"]
        if any(_FORM_LAYER.get(f) == inner.get("name") for f in forms):
            return r
        if "noised" in forms and r.get("name") == "local-dp":
            return r
    return routes[0] if routes else desc


def _coalitions(desc: dict[str, Any], n: int) -> list[ThreatModel]:
    out = [ThreatModel(), ThreatModel(decryptor_colludes=True), ThreatModel(server="active")]
    ts = share_threshold(desc.get("inner", desc), n) or 2
    out += [ThreatModel(colluding_clients=t) for t in range(1, min(ts, max(n - 1, 1)) + 1)]
    return out


def _attacks(transcript: Transcript, threat: ThreatModel, n: int) -> list[str]:
    from secagg.errors import ConfigurationError
    from threat_models.attacks import statistics

    lines = []
    for fn in (statistics.label_histograms, statistics.class_prototypes,
               statistics.single_records):
        try:
            res = fn(transcript, threat)
        except (ConfigurationError, KeyError, IndexError, ValueError):
            continue
        got = len(res.estimates) if res.basis in ("clear uploads", "noised uploads") else 0
        lines.append(f"  attack {res.name}: recovered for {got}/{n} clients "
                     f"(from {res.basis}; success rate {got / max(n, 1):.0%})")
    return lines


def threat_audit(transcript: Transcript, threat: ThreatModel | str) -> tuple[str, bool]:
    """The threat section of ``secagg audit`` as text, and whether the coalition reads some
    field beyond what its layer promises."""
    th = ThreatModel.parse(threat) if isinstance(threat, str) else threat
    head = next((r for r in transcript.records if r.get("type") == "run"), {})
    desc = head.get("layer", {})
    clients = senders(transcript)
    n = len(clients)
    seen_by_server = view(transcript, "server")
    mine = view(transcript, th)
    lines = [f"threat {th.name!r} (cohort of {n} clients, layer {desc.get('name', '?')})"]
    leaks = False
    for key, fv in seen_by_server.items():
        phase, fname = key
        rec = next(r for r in transcript.observations()
                   if r["phase"] == phase and r["field"] == fname)
        forms = set(fv.uploads)
        layer = _field_layer(desc, forms)
        additive = bool(fv.sums) or bool(forms & {"masked", "encrypted"})
        field = Field(fname, tuple(rec["shape"]) if rec["dtype"] != "bytes" else (1,),
                      additive=additive)
        readers = [c.name for c in _coalitions(layer, n)
                   if _rule(layer, field, c, n).individual_clear]
        if "clear" in forms and "server" not in readers:
            readers.insert(0, "server")
        rule = _rule(layer, field, th, n)
        ok = rule.ok and not (mine.get(key) and mine[key].clear_uploads)
        leaks |= not ok
        lines.append(f"\nphase {phase!r}  field {fname!r}  [{layer.get('name', '?')}]")
        lines.append(f"  read in the clear by: {', '.join(readers) or 'no listed coalition'}")
        lines.append(f"  {th.name}: {'protected' if ok else 'READABLE'} - {rule.reads}: "
                     f"{rule.reason}")
    from threat_models.differencing import transcript_risks

    for (phase, fname), risk in transcript_risks(transcript, th).items():
        leaks = True
        lines.append(f"\nphase {phase!r}  field {fname!r}  across rounds")
        lines.append(f"  {th.name}: READABLE by differencing - {risk.reason}")
    if transcript.include_values:
        lines += _attacks(transcript, th, n)
    else:
        lines.append("\n(no values in the transcript: run with --include-values to run attacks)")
    lines.append(f"\nverdict: {'a field is readable by ' + th.name if leaks else 'protected'}")
    return "\n".join(lines), leaks
