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
``dp-max-epsilon``              refuse a release whose epsilon against the server, as this
                                node would be charged it, is above this
``dp-max-delta``                refuse terms whose delta is above this
``dp-min-cohort``,              refuse a cohort size ``n`` outside these bounds (the size
``dp-max-cohort``               DistributedDP sizes each noise share for)
``dp-allow-server-seed``        ``true``: accept a noise seed the server chose (reproducible
                                noise, for testing only: the server can subtract it)
``dp-public-fields``            comma-separated field names this node accepts to release
                                without noise (others declared ``public`` are refused)
``dp-adjacency``                the weakest adjacency accepted: ``client`` (default) or
                                ``record``
``dp-noise-alone``              ``true``: under DistributedDP, add this node's whole noise
                                itself (its share sized for one survivor) rather than trust
                                the server's cohort (:mod:`secagg.privacy.node_budget`)
==============================  ===========================================================

A multiplier of zero or below is refused whatever the policy (no DP layer can be rebuilt
from it, :func:`secagg.privacy.layers.node_layer`).

A node *holds a floor* when it sets any of ``dp-required``, ``dp-min-noise-multiplier`` or
``dp-max-epsilon``. Such a node checks the whole instruction, not the multiplier alone:
a server-chosen noise seed, fields declared public (unless listed), record-level adjacency
(unless allowed) and a delta or cohort out of bounds are refused; so is a DistributedDP
release whose noise rests on the server's word for the number of survivors
(:meth:`NodePolicy.check_release`: the node must pin its peers' identities, and then
checks their signatures before it unmasks, or add its whole noise itself). A node without
a floor accepts the terms it is told; its ledger says what they guarantee.

:meth:`NodePolicy.check_terms` applies the same floor to a round's declared terms as a
client ledger keeps them (:class:`~secagg.privacy.client_ledger.ClientEvent`), and refuses
besides any claim of amplification by sampling against the server: in secagg the server
always learns the cohort, so no such amplification holds against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.events import positive_or_none

__all__ = ["SERVER_WORD", "NodePolicy"]


def _flag(config: Mapping[str, Any], key: str) -> bool:
    v = config.get(key, False)
    if isinstance(v, str):
        if v.lower() not in ("true", "false"):
            raise PrivacyError(f"node config {key} must be true or false, got {v!r}")
        return v.lower() == "true"
    if not isinstance(v, bool):
        raise PrivacyError(f"node config {key} must be true or false, got {v!r}")
    return v


