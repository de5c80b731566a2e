"""The ServerApp: runs FedLog rounds with the run config's layer, prints the result table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from secagg.data import load_dataset
from secagg.flower import FlowerFederation
from secagg.flower.server import save_result
from secagg_flower_app.task import make_algorithm, make_layer

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation and save/print what it cost."""
    cfg = context.run_config
    hold = (str(cfg["hold-stage"]), str(cfg["hold-dir"])) if cfg["hold-stage"] else None
    fed = FlowerFederation(
        make_algorithm(),
        make_layer(str(cfg["layer"]), int(cfg["threshold"]), float(cfg.get("epsilon", 4.0))),
        load_dataset("digits"), rounds=int(cfg["rounds"]), seed=int(cfg["seed"]),
        min_nodes=int(cfg["min-nodes"]), stage_timeout=float(cfg["stage-timeout"]),
        step_timeout=float(cfg.get("step-timeout", 0.0)) or None,
        max_records=int(cfg.get("max-records", 0)) or None,
        node_evaluation={"on": True, "off": False}.get(str(cfg.get("node-evaluation", "auto"))),
        hold=hold,
    )
    sums: dict[str, np.ndarray] = {}
    result = fed.run(grid, on_aggregate=lambda r, p, agg: sums.update(
        {f"r{r}/{p}/{k}": v for k, v in agg.sums.items()}))
    out = str(cfg["result-dir"]) or None
    save_result(result, fed, out)
    if out is not None:  # the aggregates the server computed, to check against Federation
        np.savez(Path(out, "aggregates.npz"), **sums)
    print(result.table())
    if result.privacy is not None:  # a DP layer: the run's guarantee
        print(f"DP: epsilon {result.privacy.epsilon(delta=1e-5):.3f} at delta 1e-5; "
              f"private: {'yes' if result.privacy.private else 'NO'}")
    for r, p, got, asked in result.participation:
        print(f"round {r} phase {p}: {got}/{asked} uploads in the aggregate")
    dropped = sorted({(row.round, row.sender, row.stage) for row in result.costs.rows
                      if row.stage.startswith("dropped:")})
    for r, c, stage in dropped:
        print(f"round {r}: client {c} {stage}")
