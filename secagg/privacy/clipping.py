"""Client-level clipping of model updates (DP-FedAvg) and its adaptive variant.

DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018) bounds what one client can move the
global model by: each client uploads its *update* (local model minus the broadcast model)
scaled down to L2 norm <= C, with weight 1, so one client's whole contribution to the sum
has L2 norm <= C. That is a client-level sensitivity C whatever the client's data or
training (no ``max_records`` is needed), and a DP layer noising the sum with multiplier z
adds noise of standard deviation z * C.

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021, "Differentially
private learning with adaptive clipping") lets C follow a target quantile gamma of the
clients' update norms. Each client also uploads b = 1[||update|| <= C] (sent centred as
b - 1/2, so one client moves the sum by at most 1/2); the server reads the noised fraction
b_bar of clients under the clip and sets

    C <- C * exp(-eta * (b_bar - gamma))

(the geometric update of the paper's Algorithm 1). The count is a DP release like the
update: it travels in the same upload, through the same layer, and a DP layer noises it
with its share of the release's budget (:attr:`secagg.messages.Field.dp_weight`).

This module is the pure part: the clip itself (:func:`clip_l2`), the two policies
(:class:`FixedClip`, :class:`AdaptiveClip`, immutable configuration) and the parser of the
CLI's ``--clip`` value. The algorithms (``algorithms.fedavg``) call them in their client and
server steps, so the same code runs on every runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError

__all__ = ["AdaptiveClip", "ClipPolicy", "FixedClip", "clip_l2", "parse_clip"]


def clip_l2(vector: np.ndarray, bound: float,
            dtype: str = "float64") -> tuple[np.ndarray, float, bool]:
    """Scale ``vector`` down to L2 norm <= ``bound``.

    Returns ``(clipped, norm, was_clipped)``: ``clipped`` is ``vector * min(1, bound /
    norm)`` cast to ``dtype`` (``"float64"`` or ``"float32"``), with its norm *after* the
    cast still <= ``bound`` (a float32 rounding that lands above it is scaled back);
    ``norm`` is the input's L2 norm. A non-finite entry is refused (its norm is undefined),
    so an upload can never carry NaN past the clip.

    Raises:
        ConfigurationError: ``bound`` is not a positive finite number, or ``vector`` has a
            non-finite entry.
    """
    if not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0):
        raise ConfigurationError(f"clip bound must be a positive number, got {bound!r}")
    v = np.asarray(vector, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ConfigurationError("cannot clip an update with a non-finite entry")
    if dtype not in ("float64", "float32"):
        raise ConfigurationError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    norm = float(np.linalg.norm(v))
    was = norm > bound
    out = (v * (bound / norm) if was else v).astype(dtype)
    # a product or a cast may land a rounding error above the bound: scale back if so
    for _ in range(4):
        n2 = float(np.linalg.norm(out.astype(np.float64)))
        if n2 <= bound:
            return out, norm, was
        shrink = 1e-6 if dtype == "float32" else 1e-15
        out = (out.astype(np.float64) * (bound / n2) * (1.0 - shrink)).astype(dtype)
    raise AssertionError("clip did not converge")  # pragma: no cover


@dataclass(frozen=True)
class ClipPolicy:
    """How the clip bound C of a DP-FedAvg upload is chosen (see the module docstring)."""

    def initial(self) -> float:
        """C for the first round."""
        raise NotImplementedError

    @property
    def adaptive(self) -> bool:
        """True when C follows the clients' update norms through a noised count."""
        return False

    def describe(self) -> dict[str, Any]:
        """JSON-able description."""
        raise NotImplementedError


@dataclass(frozen=True)
class FixedClip(ClipPolicy):
    """A fixed clip bound C (McMahan et al. 2018)."""

    clip: float

    def __post_init__(self) -> None:
        c = self.clip
        if isinstance(c, bool) or not (isinstance(c, (int, float)) and math.isfinite(c)
                                       and c > 0):
            raise ConfigurationError(f"clip must be a positive number, got {c!r}")

    def initial(self) -> float:
        """The fixed C."""
        return float(self.clip)

    def describe(self) -> dict[str, Any]:
        """``{"kind": "fixed", "clip": C}``."""
        return {"kind": "fixed", "clip": float(self.clip)}


@dataclass(frozen=True)
class AdaptiveClip(ClipPolicy):
    """C follows the ``quantile`` of the clients' update norms (Andrew et al. 2021).

    Args:
        quantile: target fraction gamma of clients whose update is not clipped (paper: 0.5).
        initial_clip: C in the first round (paper: 0.1).
        lr: eta of the geometric update ``C <- C exp(-eta (b_bar - gamma))`` (paper: 0.2).
        count_weight: the count field's share of each release's DP budget relative to the
            update's (weight 1): the count's noise is about sqrt(1/count_weight) times the
            update's in multiplier terms. The paper sets the count noise to m/20 for m
            clients per round; the default 0.01 costs the update under 0.5% more noise.
    """

    quantile: float = 0.5
    initial_clip: float = 0.1
    lr: float = 0.2
    count_weight: float = 0.01

    def __post_init__(self) -> None:
        checks = (("quantile", self.quantile, 0.0, 1.0), ("lr", self.lr, 0.0, math.inf),
                  ("count_weight", self.count_weight, 0.0, math.inf))
        for name, v, lo, hi in checks:
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and lo < v < hi):
                raise ConfigurationError(f"adaptive clip {name} must be in ({lo}, {hi}), "
                                         f"got {v!r}")
        FixedClip(self.initial_clip)  # validates

    def initial(self) -> float:
        """``initial_clip``."""
        return float(self.initial_clip)

    @property
    def adaptive(self) -> bool:
        """True."""
        return True

    def next_clip(self, clip: float, fraction_unclipped: float) -> float:
        """C for the next round from the noised fraction b_bar of clients under the clip
        (b_bar may fall outside [0, 1] through the noise; it is used as is, as in the
        paper, so the update stays an unbiased post-processing of the release)."""
        return float(clip * math.exp(-self.lr * (float(fraction_unclipped) - self.quantile)))

    def describe(self) -> dict[str, Any]:
        """The policy's parameters."""
        return {"kind": "adaptive", "quantile": self.quantile,
                "initial_clip": self.initial_clip, "lr": self.lr,
                "count_weight": self.count_weight}


def parse_clip(value: str | float | ClipPolicy | None) -> ClipPolicy | None:
    """The clip policy a user asked for: None (no clipping: the algorithm's classic
    upload), a number C (:class:`FixedClip`), ``"adaptive"`` or ``"adaptive:QUANTILE"``
    (:class:`AdaptiveClip`), or a policy object as is.

    Raises:
        ConfigurationError: anything else, with the accepted forms.
    """
    if value is None or isinstance(value, ClipPolicy):
        return value
    if isinstance(value, bool):
        raise ConfigurationError(f"clip must be a number or 'adaptive[:QUANTILE]', got {value!r}")
    if isinstance(value, (int, float)):
        return FixedClip(float(value))
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "adaptive":
            return AdaptiveClip()
        if text.startswith("adaptive:"):
            try:
                q = float(text.split(":", 1)[1])
            except ValueError:
                q = math.nan
            if not 0.0 < q < 1.0:
                raise ConfigurationError(
                    f"adaptive clip quantile must be a number in (0, 1), got {value!r}")
            return AdaptiveClip(quantile=q)
        try:
            return FixedClip(float(text))
        except ValueError:
            pass
    raise ConfigurationError(
        f"clip must be a positive number C or 'adaptive[:QUANTILE]', got {value!r}")