def _count(what: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PrivacyError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


#: the server's word for the survivors: what a DistributedDP event assumes when the node
#: neither pinned its peers nor added its whole noise (:mod:`secagg.privacy.node_budget`)
SERVER_WORD = "the server following the protocol"


@dataclass(frozen=True)
class NodePolicy:
    """The weakest terms a client accepts (None: no floor of that kind; see the module
    docstring for the node config keys).

    Args:
        min_noise_multiplier: the least noise multiplier z of noise this client adds.
        max_clip: the largest DP-FedAvg clip bound it applies.
        dp_required: refuse an instruction that asks it to add no noise at all.
        max_epsilon: the largest epsilon against the server one release may charge.
        max_delta: the largest delta of the terms.
        min_cohort, max_cohort: the bounds on the cohort size ``n`` it is told.
        allow_server_seed: accept a noise seed the server chose (testing only).
        public_fields: the fields it accepts to release without noise.
        adjacency: the weakest adjacency accepted (``"client"`` or ``"record"``).
        noise_alone: under DistributedDP, size its share for one survivor.
    """

    min_noise_multiplier: float | None = None
    max_clip: float | None = None
    dp_required: bool = False
    max_epsilon: float | None = None
    max_delta: float | None = None
    min_cohort: int | None = None
    max_cohort: int | None = None
    allow_server_seed: bool = False
    public_fields: tuple[str, ...] = ()
    adjacency: str = "client"
    noise_alone: bool = False

    def __post_init__(self) -> None:
        positive_or_none("node policy min_noise_multiplier", self.min_noise_multiplier)
        positive_or_none("node policy max_clip", self.max_clip)
        positive_or_none("node policy max_epsilon", self.max_epsilon)
        if self.max_delta is not None and not (
                isinstance(self.max_delta, (int, float)) and not isinstance(self.max_delta, bool)
                and 0 < self.max_delta < 1):
            raise PrivacyError(f"node policy max_delta must be in (0, 1), got "
                               f"{self.max_delta!r}")
        _count("node policy min_cohort", self.min_cohort)
        _count("node policy max_cohort", self.max_cohort)
        for name in ("dp_required", "allow_server_seed", "noise_alone"):
            if not isinstance(getattr(self, name), bool):
                raise PrivacyError(f"node policy {name} must be True or False, got "
                                   f"{getattr(self, name)!r}")
        if self.adjacency not in ("client", "record"):
            raise PrivacyError(f"node policy adjacency must be 'client' or 'record', got "
                               f"{self.adjacency!r}")
        if not all(isinstance(f, str) and f for f in self.public_fields):
            raise PrivacyError(f"node policy public_fields must be field names, got "
                               f"{self.public_fields!r}")

    @property
    def holds_floor(self) -> bool:
        """Whether this node holds a DP floor (then it checks the whole instruction)."""
        return self.dp_required or self.min_noise_multiplier is not None \
            or self.max_epsilon is not None

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any]) -> NodePolicy:
        """The policy in a Flower node config (keys in the module docstring; absent keys:
        no floor)."""
        public = config.get("dp-public-fields", "")
        if not isinstance(public, str):
            raise PrivacyError(f"node config dp-public-fields must be comma-separated "
                               f"names, got {public!r}")
        delta = config.get("dp-max-delta")
        if isinstance(delta, str):
            try:
                delta = float(delta)
            except ValueError:
                raise PrivacyError(f"node config dp-max-delta must be a number, got "
                                   f"{delta!r}") from None
        return cls(min_noise_multiplier=config.get("dp-min-noise-multiplier"),
                   max_clip=config.get("dp-max-clip"),
                   dp_required=_flag(config, "dp-required"),
                   max_epsilon=config.get("dp-max-epsilon"), max_delta=delta,
                   min_cohort=config.get("dp-min-cohort"),
                   max_cohort=config.get("dp-max-cohort"),
                   allow_server_seed=_flag(config, "dp-allow-server-seed"),
                   public_fields=tuple(p.strip() for p in public.split(",") if p.strip()),
                   adjacency=str(config.get("dp-adjacency", "client")),
                   noise_alone=_flag(config, "dp-noise-alone"))

    def check(self, dp: Mapping[str, Any] | None, clip: float | None,
              cohort: Any = None) -> None:
        """Refuse terms weaker than this policy, before the client touches its data.

        Args:
            dp: the noise parameters this client is told to add with (the DP layer's
                :meth:`~secagg.privacy.layers._DPLayer.node_params`), or None when it is
                told to add none.
            clip: the clip bound it is told to apply, or None.
            cohort: the cohort size ``n`` it is told (None: not told).

        Raises:
            PrivacyError: naming the term and the floor it breaks.
        """
        if cohort is not None:
            if isinstance(cohort, bool) or not isinstance(cohort, int) or cohort < 1:
                raise PrivacyError(f"cohort size {cohort!r} is not a positive integer")
            if self.max_cohort is not None and cohort > self.max_cohort:
                raise PrivacyError(f"cohort size {cohort} is above this node's bound "
                                   f"{self.max_cohort} (dp-max-cohort)")
            if self.min_cohort is not None and cohort < self.min_cohort:
                raise PrivacyError(f"cohort size {cohort} is below this node's bound "
                                   f"{self.min_cohort} (dp-min-cohort)")
        if dp is None:
            if self.dp_required:
                raise PrivacyError("this node adds DP noise to everything it sends "
                                   "(dp-required), but the instruction asks for none")
        else:
            if self.min_noise_multiplier is not None:
                z = dp.get("noise_multiplier")
                if isinstance(z, bool) or not isinstance(z, (int, float)) or not (
                        z >= self.min_noise_multiplier):
                    raise PrivacyError(
                        f"noise multiplier {z!r} is below this node's floor "
                        f"{self.min_noise_multiplier:g} (dp-min-noise-multiplier)")
            d = dp.get("delta", 1e-5)  # a layer rebuilt without one takes 1e-5
            if self.max_delta is not None and not (
                    isinstance(d, (int, float)) and not isinstance(d, bool)
                    and 0 < d <= self.max_delta):
                raise PrivacyError(f"delta {d!r} is above this node's bound "
                                   f"{self.max_delta:g} (dp-max-delta)")
            if self.holds_floor:
                self._check_whole(dp)
        if clip is not None and self.max_clip is not None and not clip <= self.max_clip:
            raise PrivacyError(f"clip bound {clip:g} is above this node's ceiling "
                               f"{self.max_clip:g} (dp-max-clip)")

    def _check_whole(self, dp: Mapping[str, Any]) -> None:
        """A node with a floor: the seed, the public fields and the adjacency."""
        if dp.get("seed") is not None and not self.allow_server_seed:
            raise PrivacyError(
                f"the noise seed {dp.get('seed')!r} is chosen by the server, which could "
                "then subtract the noise; this node draws its own (set dp-allow-server-seed"
                "=true only for reproducible tests)")
        public = dp.get("public") or []
        if not isinstance(public, (list, tuple)):
            raise PrivacyError(f"public must be a list of field names, got {public!r}")
        extra = sorted(str(p) for p in public if p not in self.public_fields)
        if extra:
            raise PrivacyError(
                f"fields {extra} are declared public (released without noise); this node "
                f"accepts only {list(self.public_fields)} (dp-public-fields)")
        adjacency = dp.get("adjacency", "client")
        if adjacency != "client" and self.adjacency == "client":
            raise PrivacyError(
                f"adjacency {adjacency!r}: the noise is sized for one record, not this "
                "node's whole contribution, which its floor is for (dp-adjacency=client)")

    def check_release(self, event: Any, delta: float | None = None) -> None:
        """Refuse a release whose event (the
        :class:`~secagg.privacy.client_ledger.ClientEvent` this node would be charged,
        :func:`~secagg.privacy.node_budget.node_event`) breaks this policy: an epsilon
        against the server above ``max_epsilon`` (at ``delta``: the policy's, else the
        terms', else 1e-5), and, for a node holding a floor, noise that rests on the
        server's word for the survivors (:data:`SERVER_WORD`).

        Raises:
            PrivacyError: naming the term and the rule it breaks.
        """
        if event is None:
            return
        if self.holds_floor and SERVER_WORD in getattr(event, "assumes", ""):
            raise PrivacyError(
                f"the noise share would be sized for {event.min_survivors} survivors on "
                "the server's word, which this node cannot check (a server that invents "
                "clients shrinks every share): pin the cohort's identities (pinned-keys) "
                "or add the whole noise on this node (dp-noise-alone=true)")
        if self.max_epsilon is not None:
            from secagg.privacy.client_ledger import server_epsilon

            d = delta if delta is not None else (self.max_delta or 1e-5)
            eps = server_epsilon([event], d).epsilon
            if eps is None:
                raise PrivacyError("this release has no epsilon against the server (no "
                                   "noise this node can vouch for), and this node bounds it "
                                   f"by {self.max_epsilon:g} (dp-max-epsilon)")
            if not eps <= self.max_epsilon:
                raise PrivacyError(f"this release would charge epsilon {eps:.4g} against "
                                   f"the server (delta {d:g}), above this node's bound "
                                   f"{self.max_epsilon:g} (dp-max-epsilon)")

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
