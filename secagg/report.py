"""One self-contained HTML page per run and per sweep: ``report.html``.

``secagg report RUN_DIR`` (a folder holding ``result.json``) and ``secagg report SWEEP_DIR``
(one holding ``results.jsonl`` or ``results.csv``) write it; ``secagg run`` and ``secagg
sweep`` write it when they finish (:func:`save_run_report`, :func:`write_sweep_report`).

The page needs nothing but itself: the figures are inline SVG (matplotlib), the style is
inline CSS, there is no script, and a Content-Security-Policy forbids every fetch, so a
reader's browser makes no request when it opens it (tests/test_report.py checks this in
Chromium).

A run report reads, top to bottom: any failure (an audit whose attestation failed, a
transcript cut short, a run without a usable model, a run that is not private) in words;
what ran and the command that reproduces it; the accuracy curve, its kind named; the
privacy summary (the run's epsilon and what it holds against; each client's epsilon, a
histogram only when clients differ; the privacy plan's noise against signal per release);
what each party saw per phase and field (:func:`secagg.audit.audit`, with its attestation
verdict and what it trusted); the costs per phase and direction (``costs.csv``); and the
threat section (:func:`threat_models.audit.threat_audit`) when a coalition is named.

A sweep report: the privacy-utility and cost-utility figures (:mod:`secagg.plots`), the
clients' epsilon spread, and a table of every cell (linking to a cell's run report where
the cell kept its run folder, ``run_dir`` in its row).

Every number the page shows from ``result.json`` carries ``data-key`` (its dotted path in
``result.json``), so that a reader -- or a test -- can check it against the file.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import math
import os
import shlex
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.errors import DataError

__all__ = ["command_from_args", "plan_rows", "render_run_report", "render_sweep_report",
           "save_run_report", "write_report", "write_sweep_report"]

#: Written beside a run's outputs by ``secagg run``: the command and data it ran with, and
#: its privacy plan (what the report shows; ``result.json`` does not hold them).
RUN_INFO = "run.json"
REPORT = "report.html"
#: ``secagg run`` checks the clients' signed statements in its report up to this many
#: clients; above, the report says they are unchecked and how to check them
#: (the whole report of a 10,000-client FedAvg round, signatures checked, takes about 9 s
#: on a 2-core machine: benchmarks/results/report.txt).
VERIFY_AT_RUN_END = 10_000

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1.2em 2em 3em;color:#1d232a;background:#fff}
h1{font-size:1.6em;margin:.2em 0 .1em}h2{font-size:1.25em;margin:1.6em 0 .4em;
border-bottom:1px solid #d0d6dc;padding-bottom:.2em}h3{font-size:1.05em;margin:1.1em 0 .3em}
table{border-collapse:collapse;margin:.4em 0 .8em;font-size:13px}
th,td{border:1px solid #d0d6dc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f1f4f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre,code{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #d0d6dc;padding:.6em .8em;overflow-x:auto;
white-space:pre-wrap}
.banner{padding:.7em 1em;margin:.8em 0;border-radius:4px;font-weight:600}
.fail{background:#fde8e8;border:2px solid #c0392b;color:#7b1d12}
.warn{background:#fff5da;border:1px solid #c79a1c;color:#5c4307}
.ok{background:#e7f6ec;border:1px solid #2f8a4c;color:#1b4f2c}
.muted{color:#5b6670}figure{margin:.6em 0}figure svg{max-width:100%;height:auto}
figcaption{color:#5b6670;font-size:12.5px}.kv th{width:17em}
.wide{overflow-x:auto}.wide td,.wide th{white-space:nowrap}
"""
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "font-src data:; form-action 'none'; base-uri 'none'")


# -- small HTML helpers ---------------------------------------------------------------

