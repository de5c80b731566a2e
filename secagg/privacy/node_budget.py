"""A Flower node's own budget: the release it is asked for, as a client ledger event, and
the admission it runs before its step touches its data.

A Flower node holds its budget in its node config (``flower-supernode --node-config``):

========================  ===================================================================
key                       meaning
========================  ===================================================================
``ledger-path``           the node's ledger file (:mod:`secagg.privacy.node_ledger`): every
                          release it takes part in is charged there, across runs and restarts
``client-budget``         epsilon per observer (:class:`~secagg.privacy.client_ledger.
                          ClientBudget`): ``"server=3.0"``, ``"server=3,release=8"``, or a
                          bare number (every observer); needs ``ledger-path``
``client-budget-delta``   the delta of the node's epsilons (default 1e-5): the node's own,
                          never the one the server declares
========================  ===================================================================

The event a release is charged as (:func:`node_event`) is built from the instruction alone
-- the run, round, phase and the DP terms the node is told to add noise with -- so the node
(in its ledger) and the server (in its transcript) build the same event from the same
message, and ``secagg audit --node-ledger`` can compare them.

What a node can account for itself:

* ``local-dp``: the node adds Gaussian noise of multiplier z to its own upload: one Gaussian
  event (z), against the server and every later observer.
* no noise from the node (no DP layer, CentralDP whose noise the server adds, or a layer
  the node does not rebuild): no guarantee the node can vouch for; the event has no
  mechanism, and a node holding a budget refuses it.
* ``distributed-dp``: the protection comes from the survivors' shares together. The node
  derives the secure sum's release plan itself, before its step, from the phase's spec
  (public shapes and bounds), the cohort size and the layer's parameters (as it must to
  encode its share), and is charged the plan's worst case: the shares of the fewest
  survivors the secure sum accepts (with fewer, nothing is released). No colluders are
  assumed, as in the run's own figure. How many survivors the node sizes its share for
  is the node's choice (``sizing``): ``"pinned"``, the server's count, which the node checks
  before it unmasks (at least that many distinct pinned clients signed the survivor set);
  ``"alone"`` (``dp-noise-alone``), one: its own share carries the whole noise, whatever
  the server claims; ``"server"`` (neither), the server's word: the event then says in
  ``assumes`` that its figure rests on the server following the protocol (a server that
  invents clients shrinks every share), and a node holding a floor refuses it
  (:meth:`~secagg.privacy.policy.NodePolicy.check_release`).

A release that leaves some of the upload's fields un-noised (the terms declare them
``public``) gives those fields no guarantee: no figure is claimed. A noise seed fixed by
the server (the ``seed`` of the terms, for reproducible runs) makes
the noise known to it: no figure is claimed, and a node holding a budget refuses.

A node's budget is for its whole contribution (client-level adjacency): terms accounted
at record level are refused by a node that holds one.

No amplification by sampling is claimed: a Flower cohort is a fixed-size draw the server
makes and knows, and a node does not see the rounds it was not drawn for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from secagg.errors import PrivacyError
from secagg.layers.registry import node_rebuilt
from secagg.messages import UploadSpec
from secagg.privacy.client_ledger import (
    OBSERVERS,
    Admission,
    ClientBudget,
    ClientEvent,
    admit,
    event_to_dict,
)
from secagg.privacy.policy import SERVER_WORD

__all__ = ["DEFAULT_DELTA", "SIZINGS", "budget_from_node_config", "node_admit", "node_event"]

#: How a node sizes its DistributedDP noise share (see the module docstring).
SIZINGS = ("server", "pinned", "alone")

#: The delta of a node's budget when its config names none.
DEFAULT_DELTA = 1e-5

_NOT_DERIVED = ("distributed-dp share events need the phase's spec, the cohort and the "
                "secure sum's parameters: not given, so no figure is claimed")


def budget_from_node_config(config: Mapping[str, Any]) -> tuple[ClientBudget, float] | None:
    """The node's budget and its delta from a Flower node config (keys in the module
    docstring); None when ``client-budget`` is absent.

    Raises:
        PrivacyError: a malformed budget or delta.
    """
    raw = config.get("client-budget")
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise PrivacyError(f"node config client-budget must be a number or "
                           f"'observer=eps,...', got {raw!r}")
    budget = ClientBudget.parse(str(raw))
    delta = config.get("client-budget-delta", DEFAULT_DELTA)
    try:
        d = float(delta) if not isinstance(delta, bool) else -1.0
    except (TypeError, ValueError):
        d = -1.0
    if not 0 < d < 1:
        raise PrivacyError(f"node config client-budget-delta must be in (0, 1), got "
                           f"{delta!r}")
    return budget, d


def node_event(client: int | str, run: str, round: int, phase: str,
               dp: str | Mapping[str, Any] | None, *, action: str = "uploaded",
               clip: float | None = None, reason: str = "",
               spec: UploadSpec | None = None, cohort: int | None = None,
               layer: str | None = None, sizing: str = "server") -> ClientEvent:
    """The event of one release as the instruction declares it (see the module
    docstring): ``dp`` is the instruction's noise parameters (JSON text or a mapping;
    None when the node adds no noise). Under ``distributed-dp``, with the phase's
    ``spec``, the ``cohort`` size and the secure sum's ``layer`` parameters (JSON text, as
    the instruction carries them), the events are the release plan's worst case: the
    shares of the fewest survivors the secure sum accepts (fewer, and it releases
    nothing); without them, no figure is claimed. ``sizing``: how the node sized its
    share (``"server"``, ``"pinned"`` or ``"alone"``; see the module docstring)."""
    if sizing not in SIZINGS:
        raise PrivacyError(f"share sizing must be one of {SIZINGS}, got {sizing!r}")
    params = json.loads(dp) if isinstance(dp, str) else (None if dp is None else dict(dp))
    base: dict[str, Any] = dict(client=str(client), run=str(run), round=int(round),
                                phase=str(phase), action=action, clip=clip, reason=reason,
                                sampling="fixed")
    if params is None:
        why = "the node added no noise: no guarantee it can vouch for"
        return ClientEvent(**base, unprotected={o: why for o in OBSERVERS})
    if not isinstance(params, Mapping):
        raise PrivacyError(f"DP parameters must be a mapping, got {type(params).__name__}")
    kind = str(params.get("layer", ""))
    z = params.get("noise_multiplier")
    adjacency = params.get("adjacency", "client")
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not z > 0:
        raise PrivacyError(f"DP parameters: noise multiplier {z!r} is not positive")
    base.update(layer=kind, noise_multiplier=float(z), adjacency=adjacency)
    if params.get("seed") is not None:  # the noise is a function of a seed the server sent
        why = (f"the noise seed is fixed ({params['seed']!r}) and known to the server: "
               "whoever knows it can subtract the noise")
        return ClientEvent(**base, unprotected={o: why for o in OBSERVERS})
    bare = _unnoised(params, layer, spec)
    if bare:  # fields the node is told to release without noise
        why = f"fields released without noise: {bare}"
        return ClientEvent(**base, unprotected={o: why for o in OBSERVERS})
    if kind == "local-dp":
        return ClientEvent(**base, events=({"mechanism": "gaussian",
                                            "noise_multiplier": float(z), "count": 1},))
    if kind == "distributed-dp" and spec is not None and cohort is not None \
            and layer is not None:
        plan = _distributed_plan(params, layer, spec, cohort,
                                 1 if sizing == "alone" else None)
        assumes = {"alone": "", "pinned": (
            f"pinned identities (a PKI): this node unmasks only after at least {plan.worst} "
            "distinct pinned clients signed the survivor set"),
            "server": (f"{SERVER_WORD}: the cohort of {int(cohort)} and the {plan.worst} "
                       "survivors each share is sized for are the server's word (no pinned "
                       "identities count them)")}[sizing]
        return ClientEvent(**base, cohort=int(cohort), min_survivors=plan.worst,
                           events=tuple(event_to_dict(e) for e in plan.planned),
                           assumes=assumes)
    why = _NOT_DERIVED if kind == "distributed-dp" else (
        f"layer {kind!r}: the node does not add this noise itself")
    return ClientEvent(**base, unprotected={o: why for o in OBSERVERS})


def _unnoised(params: Mapping[str, Any], layer: str | None,
              spec: UploadSpec | None) -> list[str]:
    """The fields of ``spec`` the terms leave un-noised (declared public; the layer's own
    :meth:`~secagg.privacy.layers._DPLayer.unnoised_fields`); without a spec, every name
    the terms declare public (a conservative reading)."""
    if spec is None:
        return sorted(str(p) for p in params.get("public", []) or [])
    if node_rebuilt(params.get("layer")) is None:  # no node rebuilds (and noises) it
        return []
    from secagg.privacy.release import node_noiser

    rec = {"dp": json.dumps(dict(params))}
    if layer is not None:
        rec["layer"] = layer
    return sorted(node_noiser(rec).unnoised_fields(spec))


def _distributed_plan(params: Mapping[str, Any], layer: str, spec: UploadSpec,
                      cohort: int, share_survivors: int | None = None) -> Any:
    """DistributedDP's release plan for ``cohort`` clients (what the node and the server
    both derive, :meth:`~secagg.privacy.layers.DistributedDP.release_plan`; with
    ``share_survivors``, the node's share sized for that many survivors)."""
    from secagg.privacy.release import node_noiser

    noiser: Any = node_noiser({"dp": json.dumps(dict(params)), "layer": layer})
    return noiser.release_plan(spec, int(cohort), share_survivors)


def node_admit(charged: Sequence[Mapping[str, Any]], event: ClientEvent,
               budget: ClientBudget, delta: float) -> Admission:
    """Whether the node may take part in ``event`` given the events its ledger charges
    (``charged``: :meth:`ClientEvent.to_dict` payloads, every run, crashes included):
    :func:`secagg.privacy.client_ledger.admit` on them. A node's budget is for its whole
    contribution, so a release accounted at record-level adjacency (declared now, or
    charged before) is refused: its figure does not bound the node's loss.

    Raises:
        PrivacyError: a charged payload that is not a client event (the ledger holds
            something this node cannot account for: it refuses rather than guess).
    """
    history = [ClientEvent.from_dict(p) for p in charged]
    loose = [e for e in (*history, event) if e.adjacency != "client"
             and e.action in ("uploaded", "dropped")]
    if loose:  # a record-level figure bounds one record, not the node's contribution
        return Admission(False, {}, f"round {loose[0].round} ({loose[0].phase}) is accounted "
                         f"at {loose[0].adjacency}-level adjacency: it bounds one record, not "
                         "this node's whole contribution, which its budget is for")
    return admit(history, event, budget, delta)
