"""TurboSVM-FL: SVM selective aggregation, the spread-out step, and the algorithm."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from algorithms.turbosvm import SpreadOut, c_schedule, pair_index, spread_out_loss, svm_select
from secagg.errors import ConfigurationError


def _embeddings(n_clients: int = 64, n_classes: int = 4, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, dim)) * 2.0
    pts, labels, weights = [], [], []
    for _ in range(n_clients):
        w = float(rng.integers(10, 100))
        for c in range(n_classes):
            pts.append(centres[c] + rng.standard_normal(dim) * 0.7)
            labels.append(c)
            weights.append(w)
    return np.array(pts), np.array(labels), np.array(weights)


def test_c_schedule() -> None:
    assert c_schedule(0, 10) == 1.0
    assert c_schedule(9, 10) == pytest.approx(0.1)
    with pytest.raises(ConfigurationError):
        c_schedule(10, 10)


def test_selection_is_a_strict_subset_and_differs_from_the_mean() -> None:
    x, y, w = _embeddings()
    sel = svm_select(x, y, w, n_classes=4, c_svm=1.0)
    assert 0 < len(sel.support) < len(x)
    for c in range(4):
        sv = [i for i in sel.support if y[i] == c]
        assert 0 < len(sv) < 64
        # The row is the count-weighted mean over exactly those support vectors.
        want = sum(w[i] * x[i] for i in sv) / sum(w[i] for i in sv)
        assert np.allclose(sel.rows[c], want, atol=1e-12)
        fedavg = (w[y == c, None] * x[y == c]).sum(0) / w[y == c].sum()
        assert np.linalg.norm(sel.rows[c] - fedavg) > 1e-3
    assert sel.normals.shape == (6, 8)


def test_moving_a_non_support_vector_inward_changes_nothing() -> None:
    x, y, w = _embeddings(seed=1)
    sel = svm_select(x, y, w, 4, 1.0, max_iter=-1)
    inner = next(i for i in range(len(x)) if i not in set(sel.support))
    x2 = x.copy()
    centre = x[y == y[inner]].mean(axis=0)
    x2[inner] = centre + 0.5 * (x[inner] - centre)  # pull it deeper into its class
    sel2 = svm_select(x2, y, w, 4, 1.0, max_iter=-1)
    assert np.allclose(sel.rows, sel2.rows, atol=1e-6)


def test_spread_out_loss_by_hand() -> None:
    rows = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, -0.5], [0.5, 0.5, 0.0]], dtype=torch.float64)
    h = torch.tensor([[1.0, -1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 3.0, 1.0]], dtype=torch.float64)
    pairs = pair_index([0, 1, 2])
    assert pairs == [(0, 1), (0, 2), (1, 2)]
    want = 0.0
    for (a, b), hv in zip(pairs, h.tolist()):
        diff = [rows[a, i].item() - rows[b, i].item() for i in range(3)]
        proj = sum(di * hi for di, hi in zip(diff, hv))
        want += math.exp(-proj**2 / (2 * sum(hi * hi for hi in hv)))
    assert float(spread_out_loss(rows, h, pairs)) == pytest.approx(want, abs=1e-12)


def test_adam_step_lowers_loss_and_keeps_state() -> None:
    x, y, w = _embeddings(n_clients=16, seed=2)
    sel = svm_select(x, y, w, 4, 1.0)
    opt = SpreadOut(4, 8, lr=0.05)
    rows1, loss0 = opt.step(sel.rows, sel.normals, sel.classes)
    assert not np.allclose(rows1, sel.rows)
    _, loss1 = opt.step(rows1, sel.normals, sel.classes)
    assert loss1 < loss0
    assert opt.opt.state[opt.param]["step"].item() == 2  # Adam state persists across rounds


# -- the algorithm through the engine ------------------------------------------------------

from algorithms.fedavg import FedAvg  # noqa: E402
from algorithms.turbosvm import EMBEDDINGS_REASON, TurboSVM  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.errors import InadmissibleField  # noqa: E402
from secagg.federation import Federation  # noqa: E402
from secagg.layers.per_group import PerGroup  # noqa: E402
from secagg.layers.plaintext import Plaintext  # noqa: E402
from secagg.secure_sum import SecureSum  # noqa: E402


@pytest.fixture(scope="module")
def sixty_four():
    return dirichlet_split(load_dataset("digits"), 64, alpha=0.5, seed=0)


def test_turbosvm_64_clients_selects_support_vectors_and_differs_from_fedavg(sixty_four) -> None:
    """Acceptance 4: with 64 clients per round the SVM keeps a strict subset of the
    embeddings, the encoder equals FedAvg's and the head does not."""
    layer = PerGroup({"encoder": SecureSum(graph="harary"), "embeddings": Plaintext()})
    turbo = TurboSVM(feature_dim=16, lr=0.1)
    res = Federation(turbo, layer, sixty_four, rounds=1, seed=0, progress=False).run()
    sel = turbo.last_selection
    assert sel is not None and sel.n_points >= 64 * 2
    assert 0 < len(sel.support) < sel.n_points
    fedavg = FedAvg(local_epochs=1, lr=0.1, momentum=0.0, feature_dim=16)
    Federation(fedavg, Plaintext(), sixty_four, rounds=1, seed=0, progress=False).run()
    nb = sum(p.numel() for p in fedavg.model.body.parameters())
    assert np.max(np.abs(turbo.encoder - fedavg.params[:nb])) < 1e-5
    head_fedavg = fedavg.params[nb:]
    head_turbo = turbo.params[nb:]
    assert np.max(np.abs(head_turbo - head_fedavg)) > 1e-3
    # The embeddings travelled in the clear, the encoder masked.
    forms = {(o["field"], o["form"]) for o in res.transcript.records
             if o.get("party") == "server" and o.get("what") == "upload"}
    assert ("embeddings", "clear") in forms
    assert ("weighted_encoder", "clear") not in forms