def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _page(title: str, body: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _fmt(v: Any, digits: int = 4) -> str:
    """A number for a person: integers with thousands separators, floats with ``digits``
    significant digits; None as an em dash."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def _num(value: Any, key: str | None = None, text: str | None = None) -> str:
    """A number in a cell; ``key`` (its dotted path in result.json) as ``data-key``."""
    attr = f' data-key="{_e(key)}"' if key else ""
    return f'<span class="num"{attr}>{_e(text if text is not None else _fmt(value))}</span>'


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()
           ) -> str:
    """A table; cells are HTML already (escape before); columns in ``numeric`` align right."""
    out = ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(
            f"<td class=\"n\">{c}</td>" if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    return ("<table class=\"kv\"><tbody>" + "".join(
        f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</tbody></table>")


def _svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no DOCTYPE)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure_html(svg: str, caption: str, ident: str) -> str:
    return f'<figure id="{_e(ident)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>'


# -- the command that reproduces a run --------------------------------------------------

def command_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      skip: Sequence[str] = ("force", "quiet")) -> list[str]:
    """The command line (``secagg SUBCOMMAND --option value ...``) that gives ``args``
    from ``parser`` (the ``secagg`` parser): every option whose value differs from its
    default, flags and repeatable options included; ``skip`` names destinations left out
    (they change no result)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = args.command
    words = ["secagg", command]
    positional: list[str] = []
    for act in sub.choices[command]._actions:
        if act.dest in ("help", *skip) or not hasattr(args, act.dest):
            continue
        value = getattr(args, act.dest)
        if not act.option_strings:
            positional.extend(str(v) for v in (value if isinstance(value, list) else [value]))
            continue
        if value == act.default:
            continue
        flag = max(act.option_strings, key=len)
        if act.nargs == 0:  # store_true / store_false
            words.append(flag)
        elif isinstance(value, list):
            for v in value:
                words.extend([flag, str(v)])
        elif value is not None:
            words.extend([flag, str(value)])
    return words + positional


def plan_rows(fed: Any, with_epsilon: bool = False) -> list[dict[str, Any]]:
    """The privacy plan of a (run) :class:`~secagg.federation.Federation`: per DP release
    and field, the noise per entry and its norm, the largest sum the cohort could upload
    and their ratio (:func:`secagg.privacy.plan.plan_run`), as dicts; empty without DP
    noise. The planned epsilon after each round only ``with_epsilon`` (NaN otherwise: it
    costs an accountant call per round, minutes over a hundred rounds; the run's spent
    epsilon is in ``result.json``)."""
    from dataclasses import asdict

    from secagg.engine import cohort_size
    from secagg.messages import DEFAULT_MAX_RECORDS
    from secagg.privacy.plan import plan_run

    rows = plan_run(fed.algorithm, fed.layer, fed.rounds,
                    cohort_size(len(fed.partition), fed.fraction),
                    fed.max_records or DEFAULT_MAX_RECORDS, with_epsilon=with_epsilon)
    return [asdict(r) for r in rows]


def save_run_report(out_dir: str | os.PathLike[str], *, command: Sequence[str] | None = None,
                    data: Mapping[str, Any] | None = None, fed: Any | None = None) -> Path:
    """What ``secagg run`` calls once its outputs are saved: write :data:`RUN_INFO`
    (``command``, ``data`` -- dataset, split, ... -- and the privacy plan of ``fed``) and
    then ``report.html``. A plan that cannot be computed is recorded with the reason; the
    signed statements of a run over more than :data:`VERIFY_AT_RUN_END` clients are left
    unchecked, and the report says so."""
    out = Path(out_dir)
    info: dict[str, Any] = {"command": list(command) if command else None,
                            "data": dict(data or {})}
    if fed is not None:
        try:
            info["plan"] = plan_rows(fed)
        except Exception as exc:  # noqa: BLE001 -- the report says why, the run stands
            info["plan_error"] = f"{type(exc).__name__}: {exc}"
    (out / RUN_INFO).write_text(json.dumps(info, indent=2, default=str) + "\n")
    clients = len(fed.partition) if fed is not None else 0
    return write_report(out, verify=clients <= VERIFY_AT_RUN_END)


# -- the run report -----------------------------------------------------------------------

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
    from secagg.plots import _AxisTicks, _figure, _fit_ticks

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
    from secagg.plots import EPSILON_LOG_DECADES, _AxisTicks, _figure, _fit_ticks, _is_wide

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


# -- the sweep report ---------------------------------------------------------------------

_CELL_COLUMNS = (("algorithm", "algorithm"), ("layer", "layer"), ("epsilon", "epsilon"),
                 ("delta", "delta"), ("clip", "clip"), ("dropout", "dropout"),
                 ("seed", "seed"), ("accuracy", "accuracy"), ("accuracy_kind", "kind"),
                 ("epsilon_spent", "epsilon spent"), ("uplink_bytes", "uplink bytes"),
                 ("energy_j", "energy J"), ("client_eps_release_min", "client eps min"),
                 ("client_eps_release_median", "client eps median"),
                 ("client_eps_release_max", "client eps max"), ("cache", "cache"))


def render_sweep_report(sweep_dir: str | os.PathLike[str],
                        rows: Sequence[Mapping[str, Any]] | None = None,
                        svgs: Mapping[str, str] | None = None) -> str:
    """The sweep report of ``sweep_dir`` as HTML: ``rows`` (default: read from its
    ``results.jsonl`` / ``results.csv``) and ``svgs`` (figure stem -> inline SVG, as
    :func:`secagg.plots.plot_results` returns them through ``inline``; default: drawn
    here).

    Raises:
        DataError: no finished cell.
    """
    from secagg.plots import load_results, plot_results

    d = Path(sweep_dir)
    if rows is None:
        rows = load_results(d)
    if svgs is None:
        inline: dict[str, str] = {}
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            plot_results(rows, tmp, formats=(), inline=inline)
        svgs = inline
    algos = sorted({str(r["algorithm"]) for r in rows})
    layers = sorted({str(r["layer"]) for r in rows})
    seeds = sorted({r.get("seed") for r in rows}, key=str)
    name = d.resolve().name
    body = [f"<h1>secagg sweep: {_e(name)}</h1>", f"<p class=\"muted\">{_e(d.resolve())}</p>"]
    info = {}
    if (d / "sweep.json").exists():
        try:
            info = json.loads((d / "sweep.json").read_text())
        except json.JSONDecodeError:
            info = {}
    body.append("<h2 id=\"ran\">What ran</h2>")
    body.append(f"<p id=\"what-ran\">{len(rows):,} finished cells: algorithms "
                f"{_e(', '.join(algos))}; layers {_e(', '.join(layers))}; "
                f"{len(seeds)} seed(s).</p>")
    if info.get("command"):
        body.append("<p>Reproduce (resumes: finished cells are skipped) with:</p>"
                    f"<pre id=\"command\">{_e(shlex.join(info['command']))}</pre>")
    if info.get("config"):
        body.append("<details><summary>The sweep's configuration</summary><pre>"
                    + _e(json.dumps(info["config"], indent=2, default=str)) + "</pre></details>")
    body.append("<h2 id=\"privacy-utility\">Privacy against utility</h2>")
    body.append(_figure_html(svgs["privacy_utility"], "Accuracy against the total epsilon, "
                             "one panel per algorithm; the line is the mean over seeds, the "
                             "band their min to max; the dashed line is the non-private "
                             "reference.", "fig-privacy-utility"))
    body.append("<h2 id=\"cost-utility\">Cost against utility</h2>")
    body.append(_figure_html(svgs["cost_utility"], "Accuracy against uplink bytes and "
                             "estimated client energy; one row per kind of accuracy; hollow "
                             "black markers: plaintext.", "fig-cost-utility"))
    body.append("<h2 id=\"client-epsilon\">Each client's epsilon</h2>")
    spread = [r for r in rows if r.get("client_eps_release_max") is not None
              or r.get("client_eps_server_max") is not None]
    if "client_epsilon" in svgs:
        body.append(_figure_html(svgs["client_epsilon"], "Histograms of the clients' own "
                                 "epsilons, seeds pooled, where clients differ.",
                                 "fig-client-epsilon"))
    if spread:
        uniform = [r for r in spread
                   if r.get("client_eps_release_min") == r.get("client_eps_release_max")
                   and r.get("client_eps_server_min") == r.get("client_eps_server_max")]
        body.append(f"<p>{len(spread):,} cell(s) report per-client epsilons; in "
                    f"{len(uniform):,} of them every client has the same figure against each "
                    "observer (no histogram is drawn for those). The spread per cell is in "
                    "the table below.</p>")
    else:
        body.append("<p>No cell reports per-client epsilons.</p>")
    body.append("<h2 id=\"cells\">Every cell</h2>")
    trs = []
    def order(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return (str(r["algorithm"]), str(r["layer"]),
                *(-1.0 if r.get(k) is None else float(r[k])
                  for k in ("epsilon", "delta", "clip", "dropout")), str(r.get("seed")))

    for r in sorted(rows, key=order):
        cells = []
        for key, _ in _CELL_COLUMNS:
            v = r.get(key)
            cells.append(f'<span data-cell="{_e(r.get("id", ""))}" data-key="{key}">'
                         f'{_e(f"{v:.4f}" if key == "accuracy" and v is not None else _fmt(v))}'
                         "</span>")
        run = r.get("run_dir")
        link = (f'<a href="{_e(Path(str(run)).as_posix())}/{REPORT}">run report</a>'
                if run and (d / str(run) / REPORT).exists() else "not kept")
        trs.append((*cells, link))
    body.append("<div class=\"wide\" id=\"cells-table\">"
                + _table([h for _, h in _CELL_COLUMNS] + ["run"], trs,
                         numeric=(2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14)) + "</div>")
    body.append(f"<p class=\"muted\">Written by secagg report at "
                f"{_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}.</p>")
    return _page(f"secagg sweep report: {name}", body)


def write_sweep_report(sweep_dir: str | os.PathLike[str],
                       rows: Sequence[Mapping[str, Any]] | None = None,
                       svgs: Mapping[str, str] | None = None) -> Path:
    """Write ``report.html`` into ``sweep_dir`` (:func:`render_sweep_report`)."""
    path = Path(sweep_dir) / REPORT
    path.write_text(render_sweep_report(sweep_dir, rows, svgs), encoding="utf-8")
    return path


def write_report(directory: str | os.PathLike[str], *, threat: str | None = None,
                 identities: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] | None = None, verify: bool = True) -> Path:
    """``secagg report DIR``: the run report of a run folder (``result.json``) or the sweep
    report of a sweep folder (``results.jsonl`` / ``results.csv``), written to ``out``
    (default ``DIR/report.html``); returns its path.

    Raises:
        DataError: ``directory`` is neither.
    """
    d = Path(directory)
    target = Path(out) if out is not None else d / REPORT
    if (d / "result.json").exists():
        text = render_run_report(d, threat=threat, identities=identities, verify=verify)
    elif (d / "results.jsonl").exists() or (d / "results.csv").exists():
        if threat or identities:
            raise DataError("--threat and --identities apply to a run folder, not a sweep")
        text = render_sweep_report(d)
    else:
        raise DataError(f"{d} holds neither a run (result.json) nor a sweep "
                        "(results.jsonl / results.csv)")
    target.write_text(text, encoding="utf-8")
    return target
