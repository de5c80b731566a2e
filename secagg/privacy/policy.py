"""A client's own privacy floor: the weakest DP terms it accepts from a server.

Under LocalDP and DistributedDP the noise is the client's to add, and under DP-FedAvg so is
the clip. The parameters come from the server (a Flower ServerApp ships them with each
instruction), so a server that wanted to see more could ask for less noise or a looser
clip. A :class:`NodePolicy` is what the client holds against that: before its step
touches its data it checks the instruction's terms and refuses (a typed error, so the node
drops and sends nothing) any that are weaker than its floor.

On Flower the policy comes from the node's config (``flower-supernode --node-config``):

==============================  ===========================================================
key                             meaning
==============================  ===========================================================
``dp-min-noise-multiplier``     refuse client-added noise with a multiplier below this
``dp-max-clip``                 refuse a DP-FedAvg clip bound above this
``dp-required``                 ``true``: refuse any instruction that asks this node to add
                                no noise (a ServerApp that drops the DP layer altogether)
==============================  ===========================================================

A multiplier of zero or below is refused whatever the policy (no DP layer can be rebuilt
from it, :func:`secagg.privacy.layers.node_layer`).

:meth:`NodePolicy.check_terms` applies the same floor to a round's declared terms as a
client ledger keeps them (:class:`~secagg.privacy.client_ledger.ClientEvent`), and refuses
besides any claim of amplification by sampling against the server: in secagg the server
always learns the cohort, so no such amplification holds against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from secagg.errors import PrivacyError

__all__ = ["NodePolicy"]


def positive_or_none(what: str, v: Any) -> float | None:
    """``v`` as a float when it is a finite number > 0, None when it is None; anything else
    raises :class:`PrivacyError` naming ``what`` (e.g. "node policy max_clip")."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
            math.isfinite(v) and v > 0):
        raise PrivacyError(f"{what} must be a positive number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class NodePolicy:
    """The weakest terms a client accepts (None: no floor of that kind).

    Args:
        min_noise_multiplier: the least noise multiplier z of noise this client adds.
        max_clip: the largest DP-FedAvg clip bound it applies.
        dp_required: refuse an instruction that asks it to add no noise at all.
    """

    min_noise_multiplier: float | None = None
    max_clip: float | None = None
    dp_required: bool = False

    def __post_init__(self) -> None:
        positive_or_none("node policy min_noise_multiplier", self.min_noise_multiplier)
        positive_or_none("node policy max_clip", self.max_clip)
        if not isinstance(self.dp_required, bool):
            raise PrivacyError(f"node policy dp_required must be True or False, got "
                               f"{self.dp_required!r}")

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any]) -> NodePolicy:
        """The policy in a Flower node config (keys in the module docstring; absent keys:
        no floor)."""
        required = config.get("dp-required", False)
        if isinstance(required, str):
            if required.lower() not in ("true", "false"):
                raise PrivacyError(f"node config dp-required must be true or false, got "
                                   f"{required!r}")
            required = required.lower() == "true"
        return cls(min_noise_multiplier=config.get("dp-min-noise-multiplier"),
                   max_clip=config.get("dp-max-clip"), dp_required=required)

    def check(self, dp: Mapping[str, Any] | None, clip: float | None) -> None:
        """Refuse terms weaker than this policy, before the client touches its data.

        Args:
            dp: the noise parameters this client is told to add with (the DP layer's
                :meth:`~secagg.privacy.layers._DPLayer.node_params`), or None when it is
                told to add none.
            clip: the clip bound it is told to apply, or None.

        Raises:
            PrivacyError: naming the term and the floor it breaks.
        """
        if dp is None:
            if self.dp_required:
                raise PrivacyError("this node adds DP noise to everything it sends "
                                   "(dp-required), but the instruction asks for none")
        elif self.min_noise_multiplier is not None:
            z = dp.get("noise_multiplier")
            if isinstance(z, bool) or not isinstance(z, (int, float)) or not (
                    z >= self.min_noise_multiplier):
                raise PrivacyError(
                    f"noise multiplier {z!r} is below this node's floor "
                    f"{self.min_noise_multiplier:g} (dp-min-noise-multiplier)")
        if clip is not None and self.max_clip is not None and not clip <= self.max_clip:
            raise PrivacyError(f"clip bound {clip:g} is above this node's ceiling "
                               f"{self.max_clip:g} (dp-max-clip)")

    def check_terms(self, terms: Any) -> None:
        """Refuse a round's declared terms (a
        :class:`~secagg.privacy.client_ledger.ClientEvent`) that break this policy: noise
        below the floor, a clip above the ceiling, no noise under ``dp_required``, or a
        claim of amplification by sampling against the server (which learns the cohort).

        Raises:
            PrivacyError: naming the term and the rule it breaks.
        """
        if getattr(terms, "server_amplification", False):
            raise PrivacyError(
                "the terms claim amplification by sampling against the server, but the "
                "server learns the cohort: no such amplification holds against it")
        z = getattr(terms, "noise_multiplier", None)
        dp = None if z is None and not getattr(terms, "events", ()) else {
            "noise_multiplier": z}
        self.check(dp, getattr(terms, "clip", None))