def test_securesum_on_embeddings_is_refused(sixty_four) -> None:
    turbo = TurboSVM(feature_dim=16)
    with pytest.raises(InadmissibleField) as info:
        Federation(turbo, SecureSum(), sixty_four, rounds=1, progress=False).run()
    assert info.value.field in ("embeddings", "class_counts")
    assert turbo.last_selection is None  # refused before any client trained
    with pytest.raises(InadmissibleField, match="needs each client's class embeddings") as info:
        turbo.check_layer(PerGroup({"encoder": SecureSum(), "embeddings": SecureSum()}))
    assert info.value.field in ("embeddings", "class_counts")
    assert EMBEDDINGS_REASON in str(info.value)
    turbo.check_layer(PerGroup({"encoder": SecureSum(), "embeddings": Plaintext()}))  # admitted


def test_server_uses_only_held_classes(sixty_four) -> None:
    from algorithms.base import Aggregate

    turbo = TurboSVM(feature_dim=4, spread_out=False)
    turbo.setup(sixty_four.dataset, [], 0)
    enc = turbo.encoder.astype(np.float64)
    rng = np.random.default_rng(0)
    emb, cnt = {}, {}
    for c in range(6):
        emb[c] = rng.standard_normal((10, 5))
        cnt[c] = np.array([5] * 10)
    cnt[0][3] = 0
    emb[0][3] = 1e3  # an absurd row for a class client 0 does not hold
    agg = Aggregate("train", 0, sums={"n": np.array([300]), "weighted_encoder": enc * 300},
                    values={"embeddings": emb, "class_counts": cnt},
                    contributors=tuple(range(6)))
    turbo.server_update(agg, 0, 10)
    assert turbo.last_selection.n_points == 59
    assert np.max(np.abs(turbo.head[3])) < 100  # the unheld row never reached the head
    every = TurboSVM(feature_dim=4, spread_out=False, held_classes_only=False)
    every.setup(sixty_four.dataset, [], 0)
    every.server_update(agg, 0, 10)
    assert every.last_selection.n_points == 60
