"""Empirical privacy auditing: a lower bound on epsilon, measured on the real mechanism.

A DP layer promises that its release is (epsilon, delta)-DP. An audit tests that promise:
it runs the mechanism many times on two neighbouring inputs -- without and with a
*canary* (one record, or one client, at its declared bound, in the direction that helps
the test most) -- and tries to tell the two apart from the output alone. Any test's error
rates bound epsilon from below (Kairouz, Oh, Viswanath 2015; the audits of Jagielski,
Ullman, Oprea 2020 and Nasr et al. 2021, 2023):

    if M is (epsilon, delta)-DP, every test has  FPR + e^epsilon FNR >= 1 - delta  and
    e^epsilon FPR + FNR >= 1 - delta, so

    epsilon >= eps_lb = max( ln((1 - delta - FNR) / FPR),  ln((1 - delta - FPR) / FNR) ).

That is the **threshold** mode (assumption-free). The **tight** mode (:func:`gdp_fit`,
:mod:`threat_models.dp_audit_gdp`) fits Gaussian DP to both worlds' whole score
distributions and bounds mu from below; its epsilon assumes the Gaussian trade-off shape,
which the layers' Gaussian, discrete-Gaussian and Skellam noise has. :func:`audit` runs the
threshold tests (and, in ``mode="tight"``, the fit too, sharing the confidence);
:func:`audit_modes` evaluates both modes on the same draws.

The rates are measured, so the bound uses one-sided Clopper-Pearson upper bounds FPR_ub,
FNR_ub (each at level alpha/2, so both hold with probability >= 1 - alpha, and then
eps_lb computed from them is still below the true epsilon). The threshold of each test is
chosen on a *selection split* of the trials and the bound is computed on the rest, so the
choice does not bias it; when several test statistics are tried, alpha is split between
them (Bonferroni). A reported lower bound above the claimed epsilon is therefore, at the
stated confidence, proof that the mechanism is not (epsilon, delta)-DP.

Test statistics (a user gets all that apply to the mechanism):

* ``shift`` -- the output itself (the likelihood-ratio test for Gaussian noise; exposes
  noise or sensitivity that is too small, and a clip that is not applied);
* ``parity`` -- the low bit of the integer output of an integer mechanism (a sampler
  whose low bit is biased reveals a canary whose integer shift is odd, so the canary is
  placed one quantisation step inside its bound when that makes the shift odd);
* ``exact`` -- whether the integer output equals a noise-free sum exactly (the signature
  of noise dropped where adding it would wrap around the ring: a pure modular wrap of
  the noised sum is post-processing and cannot raise epsilon, but noise that is skipped or
  saturated per client near the wrap leaves the un-noised value in the clear).

Audits here, apart from the pure math above:

* :func:`audit` -- any *batched* release ``draw(with_canary, n, rng) -> n observations``;
  :func:`audit_release` -- any single release ``release(with_canary, rng) -> observation``
  looped.
* :class:`SumRelease` / :func:`audit_sum` -- CentralDP, LocalDP or DistributedDP on a bare
  bounded sum, through the layers' own noise paths (``CentralDP.release``,
  ``LocalDP.noise_plan``/``noise_upload``, ``DistributedDP.release_plan``/``encode_noised``
  /``finish``) and samplers; ``n`` releases of the 1-coordinate sum are drawn as one
  ``n``-coordinate release with the 1-coordinate release's plan (same noise level, ring
  and encoding per coordinate, checked against a scalar release through ``aggregate``).
* :mod:`threat_models.dp_audit_fedavg` -- client-level DP-FedAvg with a crafted canary
  update (multi-run and one-run), through the real clip, upload check, layer and server
  step; :mod:`threat_models.dp_audit_adaptive` -- the same with adaptive clipping's count;
  :mod:`threat_models.dp_audit_tree` -- DP-FTRL's tree noise;
  :mod:`threat_models.dp_audit_fields` -- several fields released together;
  :mod:`threat_models.dp_audit_bugs` -- injected 10-30% miscalibrations
  (:mod:`threat_models.dp_audit_run` runs them all, for ``secagg dp-audit``).
* :func:`audit_dpsgd` (multi-run) and :func:`audit_dpsgd_one_run` (Steinke, Nasr and
  Jagielski, NeurIPS 2023) -- DP-SGD through :mod:`secagg.privacy.dpsgd` (Opacus) with
  gradient canaries.

``secagg dp-audit`` is the command line (:func:`main_cli`).

The audits live in one module per part, all importable from here: the math
(:mod:`threat_models.dp_audit_bounds`), the test statistics and tests
(:mod:`threat_models.dp_audit_statistics`), the audit of a release
(:mod:`threat_models.dp_audit_release`), the DP layers on a sum
(:mod:`threat_models.dp_audit_sum`), DP-SGD (:mod:`threat_models.dp_audit_dpsgd`) and
the output (:mod:`threat_models.dp_audit_output`). The command line's defaults stay here.
"""

