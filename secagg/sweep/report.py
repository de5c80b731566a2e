"""What a sweep writes: ``results.jsonl`` and ``results.csv`` (one row per finished cell,
appended with fsync), and the :class:`SweepResult` it returns."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The observers a run's per-client epsilons are given against (``result.json``'s
#: ``privacy.clients[id].epsilon``): who sees the released models, and the server.
CLIENT_OBSERVERS = ("release", "server")
#: The per-client spread columns: min / median / max of the clients' epsilons against each
#: observer (over the clients that have a figure) and ``_none``, how many have none (null:
#: no guarantee against that observer, e.g. the server under central DP).
CLIENT_SPREAD_COLUMNS = tuple(f"client_eps_{o}_{s}" for o in CLIENT_OBSERVERS
                              for s in ("min", "median", "max", "none"))
CSV_COLUMNS = ("id", "algorithm", "layer", "epsilon", "delta", "clip", "dropout", "seed",
               "accuracy", "accuracy_kind", "rounds", "epsilon_spent", "private",
               "uplink_bytes", "downlink_bytes", "energy_j", "latency_s_per_client_round",
               "device_profile", "cache", "wall_s", "status", "error",
               *CLIENT_SPREAD_COLUMNS)


def _client_order(cid: str) -> tuple[int, int | str]:
    return (0, int(cid)) if cid.isdigit() else (1, cid)


def client_spread(privacy: Mapping[str, Any] | None,
                  unprotected: Collection[str] = ()) -> dict[str, Any]:
    """The row fields a sweep records from a run's privacy section (``result.json``'s
    ``privacy``) when it gives per-client figures (``privacy["clients"]``: client id ->
    ``{"epsilon": {observer: float | None}, ...}``, at the run's delta).

    ``client_epsilons``: observer -> every client's epsilon (None where it has none), in
    client-id order, for the histogram (:func:`secagg.plots.plot_client_epsilons`);
    ``client_eps_global``: the run's global epsilon beside them (``privacy["epsilon"]``,
    None when absent); and the :data:`CLIENT_SPREAD_COLUMNS`. Observers named in
    ``unprotected`` (those the cell's layer gives no guarantee against) get None for every
    client, whatever figure the result gives. A run without per-client figures gives no
    field at all.
    """
    clients = (privacy or {}).get("clients")
    if not clients:
        return {}
    glob = (privacy or {}).get("epsilon")
    ids = sorted(clients, key=_client_order)
    observers = list(CLIENT_OBSERVERS) + sorted(
        {o for c in clients.values() for o in (c.get("epsilon") or {})} - set(CLIENT_OBSERVERS))
    per: dict[str, list[float | None]] = {}
    for o in observers:
        vals = [(clients[c].get("epsilon") or {}).get(o) for c in ids]
        per[o] = [None if v is None or o in unprotected else float(v) for v in vals]
    out: dict[str, Any] = {"client_epsilons": per,
                           "client_eps_global": None if glob is None else float(glob)}
    for o in CLIENT_OBSERVERS:
        have = sorted(v for v in per[o] if v is not None)
        out[f"client_eps_{o}_min"] = have[0] if have else None
        out[f"client_eps_{o}_median"] = statistics.median(have) if have else None
        out[f"client_eps_{o}_max"] = have[-1] if have else None
        out[f"client_eps_{o}_none"] = len(per[o]) - len(have)
    return out


@dataclass
class SweepResult:
    """What a sweep produced: every finished row (old and new), the paths written, and
    the ids of the cells run this time."""

    rows: list[dict[str, Any]]
    jsonl: Path
    csv: Path
    ran: list[str]
    skipped: list[str]
    plots: dict[str, Path] = field(default_factory=dict)
    #: ``report.html`` (:mod:`secagg.report`), written with the plots
    report: Path | None = None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interruption: that cell runs again
    return rows


def _csv_line(row: Mapping[str, Any], header: bool = False) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    if header:
        w.writeheader()
    w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
