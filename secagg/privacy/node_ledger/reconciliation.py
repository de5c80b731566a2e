"""A node's ledger file against the server's copy in a run's transcript (``secagg audit
--node-ledger``): :func:`reconcile` and its text, :func:`format_reconcile`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.privacy.node_ledger.chain import LedgerError, read_ledger


def reconcile(path: str | Path, records: Sequence[Mapping[str, Any]], client: int
              ) -> dict[str, Any]:
    """Reconcile node ``client``'s ledger file at ``path`` with the server's copy in a run's
    transcript ``records`` (its ``node-ledger`` records: the heads the node reported, and
    the release each reply charged, and the releases it refused over its budget).

    Checks: the file's chain verifies; every head the server holds is a head of the file,
    in the same order (so the file was not rewritten after the node reported it); the
    events the node committed in this run equal, in order, the releases the server
    recorded for it; the releases it refused are those the server saw refused. An intent
    of this run without a commit (a crash between the two) is charged by the node and
    unknown to the server: counted, not a mismatch.

    Returns:
        ``client``, ``ok`` (no problems), ``problems`` (text), ``server_head`` (the last
        head the server holds, or None), ``file_head``, ``later_entries`` (entries the file
        holds after the server's last head: later runs), ``committed`` and ``uncommitted``
        (this run's counts), ``refusals`` (this run's, by the node's budget), ``run``.
    """
    out: dict[str, Any] = {"client": int(client), "problems": [], "server_head": None,
                           "file_head": None, "later_entries": 0, "committed": 0,
                           "uncommitted": 0, "run": None}
    problems: list[str] = out["problems"]
    header = next((r for r in records if r.get("type") == "run"), {})
    run = (header.get("attestation") or {}).get("run")
    out["run"] = run
    mine = [r for r in records if r.get("type") == "node-ledger"
            and r.get("client") == int(client)]
    try:
        state = read_ledger(path)
    except LedgerError as exc:
        problems.append(str(exc))
        out["ok"] = False
        return out
    out["file_head"] = state.head
    if not mine:
        problems.append(f"the transcript holds no ledger head of client {client} (the node "
                        "kept no ledger in this run, or the server did not record it)")
    at = -2
    heads = [r for r in mine if isinstance(r.get("head"), str)]
    for r in heads:
        i = state.head_after(r["head"])
        if i is None:
            problems.append(f"the server's copy of client {client}'s head {r.get('head')} is "
                            "not in the file (rewritten or replaced since the node reported "
                            "it)")
        elif i < at:
            problems.append(f"client {client}'s reported heads go backwards in the file")
        else:
            at = i
    if heads and at >= -1:
        out["server_head"] = heads[-1]["head"]
        out["later_entries"] = len(state.entries) - 1 - at
    if run is None:
        problems.append("the transcript names no run (no attestation header): its releases "
                        "cannot be matched with the file's")
    commits = state.commits()
    ours = [(e, e.message_id in commits) for e in state.intents().values()
            if e.payload.get("run") == run]
    committed = [dict(e.payload) for e, done in ours if done]
    out["committed"], out["uncommitted"] = len(committed), len(ours) - len(committed)
    server = [dict(r["event"]) for r in mine if isinstance(r.get("event"), Mapping)]
    if committed != server:
        problems.append(f"client {client}: the file commits {len(committed)} release(s) of "
                        f"this run, the server recorded {len(server)}"
                        + ("" if len(committed) != len(server) else " (with other terms)"))
    def keys(events: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any]]:
        return [(e.get("round"), e.get("phase")) for e in events]

    refused = keys([e.payload for e in state.entries
                    if e.kind == "refusal" and e.payload.get("run") == run])
    told = keys([r["refused"] for r in mine if isinstance(r.get("refused"), Mapping)])
    out["refusals"] = len(refused)
    if refused != told:
        problems.append(f"client {client}: the file records refusals in (round, phase) "
                        f"{refused}, the server {told}")
    out["ok"] = not problems
    return out


def format_reconcile(results: Sequence[Mapping[str, Any]]) -> str:
    """:func:`reconcile` results as text, one block per node."""
    lines = []
    for r in results:
        if r["ok"]:
            tail = (f"; {r['later_entries']} later entr{'y' if r['later_entries'] == 1 else 'ies'}"
                    " (later runs)" if r["later_entries"] else "")
            lines.append(f"node ledger of client {r['client']}: reconciled - chain verified, "
                         f"head {str(r['server_head'])[:16]}... as the server recorded, "
                         f"{r['committed']} release(s) of this run committed as recorded"
                         + (f", {r['uncommitted']} charged without commit (crash)"
                            if r["uncommitted"] else "")
                         + (f", {r['refusals']} refused over budget" if r["refusals"] else "")
                         + tail)
        else:
            lines.append(f"node ledger of client {r['client']}: DOES NOT RECONCILE")
            lines.extend(f"  {p}" for p in r["problems"])
    return "\n".join(lines)