from __future__ import annotations

from threat_models.dp_audit_bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_from_counts,
    epsilon_from_rates,
    one_run_epsilon,
    one_run_p_value,
)
from threat_models.dp_audit_dpsgd import audit_dpsgd, audit_dpsgd_one_run
from threat_models.dp_audit_gdp import AuditError
from threat_models.dp_audit_output import allowed_fnr, format_table, plot_tradeoff
from threat_models.dp_audit_release import (
    DEFAULT_DELTA,
    GDP_ALPHA_SHARE,
    MODES,
    AuditResult,
    BatchRelease,
    Release,
    audit,
    audit_modes,
    audit_release,
    tradeoff_curve,
)
from threat_models.dp_audit_statistics import (
    SELECTION_FRACTION,
    Statistic,
    TestOutcome,
    exact_statistic,
    gdp_fit,
    parity_statistic,
    shift_statistic,
    threshold_test,
)
from threat_models.dp_audit_sum import (
    DEFAULT_CLIENTS,
    FIELD,
    LAYER_NAMES,
    PHASE,
    SURVIVOR_PATTERNS,
    LayerClaim,
    SumRelease,
    audit_sum,
    composed_ring,
    composition_holds,
    dropout_pattern,
    encoded_sum,
    make_layer,
    skellam_sum_holds,
)

__all__ = [
    "AuditError",
    "AuditResult",
    "Statistic",
    "SumRelease",
    "TestOutcome",
    "allowed_fnr",
    "audit",
    "audit_dpsgd",
    "audit_modes",
    "audit_dpsgd_one_run",
    "audit_release",
    "audit_sum",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_from_rates",
    "format_table",
    "make_layer",
    "one_run_epsilon",
    "one_run_p_value",
    "plot_tradeoff",
    "threshold_test",
    "tradeoff_curve",
]

#: Names importable from here as before the split (besides ``__all__``).
_REEXPORTED = (DEFAULT_DELTA, GDP_ALPHA_SHARE, MODES, SELECTION_FRACTION, BatchRelease,
               Release, LayerClaim, exact_statistic, gdp_fit, parity_statistic,
               shift_statistic, DEFAULT_CLIENTS, FIELD, PHASE, SURVIVOR_PATTERNS,
               composed_ring, composition_holds, dropout_pattern, encoded_sum,
               skellam_sum_holds)


# ---------------------------------------------------------------------------------------
# Command line (``secagg dp-audit``; secagg.cli parses, this runs).

#: Exit status of ``secagg dp-audit`` when some lower bound exceeds its claim.
EXIT_VIOLATED = 6
DPSGD_TRIALS = 1000
#: Releases per world of the multi-run DP-FedAvg audit by default.
FEDAVG_TRIALS = 100_000
#: Trees (of 8 rounds) per world of the DP-FTRL audit by default.
FTRL_TRIALS = 250_000
#: Releases per world of the command line's DistributedDP sum with all survivors.
SURVIVORS_ALL_TRIALS = 250_000
#: What ``secagg dp-audit --release`` audits the DP layers on.
RELEASES = ("sum", "dp-fedavg", "dp-fedavg-adaptive")


ALL_LAYERS = (*LAYER_NAMES, "dp-ftrl", "dp-sgd")
