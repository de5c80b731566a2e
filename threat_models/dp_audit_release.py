"""The audit of one release: both worlds (without and with the canary) drawn in
batches, scored by each statistic, and turned into lower bounds on epsilon in either
mode; the audit's result, and its empirical trade-off curve."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from threat_models.dp_audit_gdp import AuditError
from threat_models.dp_audit_statistics import (
    SELECTION_FRACTION,
    Statistic,
    TestOutcome,
    gdp_fit,
    shift_statistic,
    threshold_test,
)

DEFAULT_DELTA = 1e-5
#: Audit modes: ``tight`` (the GDP test and the threshold tests), ``threshold`` (the
#: assumption-free threshold tests only).
MODES = ("tight", "threshold")
#: In the tight mode, the share of 1 - confidence spent on the GDP fit (the threshold
#: tests, which catch non-Gaussian defects such as a biased low bit, share the rest).
GDP_ALPHA_SHARE = 0.8


#: A batched release: (with_canary, n, rng) -> n observations (first axis: trials).
BatchRelease = Callable[[bool, int, np.random.Generator], np.ndarray]
#: One release: (with_canary, rng) -> one observation (a number or an array).
Release = Callable[[bool, np.random.Generator], Any]


@dataclasses.dataclass
class AuditResult:
    """What an audit measured.

    Attributes:
        mechanism: what was audited (e.g. ``central-dp``, ``distributed-dp/skellam``).
        epsilon_claimed: the epsilon the mechanism promises at ``delta``.
        epsilon_lower: the largest lower bound over the tests (valid with probability
            >= ``confidence``, the tests sharing it).
        delta: the delta of the claim.
        confidence: 1 - alpha.
        trials: releases per world (without / with canary).
        canary: the canary, in words.
        tests: each test's outcome (each at level alpha / len(tests)); its ``mode`` says
            which bound it is (``gdp``: tight, ``threshold``: assumption-free).
        seconds: wall time of the audit.
        details: facts of the mechanism (noise std, ring bits, ...).
        curve: the best statistic's empirical trade-off curve on the evaluation split
            (``{"fpr": [...], "fnr": [...]}``, :func:`tradeoff_curve`), for plots.
    """

    mechanism: str
    epsilon_claimed: float
    epsilon_lower: float
    delta: float
    confidence: float
    trials: int
    canary: str
    tests: list[TestOutcome]
    seconds: float = 0.0
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    curve: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def violated(self) -> bool:
        """True when the audit proves the claim false (lower bound above the claim)."""
        return self.epsilon_lower > self.epsilon_claimed

    @property
    def best(self) -> TestOutcome:
        """The test that gave the lower bound."""
        return max(self.tests, key=lambda t: t.epsilon_lower)

    def row(self) -> dict[str, Any]:
        """A JSON-able row (the ``--json`` output)."""
        return {
            "mechanism": self.mechanism, "epsilon_claimed": self.epsilon_claimed,
            "epsilon_lower": self.epsilon_lower, "delta": self.delta,
            "confidence": self.confidence, "trials": self.trials, "canary": self.canary,
            "test": self.best.statistic, "mode": self.best.mode,
            "mu_lower": self.best.mu_lower, "violated": self.violated,
            "ratio": self.epsilon_lower / self.epsilon_claimed if self.epsilon_claimed else None,
            "tests": [dataclasses.asdict(t) for t in self.tests],
            "seconds": round(self.seconds, 3), "details": self.details,
        }


def _world_rng(seed: int | None, world: int, batch: int) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else [seed, world, batch])


def _progress(total: int, desc: str, progress: bool | None) -> Any:
    """A tqdm bar on a terminal (or when asked), else None."""
    show = sys.stderr.isatty() if progress is None else progress
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="release", file=sys.stderr, leave=False)


def _batches(trials: int, batch: int) -> Iterator[int]:
    left = trials
    while left > 0:
        yield min(batch, left)
        left -= min(batch, left)


def audit(draw: BatchRelease, *, epsilon: float, delta: float = DEFAULT_DELTA,
          trials: int = 1_000_000, statistics: Sequence[Statistic] | None = None,
          confidence: float = 0.95, seed: int | None = 0, mechanism: str = "release",
          canary: str = "canary", batch: int = 1 << 18, progress: bool | None = None,
          selection_fraction: float = SELECTION_FRACTION,
          details: dict[str, Any] | None = None, mode: str = "threshold") -> AuditResult:
    """Audit a batched release against its claim (epsilon, delta).

    ``draw(with_canary, n, rng)`` returns n independent releases of the mechanism on the
    canary-free (False) or canary (True) input, first axis trials. Each world gets
    ``trials`` releases, drawn in batches of ``batch`` with ``rng`` seeded from (``seed``,
    world, batch) (the mechanism may use its own generator for its noise). Every statistic
    (default: :func:`shift_statistic`) is tested with :func:`threshold_test`; in
    ``mode="tight"`` (for the Gaussian-family layers; not the default here, where the
    mechanism is unknown) the first statistic also gets :func:`gdp_fit` (the tight
    bound, under the Gaussian-trade-off assumption of :mod:`threat_models.dp_audit_gdp`)
    at level :data:`GDP_ALPHA_SHARE` x (1 - confidence), the threshold tests sharing the
    rest; ``mode="threshold"`` (default) runs the assumption-free threshold tests only,
    sharing 1 - confidence. The shares add up to 1 - confidence (Bonferroni), so the largest bound,
    reported with the ``mode`` of the test that gave it, holds at ``confidence``.

    Raises:
        AuditError: bad parameters, or a release that returns the wrong number of trials.
    """
    return audit_modes(draw, epsilon=epsilon, delta=delta, trials=trials,
                       statistics=statistics, confidence=confidence, seed=seed,
                       mechanism=mechanism, canary=canary, batch=batch, progress=progress,
                       selection_fraction=selection_fraction, details=details,
                       modes=(mode,))[mode]


def audit_modes(draw: BatchRelease, *, epsilon: float, delta: float = DEFAULT_DELTA,
                trials: int = 1_000_000, statistics: Sequence[Statistic] | None = None,
                confidence: float = 0.95, seed: int | None = 0, mechanism: str = "release",
                canary: str = "canary", batch: int = 1 << 18, progress: bool | None = None,
                selection_fraction: float = SELECTION_FRACTION,
                details: dict[str, Any] | None = None, modes: Sequence[str] = MODES
                ) -> dict[str, AuditResult]:
    """:func:`audit` in each of ``modes`` on the same draws (one audit per mode, each at
    ``confidence``; the benchmark compares the modes this way). Each result's ``seconds``
    is the drawing time plus its own evaluation."""
    _check_claim(epsilon, delta, trials, confidence)
    for mode in modes:
        if mode not in MODES:
            raise AuditError(f"mode must be one of {MODES}, got {mode!r}")
    stats_ = list(statistics) if statistics is not None else [shift_statistic()]
    if not stats_:
        raise AuditError("audit needs at least one test statistic")
    t0 = time.perf_counter()
    bar = _progress(2 * trials, f"dp-audit {mechanism}", progress)
    worlds: list[np.ndarray] = []
    try:
        for world, with_canary in enumerate((False, True)):
            parts = []
            for b, n in enumerate(_batches(trials, batch)):
                obs = np.asarray(draw(with_canary, n, _world_rng(seed, world, b)))
                if obs.ndim == 0 or obs.shape[0] != n:
                    raise AuditError(f"{mechanism}: the release returned {obs.shape} "
                                     f"observations for {n} trials")
                parts.append(obs)
                if bar is not None:
                    bar.update(n)
            worlds.append(np.concatenate(parts))
    finally:
        if bar is not None:
            bar.close()
    scores = [(s.score(worlds[0]), s.score(worlds[1])) for s in stats_]
    drawn = time.perf_counter() - t0
    out = {}
    for mode in modes:
        t1 = time.perf_counter()
        tests = _tests(scores, stats_, mode, delta, 1.0 - confidence, selection_fraction)
        lower = max(t.epsilon_lower for t in tests)
        best = max(range(len(tests)), key=lambda i: tests[i].epsilon_lower)
        names = [s.name for s in stats_]
        s0, s1 = scores[names.index(tests[best].statistic)]
        curve = tradeoff_curve(s0[int(s0.size * selection_fraction):],
                               s1[int(s1.size * selection_fraction):], tests[best].side)
        out[mode] = AuditResult(mechanism, float(epsilon), lower, float(delta),
                                float(confidence), int(trials), canary, tests,
                                drawn + time.perf_counter() - t1, dict(details or {}), curve)
    return out


def _tests(scores: list[tuple[np.ndarray, np.ndarray]], stats_: list[Statistic], mode: str,
           delta: float, alpha: float, selection_fraction: float) -> list[TestOutcome]:
    """The tests of ``mode`` on each statistic's scores, sharing ``alpha`` (Bonferroni)."""
    share = GDP_ALPHA_SHARE if mode == "tight" else 0.0
    tests = [threshold_test(s0, s1, delta=delta, alpha=alpha * (1.0 - share) / len(stats_),
                            selection_fraction=selection_fraction, statistic=s.name)
             for s, (s0, s1) in zip(stats_, scores, strict=True)]
    if mode == "tight":
        tests.insert(0, gdp_fit(*scores[0], delta=delta, alpha=alpha * share,
                                statistic=stats_[0].name))
    return tests


