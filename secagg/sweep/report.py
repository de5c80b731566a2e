"""What a sweep writes: ``results.jsonl`` and ``results.csv`` (one row per finished cell,
appended with fsync), and the :class:`SweepResult` it returns."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CSV_COLUMNS = ("id", "algorithm", "layer", "epsilon", "delta", "clip", "dropout", "seed",
               "accuracy", "accuracy_kind", "rounds", "epsilon_spent", "private",
               "uplink_bytes", "downlink_bytes", "energy_j", "latency_s_per_client_round",
               "device_profile", "cache", "wall_s", "status", "error")


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
