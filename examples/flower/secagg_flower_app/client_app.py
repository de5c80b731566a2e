"""The ClientApp: each SuperNode is the client ``partition-id`` of its --node-config."""

from __future__ import annotations

from flwr.app import Context

from secagg.data import ClientData, Dataset
from secagg.flower import client_app
from secagg_flower_app.task import make_algorithm, make_partition


def load(context: Context) -> tuple[Dataset, ClientData]:
    """This node's partition (partition-id of num-partitions)."""
    n = int(context.node_config.get("num-partitions", context.run_config["num-partitions"]))
    part = make_partition(n)
    return part.dataset, part[int(context.node_config["partition-id"])]


app = client_app(make_algorithm, load)
