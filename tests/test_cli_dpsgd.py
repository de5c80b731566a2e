"""DP-SGD from the command line ends private or is refused before anything trains: the
run's --epsilon is shared between DP-SGD and the DP layer, --dry-run counts DP-SGD's
spend, and Opacus' misleading "Secure RNG turned off" warning is gone (its generator draws
neither the noise nor the sampling).

Each test here failed on the code before (issue 38, item 6): ``--dpsgd-noise`` under a
non-DP layer trained and reported "DP guarantee holds: NO"; under ``--layer central-dp
--epsilon 4`` it trained, then the budget guard stopped the run (exit 3) although the
dry run had predicted an epsilon below 4; the layer was calibrated as if DP-SGD spent
nothing; ``--dpsgd-epsilon`` did not exist.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from secagg.cli import EXIT_ERROR, EXIT_OK, main
from secagg.layers import Plaintext
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.dpsgd import DPSGD, make_private, planned_round_event
from secagg.privacy.events import GaussianEvent, SampledGaussianEvent
from secagg.privacy.layers import CentralDP

QUICK = ["--rounds", "1", "--local-epochs", "1", "--clients", "4", "--quiet"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from secagg.federation import Federation

    def refuse(self):  # noqa: ANN001, ANN202
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(Federation, "run", refuse)


def test_dpsgd_under_a_layer_without_noise_is_refused_up_front(tmp_path, no_training) -> None:
    # before: trained, then "DP guarantee holds: NO" (field n released without noise)
    code, out, err = run(["run", "--algorithm", "fedavg", "--dpsgd-noise", "1.0", *QUICK,
                          "--out", str(tmp_path / "r")])
    assert code == EXIT_ERROR and out == ""
    assert "could not end private" in err and "--layer central-dp" in err
    assert not (tmp_path / "r").exists()


def test_dpsgd_spending_the_whole_budget_is_refused_up_front(tmp_path, no_training) -> None:
    # before: trained, then the budget guard refused the first release (exit 3)
    code, _, err = run(["run", "--algorithm", "fedavg", "--dpsgd-noise", "1.0", "--layer",
                        "central-dp", "--epsilon", "4", "--rounds", "3", "--local-epochs",
                        "1", "--clients", "4", "--quiet", "--out", str(tmp_path / "r")])
    assert code == EXIT_ERROR, err
    spent = float(re.search(r"spends epsilon ([0-9.]+)", err).group(1))
    assert spent >= 4 and "--dpsgd-epsilon" in err


def test_dpsgd_epsilon_must_leave_the_layer_a_share(no_training) -> None:
    for extra in (["--dpsgd-epsilon", "4"], ["--dpsgd-epsilon", "1", "--dpsgd-noise", "2"]):
        code, _, err = run(["run", "--layer", "central-dp", "--epsilon", "4", *extra,
                            *QUICK, "--dry-run"])
        assert code == EXIT_ERROR, err


def test_dpsgd_cannot_share_a_client_level_budget(no_training) -> None:
    # before: a record-level DP-SGD spend was composed into a client-level epsilon
    code, _, err = run(["run", "--layer", "central-dp", "--adjacency", "client", "--epsilon",
                        "8", "--dpsgd-epsilon", "4", *QUICK, "--dry-run"])
    assert code == EXIT_ERROR and "record-level" in err


def test_planned_round_event_is_what_opacus_records() -> None:
    """The plan (made before training) equals the event a training records: rate
    1 / ceil(n / batch), epochs x ceil(n / batch) steps."""
    torch.manual_seed(0)
    n, batch, epochs = 100, 32, 2
    x, y = torch.randn(n, 4), torch.zeros(n, dtype=torch.long)
    model = nn.Linear(4, 2)
    cfg = DPSGD(1.3, 1.0)
    pt = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      DataLoader(TensorDataset(x, y), batch_size=batch), cfg)
    for _ in range(epochs):
        for xb, yb in pt.data_loader:
            pt.optimizer.zero_grad()
            if len(xb):
                x_ = xb.requires_grad_(True)
                nn.functional.cross_entropy(pt.module(x_), yb).backward()
            pt.optimizer.step()
    (done,) = pt.events()
    plan = planned_round_event(cfg, [n, 40], batch, epochs)  # 40 records: rate 1/2
    assert (done.sampling_rate, done.steps) == (0.25, 8)
    assert (plan.sampling_rate, plan.steps, plan.noise_multiplier) == (0.5, 8, 1.3)


def test_opacus_secure_rng_warning_is_not_shown() -> None:
    model = nn.Linear(3, 2)
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)),
                        batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                     DPSGD(1.0, 1.0))
    assert not [w for w in caught if "Secure RNG" in str(w.message)]


def test_layer_calibrated_to_what_the_prior_leaves() -> None:
    """A DP layer told of DP-SGD's per-round event adds more noise, and the composition of
    both over the run meets the layer's epsilon (without the prior it overshoots)."""
    sgd = SampledGaussianEvent(noise_multiplier=2.0, sampling_rate=0.5, steps=4)
    alone = CentralDP(Plaintext(), epsilon=4.0, rounds=2)
    shared = CentralDP(Plaintext(), epsilon=4.0, rounds=2)
    shared.plan_prior([sgd], 2)

    def composed(z: float) -> float:
        led = PrivacyLedger()
        led.extend([sgd] * 2 + [GaussianEvent(noise_multiplier=z)] * 2)
        return led.epsilon(1e-5)

    assert shared.noise_multiplier > alone.noise_multiplier
    assert composed(alone.noise_multiplier) > 4.0
    assert 3.9 < composed(shared.noise_multiplier) <= 4.0


def test_dry_run_counts_dpsgd_and_the_run_ends_private_at_its_target(tmp_path) -> None:
    args = ["run", "--layer", "central-dp", "--epsilon", "4", "--dpsgd-epsilon", "2",
            "--rounds", "2", "--local-epochs", "1", "--clients", "4", "--quiet"]
    code, plan, err = run([*args, "--dry-run"])
    assert code == EXIT_OK, err
    planned = float(plan.strip().splitlines()[-1].split()[-1])
    sgd = float(re.search(r"spends epsilon ([0-9.]+)", err).group(1))
    assert 1.9 < sgd <= 2.0 and 3.9 < planned <= 4.0
    code, out, err = run([*args, "--out", str(tmp_path / "r")])
    assert code == EXIT_OK, err
    assert re.search(r"DP guarantee holds\s+yes", out)
    spent = float(re.search(r"DP epsilon spent \(delta=1e-05, \w+\)\s+([0-9.]+) of budget 4",
                            out).group(1))
    assert 2.0 < spent <= planned
