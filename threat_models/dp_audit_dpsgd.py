"""DP-SGD (Opacus through :mod:`secagg.privacy.dpsgd`) audited with gradient canaries:
multi-run (:func:`audit_dpsgd`) and in one run with many canaries
(:func:`audit_dpsgd_one_run`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from threat_models.dp_audit_bounds import one_run_epsilon, one_run_guess, one_run_half
from threat_models.dp_audit_release import DEFAULT_DELTA, AuditResult, audit_release
from threat_models.dp_audit_statistics import TestOutcome


def _dpsgd_run(config: Any, included: np.ndarray, *, steps: int, lr: float,
               canary_norm: float, records: int, torch_seed: int) -> np.ndarray:
    """One DP-SGD training through :func:`secagg.privacy.dpsgd.make_private` of a linear
    model (no bias, zero init, loss (w.x - y)^2 / 2) on ``records`` ordinary records and
    one gradient canary per True entry of ``included``.

    Canary i has feature ``e_i`` (its own coordinate, which no ordinary record touches)
    and label ``-canary_norm``: its gradient is ``(w_i + canary_norm) e_i``, ``canary_norm e_i``
    at the start and close to it over a few small steps, so with ``canary_norm`` well
    above the clip it is clipped to the clip norm, and coordinate i of the
    trained weights moves by the clipped canary gradient plus noise. An excluded canary
    is the zero record (gradient 0), so both worlds have the same dataset size and
    Opacus divides by the same expected batch size. Ordinary records live in the other
    coordinates. Full-batch Poisson sampling (rate 1). Returns, per canary, its
    coordinate of (initial - final) weights over lr: the sum over steps of the noised,
    clipped gradient sums over the expected batch size."""
    import warnings

    with warnings.catch_warnings():
        # Opacus warns that its own secure RNG is off (secagg's generator draws the noise)
        # and torch about backward hooks, on every training
        warnings.filterwarnings("ignore", module=r"opacus(\.|$)")
        warnings.filterwarnings("ignore", message=r".*(backward hook|Secure RNG).*")
        return _dpsgd_train(config, included, steps=steps, lr=lr, canary_norm=canary_norm,
                            records=records, torch_seed=torch_seed)


def _dpsgd_train(config: Any, included: np.ndarray, *, steps: int, lr: float,
                 canary_norm: float, records: int, torch_seed: int) -> np.ndarray:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from secagg.privacy.dpsgd import make_private

    m = included.size
    d = m + 4
    g = torch.Generator().manual_seed(torch_seed)
    xs = [torch.cat([torch.zeros(records, m), torch.randn(records, 4, generator=g)], 1)]
    ys = [torch.randn(records, generator=g)]
    # one row per canary: e_i and label -canary_norm when included, else the zero record
    # (feature 0, label 0: gradient 0, so it adds nothing to the sum) -- the dataset size,
    # hence Opacus' normalisation by the expected batch size, is the same in both worlds
    inc = torch.as_tensor(np.asarray(included, dtype=bool))
    xs.append(torch.eye(m, d) * inc[:, None])
    ys.append(torch.where(inc, -float(canary_norm), 0.0))
    x, y = torch.cat(xs), torch.cat(ys)
    model = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x))
    pt = make_private(model, opt, loader, config, stream=torch_seed)
    for _ in range(steps):
        for xb, yb in pt.data_loader:
            pt.optimizer.zero_grad()
            if len(xb):
                loss = ((pt.module(xb).squeeze(-1) - yb) ** 2).sum() / 2.0
                loss.backward()
            pt.optimizer.step()
    w = next(pt.module.parameters()).detach().numpy().ravel()
    # weights only ever move by -lr * (noised clipped sum / expected batch size)
    return -w[:m].astype(np.float64) / lr


def _dpsgd_claim(noise_multiplier: float, steps: int, delta: float) -> float:
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.events import SampledGaussianEvent

    ledger = PrivacyLedger(delta=delta)
    ledger.spend(SampledGaussianEvent(noise_multiplier=noise_multiplier, sampling_rate=1.0,
                                      steps=steps, label="dp-sgd"))
    return float(ledger.epsilon(delta))


def audit_dpsgd(*, noise_multiplier: float, max_grad_norm: float = 1.0, steps: int = 1,
                delta: float = DEFAULT_DELTA, trials: int = 400, seed: int = 0,
                canary_norm: float = 10.0, records: int = 8, lr: float = 0.1,
                confidence: float = 0.95, progress: bool | None = None,
                mode: str = "tight") -> AuditResult:
    """Multi-run audit of DP-SGD (record level): ``trials`` trainings without and with one
    gradient canary (:func:`_dpsgd_run`), the test statistic the canary coordinate's total
    update. The claim is the ledger's epsilon for the trainings' event (full batch,
    ``steps`` steps at ``noise_multiplier``: no sampling, so the update is Gaussian and the
    tight ``mode`` applies). Every training is real Opacus (per-sample
    clipping, noise from secagg's generator seeded per run)."""
    from secagg.privacy.dpsgd import DPSGD

    claimed = _dpsgd_claim(noise_multiplier, steps, delta)
    counter = [0]

    def release(with_canary: bool, rng: np.random.Generator) -> float:
        counter[0] += 1
        config = DPSGD(noise_multiplier, max_grad_norm, seed=int(rng.integers(2**31)))
        out = _dpsgd_run(config, np.array([with_canary]), steps=steps, lr=lr,
                         canary_norm=canary_norm, records=records, torch_seed=counter[0])
        return float(out[0])

    res = audit_release(release, epsilon=claimed, delta=delta, trials=trials, seed=seed,
                        confidence=confidence, mechanism="dp-sgd",
                        canary=f"gradient canary (norm {canary_norm:g} before the clip "
                               f"{max_grad_norm:g})", progress=progress, mode=mode,
                        details={"noise_multiplier": noise_multiplier, "steps": steps,
                                 "max_grad_norm": max_grad_norm, "sampling_rate": 1.0})
    return res


def audit_dpsgd_one_run(*, noise_multiplier: float, max_grad_norm: float = 1.0,
                        steps: int = 1, delta: float = DEFAULT_DELTA, canaries: int = 1000,
                        guesses: int | None = None, seed: int = 0, canary_norm: float = 10.0,
                        records: int = 8, lr: float = 0.1, confidence: float = 0.95
                        ) -> AuditResult:
    """One-run audit of DP-SGD (Steinke, Nasr, Jagielski, NeurIPS 2023): ``canaries``
    gradient canaries, each included with probability 1/2 (auditor's seeded coin), one
    training; the auditor guesses "included" for the ``guesses // 2`` canaries with the
    largest update on their coordinate and "excluded" for the ``guesses // 2`` smallest,
    counts the correct guesses v, and reports the largest epsilon that
    :func:`one_run_p_value` rejects at 1 - confidence. The one-run bound is loose by
    design (a single training gives the mechanism many chances to hide a canary);
    it costs one training instead of thousands."""
    from secagg.privacy.dpsgd import DPSGD

    k = one_run_half(canaries, guesses)
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 1])
    included = rng.random(canaries) < 0.5
    config = DPSGD(noise_multiplier, max_grad_norm, seed=int(rng.integers(2**31)))
    score = _dpsgd_run(config, included, steps=steps, lr=lr, canary_norm=canary_norm,
                       records=records, torch_seed=seed)
    r, v = one_run_guess(score, included, k)
    lower = one_run_epsilon(canaries, r, v, delta, 1.0 - confidence)
    claimed = _dpsgd_claim(noise_multiplier, steps, delta)
    test = TestOutcome("one-run", lower, float("nan"), "top/bottom", r - v, r, 0, canaries)
    return AuditResult("dp-sgd (one run)", claimed, lower, float(delta), float(confidence),
                       1, f"{canaries} gradient canaries, {r} guesses, {v} correct",
                       [test], time.perf_counter() - t0,
                       {"noise_multiplier": noise_multiplier, "steps": steps,
                        "canaries": canaries, "guesses": r, "correct": v})
