"""The run report: a ``secagg run`` folder's page, top to bottom: failures in words,
what ran, accuracy, privacy, what each party saw (the audit), costs, and the threat
section when a coalition is named."""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.errors import DataError
from secagg.report.page import _e, _figure_html, _fmt, _kv, _num, _page, _svg, _table

#: Written beside a run's outputs by ``secagg run``: the command and data it ran with, and
#: its privacy plan (what the report shows; ``result.json`` does not hold them).
RUN_INFO = "run.json"
#: ``secagg run`` checks the clients' signed statements in its report up to this many
#: clients; above, the report says they are unchecked and how to check them
#: (the whole report of a 10,000-client FedAvg round, signatures checked, takes about 9 s
#: on a 2-core machine: benchmarks/results/report.txt).
VERIFY_AT_RUN_END = 10_000


def _load_run(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    res_path = run_dir / "result.json"
    try:
        result = json.loads(res_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {res_path}: {exc}") from None
    info: dict[str, Any] = {}
    if (run_dir / RUN_INFO).exists():
        try:
            info = json.loads((run_dir / RUN_INFO).read_text())
        except json.JSONDecodeError:
            info = {}
    return result, info


def _layer_name(desc: Mapping[str, Any]) -> str:
    inner = desc.get("inner")
    name = str(desc.get("name", "?"))
    return f"{name}({_layer_name(inner)})" if isinstance(inner, Mapping) else name


def _accuracy_figure(result: Mapping[str, Any]) -> str:
    from secagg.plot_ticks import _AxisTicks, _fit_ticks
    from secagg.plots import _figure

    hist = [float(a) for a in result.get("history") or []]
    if not hist:
        return "<p class=\"muted\">No accuracy was recorded (no round ran).</p>"
    kind = result.get("accuracy_kind") or "?"
    fig = _figure(7.0, 3.0)
    ax = fig.subplots()
    rounds = list(range(1, len(hist) + 1))
    (line,) = ax.plot(rounds, hist, marker="o", ms=3.5, color="tab:blue",
                      label=f"{kind} accuracy after each round")
    line.set_gid("accuracy-curve")
    best = int(result.get("best_round", max(range(len(hist)), key=hist.__getitem__)))
    ax.plot([best + 1], [hist[best]], marker="*", ms=11, color="tab:orange", ls="none",
            zorder=5, label=f"best round {best + 1}: {hist[best]:.4f} (picked on the test "
            "data: optimistic)")
    ax.set_xlabel("round")
    ax.set_ylabel(f"accuracy ({kind})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    plans = [_AxisTicks(ax.xaxis, rounds, integer=True), _AxisTicks(ax.yaxis, hist)]
    _fit_ticks(fig, plans)
    return _figure_html(_svg(fig), f"Accuracy ({kind}) after each round; the final model is "
                        "the last round's.", "fig-accuracy")


def _client_histograms(clients: Mapping[str, Any], glob: float | None) -> str:
    """One histogram per observer whose clients' epsilons differ; a sentence otherwise."""
    from secagg.plot_ticks import EPSILON_LOG_DECADES, _AxisTicks, _fit_ticks, _is_wide
    from secagg.plots import _figure

    names = {"release": "observers of the released models", "server": "the server"}
    observers = sorted({o for c in clients.values() for o in (c.get("epsilon") or {})},
                       key=lambda o: (o not in names, o))
    lines, panels = [], []
    for obs in observers:
        vals = [(c.get("epsilon") or {}).get(obs) for c in clients.values()]
        have = [float(v) for v in vals if v is not None]
        none = len(vals) - len(have)
        none_text = (f"; {none:,} client(s) have no guarantee against it" if none else "")
        if not have:
            lines.append(f"Against {names.get(obs, obs)}: no client has a guarantee.")
        elif len(set(have)) == 1:
            lines.append(f"Against {names.get(obs, obs)}: every one of the {len(have):,} "
                         f"clients with a figure has epsilon {have[0]:.4g}{none_text}.")
        else:
            lines.append(f"Against {names.get(obs, obs)}: epsilon from {min(have):.4g} to "
                         f"{max(have):.4g} (median {statistics.median(have):.4g}) over "
                         f"{len(have):,} clients{none_text}; histogram below.")
            panels.append((obs, have))
    out = ["<p>" + "<br>".join(_e(t) for t in lines) + "</p>"]
    if panels:
        fig = _figure(3.6 * len(panels) + 0.4, 2.8)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        plans = []
        for ax, (obs, have) in zip(axes, panels, strict=True):
            xs = have + ([glob] if glob is not None else [])
            log = _is_wide(xs, EPSILON_LOG_DECADES)
            n = max(2, min(30, int(math.sqrt(len(have))) + 1))
            lo, hi = min(have), max(have)
            bins: Any = ([10 ** (math.log10(lo) + (math.log10(hi) - math.log10(lo)) * i / n)
                          for i in range(n + 1)] if log else n)
            ax.hist(have, bins=bins, color="tab:green", alpha=0.8,
                    label=f"{len(have):,} clients")
            ax.set_gid(f"client-eps-{obs}")
            if glob is not None:
                ax.axvline(glob, color="k", ls="--", lw=1.2, label=f"run's epsilon {glob:.3g}")
            ax.set_title(f"against {names.get(obs, obs)}", fontsize=9)
            ax.set_xlabel("client's epsilon")
            ax.set_ylabel("clients")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            plans.append(_AxisTicks(ax.xaxis, xs, log=log))
            plans.append(_AxisTicks(ax.yaxis, [0.0] + [p.get_height() for p in ax.patches],
                                    integer=True))
        _fit_ticks(fig, plans)
        out.append(_figure_html(_svg(fig), "Each client's own epsilon (its ledger over the "
                                "rounds it took part in), per observer.", "fig-client-eps"))
    return "\n".join(out)


def _privacy_section(result: Mapping[str, Any], info: Mapping[str, Any]) -> list[str]:
    out = ["<h2 id=\"privacy\">Privacy</h2>"]
    priv = result.get("privacy") or {}
    if priv.get("epsilon") is None and not priv.get("clients"):
        out.append("<p><b>DP: none.</b> The layer adds no noise, so no epsilon holds against "
                   "anyone: who could read which upload is in the audit below.</p>")
    else:
        rows = [("epsilon spent", _num(priv.get("epsilon"), "privacy.epsilon")
                 + f" at delta {_e(_fmt(priv.get('delta')))} ({_e(priv.get('accountant', '?'))}"
                 " accountant)"),
                ("budget", _e(_fmt(priv.get("epsilon_budget")))),
                ("private", "<b>yes</b>" if priv.get("private") else
                 "<b>NO</b>: " + _e("; ".join(priv.get("not_private_reasons") or []))),
                ("holds against", "<ul>" + "".join(
                    f"<li>{_e(h)}</li>" for h in priv.get("holds_against") or []) + "</ul>"
                 if priv.get("holds_against") else "<i>no observer named</i>"),
                ("amplification", _e(priv.get("amplification", "\u2014"))),
                ("fields without noise", _e(", ".join(priv.get("unnoised") or []) or "none"))]
        for fname, eps in (priv.get("per_field") or {}).items():
            rows.append((f"epsilon, field {fname}", _num(eps, f"privacy.per_field.{fname}")))
        out.append(_kv(rows))
    if priv.get("clients"):
        out.append("<h3>Each client's epsilon</h3>")
        out.append(_client_histograms(priv["clients"], priv.get("epsilon")))
    plan = info.get("plan")
    out.append("<h3>The privacy plan: noise against signal per release</h3>")
    if plan:
        # releases that differ only in their round share a row (rounds 1-100)
        same: dict[tuple[Any, ...], list[int]] = {}
        for p in plan:
            key = tuple(p[k] for k in ("phase", "field", "layer", "adjacency", "cohort",
                                       "sigma", "noise_norm", "signal_bound", "snr"))
            same.setdefault(key, []).append(int(p["round"]) + 1)
        rows = [(_e(_round_ranges(r)), _e(k[0]), _e(k[1]), _e(k[2]), _e(k[3]),
                 _e(_fmt(k[4])), _e(_fmt(k[5])), _e(_fmt(k[6])), _e(_fmt(k[7])),
                 ("<b>" + _e(_fmt(k[8], 3)) + " (noise swamps the signal)</b>"
                  if k[8] < 1 else _e(_fmt(k[8], 3)))) for k, r in same.items()]
        out.append(_table(("rounds", "phase", "field", "layer", "adjacency", "cohort",
                           "noise std / entry", "noise norm", "largest sum norm",
                           "signal / noise"), rows, numeric=(5, 6, 7, 8, 9)))
        out.append("<p class=\"muted\">signal / noise below 1: the noise is larger than "
                   "any sum the cohort could upload, even with every client at its bound.</p>")
    elif info.get("plan_error"):
        out.append(f"<p class=\"muted\">No plan: {_e(info['plan_error'])}</p>")
    elif "plan" in info:
        out.append("<p>No DP release: the layer adds no noise.</p>")
    else:
        out.append("<p class=\"muted\">Not recorded (this folder has no run.json; "
                   "<code>secagg run --dry-run</code> with the command above prints it).</p>")
    return out


def _round_ranges(rounds: Sequence[int]) -> str:
    """1, 2, 3, 5 -> ``1-3, 5``."""
    spans: list[list[int]] = []
    for r in sorted(rounds):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _audit_section(run_dir: Path, identities: Path | None, verify: bool = True
                   ) -> tuple[list[str], list[str]]:
    """The audit section and the failure lines for the banner; ``verify=False`` leaves
    the clients' signed statements unchecked, and the section says so."""
    from secagg.audit import audit
    from secagg.transcript import Transcript

    path = run_dir / "transcript.jsonl"
    out = ["<h2 id=\"audit\">What each party saw</h2>"]
    if not path.exists():
        return out + ["<p class=\"muted\">No transcript.jsonl in this folder.</p>"], []
    transcript = Transcript.read(path)
    trusted = identities
    published = run_dir.resolve().parent / f"{run_dir.resolve().name}.keys" / "identities.json"
    if trusted is None and published.exists():  # the key directory the run published
        trusted = published
    failures: list[str] = []
    if trusted is not None and not verify:
        rep = audit(transcript, None)
        verdict = (f"<div class=\"banner warn\" id=\"attestation\">Attestation NOT CHECKED "
                   f"in this report: the clients' signed statements were left unverified when "
                   f"it was written (a run of more than {VERIFY_AT_RUN_END:,} clients; checking "
                   f"them takes minutes at that size). Check them with <code>secagg report "
                   f"{_e(run_dir)}</code> or <code>secagg audit {_e(run_dir)} --identities "
                   f"{_e(trusted)}</code>.</div>")
    else:
        keys = None
        if trusted is not None:
            from secagg.attest import read_identities

            keys = read_identities(trusted)
        rep = audit(transcript, keys, transcript_path=path)
        verdict = _verdict(rep.get("attestation"), trusted, identities is None, failures)
    out.append(verdict)
    body = _audit_body(rep, run_dir)
    if not rep["complete"]:
        failures.append(f"The transcript is INCOMPLETE: {rep['incomplete_reason']}; the audit "
                        "covers only what the file holds.")
    if any("DISAGREES with costs.csv" in x for x in body):
        failures.append("The transcript's traffic disagrees with costs.csv.")
    return out + body, failures


def _verdict(att: list[str] | None, trusted: Path | None, beside: bool,
             failures: list[str]) -> str:
    """The attestation verdict as HTML (a failure also appended to ``failures``)."""
    from secagg.audit import UNATTESTED

    if att is None:
        return "<div class=\"banner warn\" id=\"attestation\">" + _e(UNATTESTED) + "</div>"
    if att:
        failures.append(f"The audit FAILED: {len(att):,} transcript record(s) contradict, "
                        f"lack or forge the clients' signed statements (checked against "
                        f"{trusted}). First: {att[0]}. The figures below come from a transcript "
                        "that was altered after the clients signed it.")
        verdict = ("<div class=\"banner fail\" id=\"attestation\">Attestation FAILED: "
                   + _e(f"{len(att):,} record(s) contradict, lack or forge the clients' "
                        "signed statements") + "<ul>" + "".join(
                            f"<li>{_e(p)}</li>" for p in att[:20]) + "</ul></div>")
    else:
        verdict = ("<div class=\"banner ok\" id=\"attestation\">Attestation verified: every "
                   "message the clients sent carries their signed statement, and every "
                   "server record of it agrees (form, digest).</div>")
    return verdict + ("<p>Trusted: the clients' public keys in <code>" + _e(trusted) + "</code>"
                      + (", the key directory the run published beside (not inside) its "
                         "folder. That holds against a server that rewrites the run folder "
                         "as long as it could not also write there; in a deployment give the "
                         "keys your PKI or the nodes' operators hold (<code>secagg report DIR "
                         "--identities FILE</code>)." if beside else
                         ", given from outside the run.") + "</p>")


def _audit_body(rep: Mapping[str, Any], run_dir: Path) -> list[str]:
    """Completeness, the per-(phase, field) views and the traffic check of an audit."""
    from secagg.audit import reconcile

    out: list[str] = []
    if not rep["complete"]:
        out.append(f"<p class=\"banner fail\">Transcript incomplete: "
                   f"{_e(rep['incomplete_reason'])}</p>")
    else:
        end = rep.get("end") or {}
        out.append(f"<p>Transcript complete: {_e(_fmt(end.get('records')))} records, "
                   f"{_e(_fmt(end.get('rounds_completed')))} rounds, digest verified.</p>")
    rows = []
    for f in rep["fields"]:
        saw = ", ".join(f"{n:,} {k}" for k, n in sorted(f["server_saw"].items())) or "\u2014"
        others = "; ".join(f"{p}: " + ", ".join(f"{n:,} {k}" for k, n in sorted(s.items()))
                           for p, s in sorted(f["others_saw"].items())) or "\u2014"
        dp = f.get("dp") or {}
        rows.append((_e(f["phase"]), _e(f["field"]), _e(_senders(f["senders"])), _e(saw),
                     _e(others), _e(_fmt(f["bytes_uploaded"])),
                     _e(dp.get("text") or ("no DP" if not dp.get("private") else "DP")),
                     "<br>".join(_e(n) for n in f.get("notes") or [])))
    out.append(_table(("phase", "field", "senders", "the server saw", "other parties saw",
                       "bytes uploaded", "DP guarantee", "notes"), rows, numeric=(5,)))
    costs = run_dir / "costs.csv"
    if costs.exists():
        rec = reconcile(rep, costs)
        out.append("<p>" + ("Traffic per direction agrees with costs.csv." if rec["match"]
                            else "<b>Traffic per direction DISAGREES with costs.csv:</b> "
                            + _e(json.dumps({k: v for k, v in rec.items() if k != "match"})))
                   + "</p>")
    return out


def _threat_section(run_dir: Path, threat: str) -> list[str]:
    """The threat views of a coalition over the transcript (``secagg audit --threat``),
    with the attacks' results where the transcript holds values."""
    from secagg.transcript import Transcript

    out = [f"<h2 id=\"threat\">Threat: {_e(threat)}</h2>"]
    path = run_dir / "transcript.jsonl"
    if not path.exists():
        return out + ["<p class=\"muted\">No transcript.jsonl in this folder.</p>"]
    transcript = Transcript.read(path)
    try:
        from threat_models.audit import threat_audit
    except ImportError as exc:
        return out + [f"<p>The threat section needs the threat_models package: {_e(exc)}</p>"]
    text, leaks = threat_audit(transcript, threat)
    out.append(("<p class=\"banner fail\">The coalition can read some field beyond what the "
                "layer promises.</p>" if leaks else
                "<p class=\"banner ok\">The coalition reads nothing beyond what the layer "
                "promises.</p>") + f"<pre>{_e(text)}</pre>")
    return out


def _senders(ids: Sequence[int]) -> str:
    if not ids:
        return "none (a server result)"
    if list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"{len(ids):,} clients ({ids[0]}-{ids[-1]})" if len(ids) > 1 else f"client {ids[0]}"
    return f"{len(ids):,} clients"


_COST_COLUMNS = ("messages", "plaintext_bytes", "wire_bytes", "client_cpu_s", "server_cpu_s",
                 "device_latency_s", "device_energy_j")


def _costs_section(run_dir: Path, result: Mapping[str, Any]) -> list[str]:
    out = ["<h2 id=\"costs\">Costs</h2>"]
    dev = result.get("device") or {}
    totals = result.get("costs") or {}
    rows = []
    for d, t in totals.items():
        rows.append((_e(d), _num(t.get("messages"), f"costs.{d}.messages"),
                     _num(t.get("wire_bytes"), f"costs.{d}.wire_bytes"),
                     _num(t.get("plaintext_bytes"), f"costs.{d}.plaintext_bytes"),
                     _num(t.get("client_cpu_s"), f"costs.{d}.client_cpu_s"),
                     _num(t.get("server_cpu_s"), f"costs.{d}.server_cpu_s")))
    out.append("<h3>Ledger totals per direction</h3>")
    out.append(_table(("direction", "messages", "wire bytes", "plaintext bytes",
                       "client CPU s", "server CPU s"), rows, numeric=(1, 2, 3, 4, 5)))
    out.append(_kv([
        (f"est. client device time ({dev.get('profile', '?')})",
         _num(dev.get("latency_s"), "device.latency_s") + " s (compute "
         + _num(dev.get("compute_s"), "device.compute_s") + " s, radio "
         + _num(dev.get("radio_s"), "device.radio_s") + " s), over "
         + _num(result.get("client_rounds"), "client_rounds") + " client-rounds"),
        (f"est. client energy ({dev.get('profile', '?')})",
         _num(dev.get("energy_j"), "device.energy_j") + " J"),
        ("client compute", _num(dev.get("flops"), "device.flops") + " FLOP")]))
    path = run_dir / "costs.csv"
    if path.exists():
        agg: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        with path.open(newline="") as fh:
            for r in csv.DictReader(fh):
                a = agg[(r["phase"], r["direction"])]
                a["messages"] += 1
                for k in _COST_COLUMNS[1:]:
                    if r.get(k) not in (None, ""):
                        a[k] += float(r[k])
        rows = [(_e(p), _e(d), *(_e(_fmt(a[k])) for k in _COST_COLUMNS))
                for (p, d), a in sorted(agg.items())]
        out.append("<h3>Per phase and direction (costs.csv)</h3>")
        out.append(_table(("phase", "direction", "messages", "plaintext bytes", "wire bytes",
                           "client CPU s (host)", "server CPU s (host)", "est. device time s",
                           "est. device energy J"), rows, numeric=(2, 3, 4, 5, 6, 7, 8)))
    return out


def render_run_report(run_dir: str | os.PathLike[str], *, threat: str | None = None,
                      identities: str | os.PathLike[str] | None = None,
                      verify: bool = True) -> str:
    """The run report of ``run_dir`` (a ``secagg run`` output folder) as HTML.

    ``identities``: the clients' public keys to check the transcript against (default: the
    key directory the run published beside its folder, ``<run_dir>.keys/identities.json``,
    and the report says what that trusts);
    ``threat``: a coalition (``server``, ``server+3``, ...) to judge every field against;
    ``verify=False``: leave the clients' signed statements unchecked (the page says so).

    Raises:
        DataError: the folder holds no readable ``result.json``.
    """
    from secagg.result import what_ran

    d = Path(run_dir)
    result, info = _load_run(d)
    algo = result.get("algorithm") or {}
    layer = result.get("layer") or {}
    ran = what_ran(str(algo.get("name", "?")), _layer_name(layer),
                   int(result.get("n_clients", 0)), int(result.get("rounds", 0)),
                   int(result.get("seed", 0)), info.get("data"))
    audit_html, failures = _audit_section(d, Path(identities) if identities else None,
                                          verify)
    if result.get("failure"):
        failures.append(f"No usable model: {result['failure']}")
    priv = result.get("privacy") or {}
    warn = []
    if priv and priv.get("private") is False:
        warn.append("This run is NOT differentially private: "
                    + "; ".join(priv.get("not_private_reasons") or ["see the privacy section"]))
    body = [f"<h1>secagg run: {_e(algo.get('name', '?'))} under {_e(_layer_name(layer))}</h1>",
            f"<p class=\"muted\">{_e(d.resolve())}</p>"]
    body += [f"<div class=\"banner fail\" role=\"alert\">{_e(f)}</div>" for f in failures]
    body += [f"<div class=\"banner warn\">{_e(w)}</div>" for w in warn]
    body.append("<h2 id=\"ran\">What ran</h2>")
    body.append(f"<p id=\"what-ran\">{_e(ran)}.</p>")
    cmd = info.get("command")
    body.append("<p>Reproduce with:</p><pre id=\"command\">"
                + _e(shlex.join(cmd) if cmd else "(not recorded: this folder has no run.json)")
                + "</pre>")
    body.append("<details><summary>Algorithm and layer, as the run described them</summary>"
                 f"<pre>{_e(json.dumps({'algorithm': algo, 'layer': layer}, indent=2))}</pre>"
                 "</details>")
    kind = result.get("accuracy_kind") or "?"
    body.append(f"<h2 id=\"accuracy\">Accuracy ({_e(kind)})</h2>")
    best = result.get("best_round")
    body.append(_kv([
        (f"final ({kind})", _num(result.get("accuracy"), "accuracy",
                                 f"{float(result.get('accuracy', math.nan)):.4f}")),
        ("best round (picked on the same test data: optimistic)",
         _num(result.get("best_accuracy"), "best_accuracy",
              f"{float(result.get('best_accuracy', math.nan)):.4f}")
         + f" after round {_e(_fmt(None if best is None else int(best) + 1))}"),
        ("rounds", _num(result.get("rounds"), "rounds") + " of "
         + _num(result.get("planned_rounds"), "planned_rounds")),
        ("clients", _num(result.get("n_clients"), "n_clients")),
        ("wall time", _num(result.get("wall_s"), "wall_s") + " s")]))
    body.append(_accuracy_figure(result))
    body += _privacy_section(result, info)
    body += audit_html
    body += _costs_section(d, result)
    cmd = info.get("command") or []
    if threat is None and "--threat" in cmd[:-1]:  # the run was judged against one
        threat = cmd[cmd.index("--threat") + 1]
    if threat:
        body += _threat_section(d, threat)
    body.append(f"<p class=\"muted\">Written by secagg report at "
                f"{_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}.</p>")
    return _page(f"secagg run report: {ran}", body)
