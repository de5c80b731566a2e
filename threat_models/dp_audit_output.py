"""The audits' output: the table of results, and the empirical trade-off curves drawn
against the region each claim forbids."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from threat_models.dp_audit_gdp import AuditError
from threat_models.dp_audit_release import AuditResult


def format_table(results: Sequence[AuditResult]) -> str:
    """A plain-text table: one row per audit."""
    head = ("mechanism", "eps claimed", "eps lower", "ratio", "conf", "trials", "test",
            "mode", "verdict", "canary")
    rows = []
    for r in results:
        ratio = r.epsilon_lower / r.epsilon_claimed if r.epsilon_claimed else float("nan")
        rows.append((r.mechanism, f"{r.epsilon_claimed:.3f}", f"{r.epsilon_lower:.3f}",
                     f"{ratio:.2f}", f"{r.confidence:.4g}", str(r.trials), r.best.statistic,
                     r.best.mode, "VIOLATED" if r.violated else "ok", r.canary))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)


def allowed_fnr(fpr: Any, epsilon: float, delta: float) -> np.ndarray:
    """The smallest FNR an (epsilon, delta)-DP mechanism allows at each FPR:
    max(0, 1 - delta - e^epsilon FPR, e^-epsilon (1 - delta - FPR))."""
    f = np.asarray(fpr, dtype=np.float64)
    return np.maximum.reduce([np.zeros_like(f), 1.0 - delta - math.exp(epsilon) * f,
                              math.exp(-epsilon) * (1.0 - delta - f)])


def plot_tradeoff(results: Sequence[AuditResult], path: str | Any) -> list[Any]:
    """Draw each audit's empirical trade-off curve (FPR against FNR of its best test, on
    the evaluation split) over the region its claimed (epsilon, delta) forbids (shaded:
    a point there would break the claim), one panel per audit. Writes ``path`` with the
    suffixes .png and .svg; returns the two paths."""
    from pathlib import Path

    from matplotlib.figure import Figure

    if not results:
        raise AuditError("nothing to plot: no audit results")
    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".png", ".svg") else base
    cols = min(3, len(results))
    rows = math.ceil(len(results) / cols)
    fig = Figure(figsize=(4.0 * cols, 3.8 * rows), constrained_layout=True)
    axes = fig.subplots(rows, cols, squeeze=False)
    grid = np.linspace(0.0, 1.0, 401)
    for ax, r in zip(axes.ravel(), results, strict=False):
        floor = allowed_fnr(grid, r.epsilon_claimed, r.delta)
        ax.fill_between(grid, 0.0, floor, color="tab:red", alpha=0.15, lw=0,
                        label=f"forbidden by ({r.epsilon_claimed:g}, {r.delta:g})-DP")
        ax.plot(grid, floor, color="tab:red", lw=1)
        if r.curve:
            ax.plot(r.curve["fpr"], r.curve["fnr"], color="tab:blue", lw=1.5,
                    label=f"empirical ({r.best.statistic} test)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("false negative rate")
        verdict = "VIOLATED" if r.violated else "ok"
        ax.set_title(f"{r.mechanism}\neps claimed {r.epsilon_claimed:.3g}, lower "
                     f"{r.epsilon_lower:.3g} ({verdict})", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    for ax in axes.ravel()[len(results):]:
        ax.set_axis_off()
    base.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for suffix in (".png", ".svg"):
        target = base.with_suffix(suffix)
        fig.savefig(target, dpi=120)
        out.append(target)
    return out
