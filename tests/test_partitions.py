"""Partitions at cross-device scale: Dirichlet 0.5 over 10,000 clients, McMahan's shards.

The label vector is Fashion-MNIST's shape (60,000 records, 6,000 of each of 10 classes),
synthesised so the tests run offline and fast; the features are one zero column.
"""

from __future__ import annotations

import numpy as np
import pytest

from secagg.data import Dataset, Partition, dirichlet_split, label_shards_split
from secagg.errors import DataError


@pytest.fixture(scope="module")
def fmnist_labels() -> Dataset:
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 6000))
    x = np.zeros((y.size, 1), np.float32)
    return Dataset("fmnist-labels", x, y, x[:10], y[:10], n_classes=10, input_shape=(1,))


def _owner(p: Partition) -> np.ndarray:
    owner = np.full(p.dataset.n_train, -1)
    for c in p:
        assert (owner[c.indices] == -1).all()  # no record twice
        owner[c.indices] = c.id
    return owner


def test_dirichlet_at_10000_clients(fmnist_labels: Dataset) -> None:
    """The call the issue reports refused: every client gets at least its minimum."""
    p = dirichlet_split(fmnist_labels, 10_000, alpha=0.5, seed=0)
    owner = _owner(p)
    assert (owner >= 0).all()  # every record used exactly once
    sizes = p.sizes()
    assert len(p) == 10_000 and sizes.min() >= 1 and sizes.sum() == 60_000
    assert p.params["moved"] > 0  # no draw succeeded: the rebalance ran
    # the label skew of a Dirichlet(0.5) split survives the repair
    assert np.median([np.unique(c.y).size for c in p]) <= 4


def test_dirichlet_rebalance_min_size_and_determinism(fmnist_labels: Dataset) -> None:
    a = dirichlet_split(fmnist_labels, 10_000, alpha=0.5, seed=3, min_size=4, max_attempts=2)
    b = dirichlet_split(fmnist_labels, 10_000, alpha=0.5, seed=3, min_size=4, max_attempts=2)
    c = dirichlet_split(fmnist_labels, 10_000, alpha=0.5, seed=4, min_size=4, max_attempts=2)
    assert a.sizes().min() >= 4 and (_owner(a) >= 0).all()
    assert np.array_equal(_owner(a), _owner(b))
    assert not np.array_equal(_owner(a), _owner(c))
    assert a.params["moved"] > 1000
    with pytest.raises(DataError, match="rebalance=True"):
        dirichlet_split(fmnist_labels, 10_000, alpha=0.5, seed=3, max_attempts=2,
                        rebalance=False)


def test_rebalance_moves_only_what_is_missing(fmnist_labels: Dataset) -> None:
    """Only donors and recipients change: the other clients keep their drawn records."""
    drawn = dirichlet_split(fmnist_labels, 2_000, alpha=0.5, seed=1, min_size=1)
    assert drawn.params["moved"] == 0 and drawn.params["attempts"] == 1
    fixed = dirichlet_split(fmnist_labels, 2_000, alpha=0.5, seed=1, min_size=20,
                            max_attempts=1)
    sizes = fixed.sizes()
    assert sizes.min() >= 20
    same = [np.array_equal(c.indices, d.indices) for c, d in zip(drawn, fixed, strict=True)]
    # with max_attempts=1 the repaired draw is the first one, the draw `drawn` kept
    short = drawn.sizes() < 20
    assert fixed.params["moved"] == int((20 - drawn.sizes()[short]).sum())
    same = np.array(same)
    assert not same[short].any()  # every short client received
    donors = ~same & ~short
    before = drawn.sizes()
    assert 0 < donors.sum() < 2_000 - short.sum()
    # donors are the largest clients (water-filling from the top), and stay >= the minimum
    assert before[donors].min() >= before[same].max()
    assert (sizes[donors] < before[donors]).all() and sizes[donors].min() >= 20


def test_label_shards_at_10000_clients(fmnist_labels: Dataset) -> None:
    p = label_shards_split(fmnist_labels, 10_000, shards_per_client=2, seed=0)
    assert (_owner(p) >= 0).all()
    assert set(p.sizes().tolist()) == {6}  # 20,000 shards of 3 records
    assert max(np.unique(c.y).size for c in p) <= 2
    assert p.scheme == "shards" and p.params["shards_per_client"] == 2
    q = label_shards_split(fmnist_labels, 10_000, shards_per_client=2, seed=0)
    assert np.array_equal(_owner(p), _owner(q))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_label_shards_labels_per_client(fmnist_labels: Dataset, k: int) -> None:
    p = label_shards_split(fmnist_labels, 100, shards_per_client=k, seed=2,
                           local_test_fraction=0.2)
    sizes = p.sizes() + np.array([c.n_test for c in p])
    assert set(sizes.tolist()) == {600}  # McMahan's 100 clients x 600 records
    labels = [np.unique(np.concatenate([c.y, c.y_test])).size for c in p]
    assert max(labels) <= k and min(labels) >= 1
    if k > 1:  # shards are dealt at random, so most clients mix labels
        assert np.mean(np.array(labels) > 1) > 0.5


def test_label_shards_uneven_and_refusals() -> None:
    y = np.array([0] * 7 + [1] * 2 + [2] * 1)
    x = np.zeros((10, 1), np.float32)
    ds = Dataset("uneven", x, y, x[:1], y[:1], n_classes=3, input_shape=(1,))
    p = label_shards_split(ds, 3, shards_per_client=1, seed=0)
    assert sorted(p.sizes().tolist()) == [1, 2, 7]  # each class one shard, the tiny one too
    assert all(np.unique(c.y).size == 1 for c in p)
    with pytest.raises(DataError, match="one per class"):
        label_shards_split(ds, 1, shards_per_client=2)
    with pytest.raises(DataError, match="one sample each"):
        label_shards_split(ds, 6, shards_per_client=2)


def test_make_split_selects_the_scheme(fmnist_labels: Dataset) -> None:
    from secagg.data import make_split

    shards = make_split(fmnist_labels, "shards", 50, shards_per_client=3, seed=1)
    assert shards.scheme == "shards" and max(np.unique(c.y).size for c in shards) <= 3
    assert make_split(fmnist_labels, "dirichlet", 50, alpha=0.0).scheme == "iid"
    assert make_split(fmnist_labels, "iid", 50, alpha=0.5).scheme == "iid"
    assert make_split(fmnist_labels, "dirichlet", 50, alpha=0.5).scheme == "dirichlet"
    with pytest.raises(DataError, match="unknown split"):
        make_split(fmnist_labels, "pathological", 50)


def test_split_options_of_the_cli_and_the_sweep(tmp_path) -> None:
    from secagg.cli import _make_parser
    from secagg.errors import ConfigurationError
    from secagg.sweep import load_config

    args = _make_parser().parse_args(["run", "--split", "shards", "--shards-per-client", "3"])
    assert (args.split, args.shards_per_client) == ("shards", 3)
    cfg = {"data": {"dataset": "digits", "clients": 4, "split": "shards",
                    "shards_per_client": 2},
           "grid": {"algorithms": ["fedavg"], "layers": ["plaintext"]}}
    assert load_config(cfg, tmp_path).data["split"] == "shards"
    with pytest.raises(ConfigurationError, match="data.split"):
        load_config({**cfg, "data": {**cfg["data"], "split": "bogus"}}, tmp_path)
