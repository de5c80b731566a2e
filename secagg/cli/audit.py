"""``secagg audit``: read a transcript and print what each party saw, checked against
the clients' keys, the nodes' own ledgers and, with ``--threat``, a coalition."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from secagg.cli.exits import EXIT_CODES, EXIT_INCOMPLETE, EXIT_LEAK, EXIT_OK
from secagg.errors import ConfigurationError, SecaggError


def add_audit_parser(sub: Any) -> None:
    """Add ``secagg audit`` and its options to the subcommands ``sub``."""
    a = sub.add_parser(
        "audit",
        help="print what each party saw, from a transcript",
        description="Read a transcript (JSON Lines) and print whether it is complete, "
        "the traffic per direction (checked against costs.csv beside it), and per phase and "
        "field: which clients sent it, in what form each party saw it, bytes, the DP "
        "guarantee and notes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("file", type=Path, help="transcript.jsonl (or a run directory holding one)")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.add_argument(
        "--identities", type=Path, default=None, metavar="FILE",
        help="the clients' public keys, from outside the run folder (the key directory a "
        "simulated run writes, <run>.keys/identities.json, or your PKI's; a file inside the "
        "run folder is refused): verify every client's signed statement, check the "
        "server's records against them both ways and recompute the DP figures from the "
        "signed terms (exit 4 on a missing, forged or contradicted one); without it the "
        "transcript is unattested: only accidental damage is detected",
    )
    a.add_argument(
        "--node-ledger", action="append", default=[], metavar="CLIENT=PATH",
        help="a Flower node's own ledger file (node config ledger-path; repeatable): verify "
        "its chain, that its head is the one the server recorded, and that its committed "
        "releases of this run are the server's (exit 4 when not)")
    a.add_argument(
        "--threat",
        default=None,
        metavar="COALITION",
        help="also judge every field against a coalition, e.g. server, server+3, "
        "server+decryptor, active-server (threat_models); exits 5 when the coalition can "
        "read a field beyond what the layer promises",
    )


def _audit(args: argparse.Namespace) -> int:
    from secagg.audit import audit, format_audit, reconcile
    from secagg.transcript import Transcript

    path = args.file / "transcript.jsonl" if args.file.is_dir() else args.file
    if not path.exists():
        raise ConfigurationError(f"no such transcript: {path}")
    transcript = Transcript.read(path)
    identities = None
    if args.identities is not None:
        from secagg.attest import read_identities

        identities = read_identities(args.identities)
    report = audit(transcript, identities, transcript_path=path)
    costs = path.parent / "costs.csv"
    if costs.exists():
        report["reconcile"] = reconcile(report, costs)
    result_json = path.parent / "result.json"
    if result_json.exists():
        from secagg.audit import client_distribution

        dist = client_distribution(json.loads(result_json.read_text()))
        if dist is not None:
            report["clients"] = dist
    ledgers = _node_ledgers(args.node_ledger, transcript)
    if ledgers:
        report["node_ledgers"] = ledgers
    print(json.dumps(report, indent=2, default=str) if args.json else format_audit(report))
    if ledgers and not args.json:
        from secagg.privacy.node_ledger import format_reconcile

        print("\n" + format_reconcile(ledgers))
    bad = [r for r in ledgers if not r["ok"]]
    if bad:
        print(f"secagg audit: {len(bad)} node ledger(s) do not reconcile; first: "
              f"{bad[0]['problems'][0]}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if not report["complete"]:
        print(f"secagg audit: transcript incomplete: {report['incomplete_reason']}",
              file=sys.stderr)
        return EXIT_INCOMPLETE
    if report["attestation"]:
        print(f"secagg audit: {len(report['attestation'])} attestation problem(s); first: "
              f"{report['attestation'][0]}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if getattr(args, "threat", None):
        try:
            from threat_models.audit import threat_audit
        except ImportError as exc:
            raise SecaggError(f"audit --threat needs the threat_models package: {exc}") from None
        text, leaks = threat_audit(transcript, args.threat)
        print("\n" + text)
        return EXIT_LEAK if leaks else EXIT_OK
    return EXIT_OK


def _node_ledgers(specs: list[str], transcript: Any) -> list[dict[str, Any]]:
    """``audit --node-ledger CLIENT=PATH``: each node's file reconciled with the server's
    copy in the transcript (:func:`secagg.privacy.node_ledger.reconcile`)."""
    from secagg.privacy.node_ledger import reconcile

    out = []
    for spec in specs:
        client, sep, path = spec.partition("=")
        if not sep or not client.strip().lstrip("-").isdigit() or not path:
            raise ConfigurationError(f"--node-ledger wants CLIENT=PATH (a client id and its "
                                     f"ledger file), got {spec!r}")
        out.append(reconcile(Path(path), transcript.records, int(client)))
    return out
