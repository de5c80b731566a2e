"""The trained model is a run's output (secagg.model_io), and ``--model`` / ``--dataset``
take your own model and data."""

from __future__ import annotations

import contextlib
import io
import json
import textwrap

import numpy as np
import pytest
import torch

import secagg
from algorithms.training import accuracy
from secagg.cli import main
from secagg.data import load_dataset
from secagg.data_sources import load_partition, synthetic_partition

QUICK = ["--rounds", "1", "--local-epochs", "1", "--clients", "4", "--quiet"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_fedavg_run_saves_a_model_whose_test_accuracy_is_the_runs(tmp_path) -> None:
    code, out, err = run(["run", "--algorithm", "fedavg", *QUICK, "--out", str(tmp_path / "r")])
    assert code == 0, err
    saved = json.loads((tmp_path / "r" / "result.json").read_text())
    model = secagg.load_model(tmp_path / "r")
    assert isinstance(model, torch.nn.Module) and not model.training
    ds = load_dataset("digits")
    assert accuracy(model, ds.x_test, ds.y_test) == saved["accuracy"]
    info = json.loads((tmp_path / "r" / "model.json").read_text())
    assert info["kind"] == "global" and info["accuracy"] == saved["accuracy"]
    # --evaluate-only scores it again, from the run's own config
    code, out, err = run(["run", "--evaluate-only", str(tmp_path / "r")])
    assert code == 0, err
    assert f"accuracy (global test) of {tmp_path / 'r'} on digits: {saved['accuracy']:.4f}" in out


def test_fedlog_run_saves_each_clients_model(tmp_path) -> None:
    # the default algorithm is personalized: one model per client, scored on its own
    # local test set; their mean is the run's accuracy
    code, _, err = run(["run", *QUICK, "--out", str(tmp_path / "r")])
    assert code == 0, err
    saved = json.loads((tmp_path / "r" / "result.json").read_text())
    models = secagg.load_model(tmp_path / "r")
    part = load_partition("digits", 4, alpha=0.5, seed=0, local_test_fraction=0.2)
    accs = [accuracy(models[c.id], c.x_test, c.y_test) for c in part]
    assert np.mean(accs) == pytest.approx(saved["accuracy"], abs=1e-12)
    one = secagg.load_model(tmp_path / "r", client=2)
    assert accuracy(one, part[2].x_test, part[2].y_test) == accs[2]
    with pytest.raises(TypeError, match="client"):
        models(torch.zeros(1, 64))


def test_result_model_from_python_is_the_global_model() -> None:
    from algorithms import FedAvg
    from secagg import Federation, Plaintext
    from secagg.data import iid_split

    ds = load_dataset("digits")
    part = iid_split(ds, 3, seed=1)
    res = Federation(FedAvg(local_epochs=1, model="linear"), Plaintext(), part, rounds=1,
                     seed=1, progress=False).run()
    assert accuracy(res.model, ds.x_test, ds.y_test) == res.accuracy
    assert sum(p.numel() for p in res.model.parameters()) == 64 * 10 + 10


FACTORY = """
    import torch
    from algorithms.models import SplitModel

    CALLS = []

    def tiny(input_shape, n_classes):
        CALLS.append((tuple(input_shape), n_classes))
        d = 1
        for v in input_shape:
            d *= v
        body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(d, 7), torch.nn.Tanh())
        return SplitModel(body, torch.nn.Linear(7, n_classes), 7)
"""


def test_model_module_factory_is_trained_saved_and_rebuilt(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_models.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["run", "--algorithm", "fedavg", "--model", "my_models:tiny", *QUICK,
                        "--out", str(tmp_path / "r")])
    assert code == 0, err
    model = secagg.load_model(tmp_path / "r")
    assert isinstance(model.body[2], torch.nn.Tanh)
    assert model.body[1].weight.shape == (7, 64)
    ds = load_dataset("digits")
    saved = json.loads((tmp_path / "r" / "result.json").read_text())
    assert accuracy(model, ds.x_test, ds.y_test) == saved["accuracy"]
    # an algorithm that builds its own model refuses --model with the reason
    code, _, err = run(["run", "--model", "linear", *QUICK, "--out", str(tmp_path / "f")])
    assert code == 1 and "no --model option" in err
    code, _, err = run(["run", "--algorithm", "spherefed", "--model", "linear", *QUICK,
                        "--out", str(tmp_path / "s")])
    assert code == 1 and "SphereFed builds its own model" in err


def test_dataset_npz_is_split_trained_and_scored(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)  # linearly separable, 2 classes
    np.savez(tmp_path / "toy.npz", x_train=x[:240], y_train=y[:240], x_test=x[240:],
             y_test=y[240:])
    code, _, err = run(["run", "--algorithm", "fedavg", "--model", "linear", "--dataset",
                        str(tmp_path / "toy.npz"), "--rounds", "3", "--clients", "3",
                        "--split", "iid", "--quiet", "--out", str(tmp_path / "r")])
    assert code == 0, err
    saved = json.loads((tmp_path / "r" / "result.json").read_text())
    assert saved["accuracy"] >= 0.85  # chance is about 0.5; the linear model finds the plane
    model = secagg.load_model(tmp_path / "r")
    assert accuracy(model, x[240:], y[240:]) == saved["accuracy"]
    np.savez(tmp_path / "bad.npz", x_train=x, y_train=y)
    code, _, err = run(["run", "--dataset", str(tmp_path / "bad.npz"), *QUICK])
    assert code == 1 and "missing array(s) x_test, y_test" in err


def test_dataset_module_loader_returns_a_dataset(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_data.py").write_text(textwrap.dedent("""
        from secagg.data import load_dataset

        def small():
            ds = load_dataset("digits")
            return type(ds)("small-digits", ds.x_train[:400], ds.y_train[:400], ds.x_test,
                            ds.y_test, 10, (64,))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    part = load_partition("my_data:small", 4, split="iid", seed=0)
    assert part.dataset.name == "small-digits" and sum(part.sizes()) == 400


def test_synthetic_is_the_fedprox_population() -> None:
    a = synthetic_partition(200, 1.0, 1.0, seed=3)
    b = synthetic_partition(200, 1.0, 1.0, seed=3)
    assert all(np.array_equal(x.x, y.x) and np.array_equal(x.y, y.y) for x, y in zip(a, b))
    sizes = a.sizes()
    assert len(a) == 200 and a.dataset.input_shape == (60,) and a.dataset.n_classes == 10
    # power-law sizes: a heavy right tail (mean well above median, max many times min)
    assert sizes.mean() > 1.2 * np.median(sizes) and sizes.max() > 8 * sizes.min()
    # heterogeneity grows with alpha, beta: the clients' input means spread out
    spread = [np.std([c.x.mean() for c in synthetic_partition(100, v, v, seed=0)])
              for v in (0.0, 4.0)]
    assert spread[1] > 1.5 * spread[0]
    # the CLI form
    part = load_partition("synthetic:0.5,0.5", 50, seed=0)
    assert part.params["alpha"] == 0.5 and len(part) == 50


def test_synthetic_refuses_split_options() -> None:
    code, _, err = run(["run", "--dataset", "synthetic", "--split", "shards", *QUICK])
    assert code == 1 and "--split does not apply" in err


@pytest.mark.parametrize("name, kwargs", [
    ("fedprox", {"local_epochs": 1}), ("feduv", {"local_epochs": 1}),
    ("turbosvm", {"local_epochs": 1}), ("ccvr", {"local_epochs": 1}),
    ("spherefed", {"local_epochs": 1}), ("spherefed", {"body": "public"})])
def test_every_trained_model_reloads_to_the_runs_accuracy(name, kwargs, tmp_path) -> None:
    # SphereFed's public body is calibrated on centred features: its saved model carries
    # the released feature mean
    from secagg import Federation, Plaintext
    from secagg.algorithm_registry import load_algorithm
    from secagg.data import dirichlet_split

    ds = load_dataset("digits")
    part = dirichlet_split(ds, 4, 0.5, seed=0)
    res = Federation(load_algorithm(name)(**kwargs), Plaintext(), part, rounds=1,
                     seed=0, progress=False).run()
    res.save(tmp_path)
    assert accuracy(secagg.load_model(tmp_path), ds.x_test, ds.y_test) == res.accuracy
    if kwargs.get("body") == "public":
        assert res.model.centred and float(res.model.mean.norm()) > 0


def test_a_chosen_model_sizes_feature_statistics_or_is_refused() -> None:
    # CCVR's moment uploads take the chosen model's feature width (64 inputs for linear);
    # TurboSVM, which averages the body, refuses a body without parameters
    from algorithms import CCVR, TurboSVM
    from secagg import Federation, Plaintext
    from secagg.data import dirichlet_split
    from secagg.errors import ConfigurationError

    ds = load_dataset("digits")
    part = dirichlet_split(ds, 4, 0.5, seed=0)
    res = Federation(CCVR(local_epochs=1, model="linear"), Plaintext(), part, rounds=1,
                     seed=0, progress=False).run()
    assert res.model.feature_dim == 64 and accuracy(res.model, ds.x_test, ds.y_test) == \
        res.accuracy
    with pytest.raises(ConfigurationError, match="body has no parameters"):
        Federation(TurboSVM(model="linear"), Plaintext(), part, rounds=1, seed=0,
                   progress=False).run()
