"""The per-client epsilons of a run as a distribution per observer
(:func:`client_distribution`), and its lines in the audit's text (:func:`format_clients`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