def tradeoff_curve(without: np.ndarray, with_: np.ndarray, side: str = ">=",
                   points: int = 200) -> dict[str, list[float]]:
    """The empirical trade-off curve of the threshold tests on scores ``without`` /
    ``with_``: FPR and FNR at up to ``points`` thresholds (quantiles of the pooled scores,
    plus the two ends), for the tests that say "canary" on ``side`` of the threshold."""
    a = np.asarray(without, dtype=np.float64).ravel()
    b = np.asarray(with_, dtype=np.float64).ravel()
    if side == "<=":
        a, b = -a, -b
    pooled = np.concatenate([a, b])
    t = np.unique(np.concatenate([np.quantile(pooled, np.linspace(0, 1, points)),
                                  [np.inf]]))
    a.sort()
    b.sort()
    fpr = (a.size - np.searchsorted(a, t, "left")) / a.size
    fnr = np.searchsorted(b, t, "left") / b.size
    return {"fpr": fpr.tolist(), "fnr": fnr.tolist()}


def audit_release(release: Release, *, epsilon: float, delta: float = DEFAULT_DELTA,
                  trials: int = 1000, **kwargs: Any) -> AuditResult:
    """Audit a release given one run at a time: ``release(with_canary, rng)`` returns the
    observation of one run (a number or an array, the same shape every run). Each run
    gets its own generator; keyword arguments as :func:`audit`.

    This is the interface for releases that cannot be batched (a training run, an
    algorithm's round, client-level DP-FedAvg's clipped and noised model update)."""
    base = kwargs.pop("seed", 0)

    def draw(with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        seeds = rng.integers(0, 2**63 - 1, size=n)
        return np.stack([np.asarray(release(with_canary, np.random.default_rng(int(s))),
                                    dtype=np.float64) for s in seeds])

    kwargs.setdefault("batch", 64)
    return audit(draw, epsilon=epsilon, delta=delta, trials=trials, seed=base, **kwargs)


def _check_claim(epsilon: float, delta: float, trials: int, confidence: float) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise AuditError(f"epsilon must be a positive number, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise AuditError(f"delta must be in (0, 1), got {delta!r}")
    if not (isinstance(trials, (int, np.integer)) and trials >= 8):
        raise AuditError(f"trials must be an integer >= 8, got {trials!r}")
    if not 0.0 < confidence < 1.0:
        raise AuditError(f"confidence must be in (0, 1), got {confidence!r}")
