"""Data-dependent (individual) privacy filters: each round charged from the client's actual
clipped update, through a Renyi or Gaussian-DP filter that stops the client exactly
before its budget is crossed. Their figures stay on the client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.client_ledger.epsilon import _check_delta
from secagg.privacy.events import positive_or_none


class UnsoundFilter(PrivacyError):
    """A data-dependent (individual) filter that no theorem makes sound, e.g. PLD."""


#: The individual filters with a soundness theorem for adaptively chosen, data-dependent
#: per-round losses: Renyi (Feldman and Zrnic, NeurIPS 2021) and Gaussian DP (Smith and
#: Thakurta 2022; Koskela, Tobaben and Honkela, ICLR 2023).
FILTER_KINDS: tuple[str, ...] = ("rdp", "gdp")


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP (Dong, Roth, Su 2022, Cor. 2.13):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0:
        return 0.0
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * _phi(-epsilon / mu - mu / 2)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu for which mu-GDP implies (epsilon, delta)-DP (bisection)."""
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) < delta:
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            break
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with mu-GDP => (epsilon, delta)-DP (bisection)."""
    if mu <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class IndividualFilter:
    """A per-client filter charging each round from the client's actual clipped update:
    a Gaussian release with per-field noise sigma_f charges mu_t = sqrt(sum_f
    ||u_f||^2 / sigma_f^2) (its individual sensitivity over the noise). The filter lets a
    round through only while the total stays within budget, so the client is stopped
    exactly before its budget would be crossed; after that it sends zeros (under a secure
    sum, a masked zero the server cannot tell apart), which is what a neighbour without
    its data sends, so the filter theorem applies.

    * ``"gdp"``: sum mu_t^2 <= mu_B^2, mu_B the mu-GDP that gives (epsilon, delta) (fully
      adaptive GDP composition, Smith and Thakurta 2022; the individual GDP filter of
      Koskela et al., ICLR 2023).
    * ``"rdp"``: at one order a, sum a mu_t^2 / 2 <= epsilon - log(1/delta) / (a - 1)
      (Feldman and Zrnic, NeurIPS 2021, Renyi filter).

    ``"pld"`` is refused (:class:`UnsoundFilter`). Such epsilons depend on the client's
    data: they stay on the client (its state), never in the server's result, logs or
    transcript. No amplification by sampling is used.
    """

    kind: str
    epsilon: float
    delta: float
    order: float = 32.0

    def __post_init__(self) -> None:
        if self.kind == "pld":
            raise UnsoundFilter(
                "a data-dependent filter cannot use the PLD accountant: no filter theorem "
                "bounds an adaptively stopped composition of data-dependent privacy loss "
                "distributions; use 'rdp' (Feldman and Zrnic 2021) or 'gdp' (Koskela et al. "
                "2023)")
        if self.kind not in FILTER_KINDS:
            raise PrivacyError(f"filter kind must be one of {FILTER_KINDS}, got {self.kind!r}")
        positive_or_none("client budget epsilon", self.epsilon)
        _check_delta(self.delta)
        if not (isinstance(self.order, (int, float)) and self.order > 1):
            raise PrivacyError(f"RDP order must be > 1, got {self.order!r}")
        if self.capacity <= 0:
            raise PrivacyError(f"an RDP filter at order {self.order:g} has no room for "
                               f"epsilon {self.epsilon:g} at delta {self.delta:g}: "
                               "log(1/delta)/(order - 1) exceeds it; raise the order")

    @property
    def capacity(self) -> float:
        """The filter's budget: mu_B^2 (GDP) or the RDP at its order."""
        if self.kind == "gdp":
            return gdp_mu(self.epsilon, self.delta) ** 2
        return self.epsilon - math.log(1 / self.delta) / (self.order - 1)

    def cost(self, mu: float) -> float:
        """What a round of individual GDP ``mu`` charges."""
        return mu * mu if self.kind == "gdp" else self.order * mu * mu / 2

    def spent_epsilon(self, spent: float) -> float:
        """The (epsilon at this filter's delta) of a charge total ``spent``."""
        if self.kind == "gdp":
            return gdp_epsilon(math.sqrt(max(spent, 0.0)), self.delta)
        return spent + math.log(1 / self.delta) / (self.order - 1) if spent > 0 else 0.0

    def check_layer(self, layer: Any) -> None:
        """Refuse a layer whose release is not one Gaussian per round (the filter charges
        each round's individual Gaussian): CentralDP without a tree, or LocalDP.

        Raises:
            ConfigurationError: another layer."""
        from secagg.errors import ConfigurationError
        from secagg.privacy.layers import CentralDP, LocalDP

        if not (isinstance(layer, LocalDP) or (isinstance(layer, CentralDP)
                                               and not layer.tree)):
            raise ConfigurationError(
                "an individual filter charges a Gaussian release per round: it needs "
                "CentralDP (without a tree) or LocalDP, not "
                f"{getattr(layer, 'name', type(layer).__name__)!r}")

    def step(self, state: dict[str, Any], mu: float) -> bool:
        """Charge a round of individual ``mu`` to ``state`` (the client's own: ``spent``,
        ``halted``) if it fits; returns whether the round may be released. Once a round
        does not fit, the client halts for good."""
        if state.get("halted"):
            return False
        spent = float(state.get("spent", 0.0))
        if spent + self.cost(mu) > self.capacity:
            state["halted"] = True
            return False
        state["spent"] = spent + self.cost(mu)
        return True


def individual_mu(layer: Any, spec: Any, values: Mapping[str, Any]) -> float:
    """A round's individual GDP for one client's upload ``values`` under the Gaussian DP
    ``layer`` (CentralDP without a tree, or LocalDP): sqrt(sum_f ||u_f||^2 / sigma_f^2)
    over the noised fields.

    Raises:
        PrivacyError: a layer whose noise is not one Gaussian per release."""
    import numpy as np

    from secagg.privacy.layers import CentralDP, LocalDP

    if isinstance(layer, LocalDP):
        sigmas, _ = layer.noise_plan(spec)
    elif isinstance(layer, CentralDP) and not layer.tree:
        sigmas = layer.planned_sum_sigmas(spec, 1)
    else:
        raise PrivacyError(f"an individual filter needs a Gaussian release per round "
                           f"(CentralDP without a tree, or LocalDP), not "
                           f"{getattr(layer, 'name', type(layer).__name__)!r}")
    total = 0.0
    for name, sigma in sigmas.items():
        v = np.asarray(values[name], dtype=np.float64)
        total += float(np.sum(v * v)) / (sigma * sigma)
    return math.sqrt(total)
