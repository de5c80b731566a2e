"""A Flower node's own privacy guard: its privacy floor from its node config (the policy
checked against each instruction and release), its node ledger (where it lives, its head,
whether it holds a budget), and the charge a release makes in it before anything leaves the
node. Used by the node (:mod:`secagg.flower.client`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context

from secagg.errors import PrivacyError, ProtocolError
from secagg.flower.node_identity import IDENTITY_KEY, PINNED_KEYS
from secagg.flower.records import field
from secagg.messages import UploadSpec
from secagg.privacy.node_ledger import LedgerError, NodeLedger, check_head, release_id
from secagg.privacy.policy import NodePolicy
from secagg.stages import Key


def _policy(context: Context) -> NodePolicy:
    """The node's own privacy floor from its node config (:mod:`secagg.privacy.policy`);
    a malformed one is a ProtocolError (the node drops rather than guess)."""
    try:
        return NodePolicy.from_node_config(context.node_config)
    except PrivacyError as exc:
        raise ProtocolError(f"node config: {exc}") from None


def _check_policy(policy: NodePolicy, rec: ConfigRecord, bcast: dict[str, np.ndarray],
                  pins: dict[int, bytes] | None = None) -> None:
    """Refuse an instruction whose terms are weaker than the node's floor (noise, seed,
    public fields, adjacency, delta, clip, cohort bounds; :meth:`NodePolicy.check`): the
    node adds the noise under LocalDP and DistributedDP and applies the clip, so a
    ServerApp cannot lower either below what the node accepts. With pinned identities a
    cohort larger than the clients pinned is refused too (the server would be inventing
    clients). The refusal is an error reply: the node drops and sends nothing."""
    try:
        dp = json.loads(field(rec, Key.DP, str)) if Key.DP in rec else None
        clip = float(np.asarray(bcast["clip"]).ravel()[0]) if "clip" in bcast else None
        n = rec.get(Key.N)
        policy.check(dp, clip, cohort=n)
        if pins is not None and isinstance(n, int) and n > len(pins):
            raise PrivacyError(f"a cohort of {n} clients, but only {len(pins)} are pinned "
                               f"({PINNED_KEYS}): the server counts clients that do not exist")
    except (PrivacyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"instruction refused by this node's privacy policy: {exc}") \
            from None


def _check_release(policy: NodePolicy, rec: ConfigRecord, spec: UploadSpec, client: int,
                   sizing: str) -> None:
    """Refuse the release the instruction asks for when the event this node would be
    charged for it breaks its policy (:meth:`NodePolicy.check_release`: its epsilon, and
    noise resting on the server's word), before the step touches the data."""
    if Key.DP not in rec or not policy.holds_floor:  # nothing to hold the event against
        return
    from secagg.privacy.node_budget import node_event

    try:
        dp = json.loads(field(rec, Key.DP, str))
        event = node_event(client, field(rec, Key.RUN, str), field(rec, Key.ROUND, int),
                           field(rec, Key.PHASE, str), dp, spec=spec, cohort=rec.get(Key.N),
                           layer=rec.get(Key.LAYER), sizing=sizing)
        policy.check_release(event, dp.get("delta") if policy.max_delta is None else None)
    except (PrivacyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"instruction refused by this node's privacy policy: {exc}") \
            from None


#: node config keys of the node's own ledger and budget
LEDGER_PATH, CLIENT_BUDGET, BUDGET_DELTA = "ledger-path", "client-budget", "client-budget-delta"
#: node config keys of the ledger's head file (:mod:`secagg.privacy.node_ledger`) and of
#: the explicit start of a fresh ledger
LEDGER_HEAD, LEDGER_INIT = "ledger-head", "ledger-init"


def _head_path(context: Context, ledger: Path) -> Path:
    """Where the node keeps its ledger's head: ``ledger-head``, else beside its identity
    key (``identity-key``), else beside the ledger file (which catches a truncated or
    deleted file, not one at a new path: name ``ledger-head`` to keep it elsewhere)."""
    for key, suffix in ((LEDGER_HEAD, ""), (IDENTITY_KEY, ".ledger-head")):
        v = context.node_config.get(key)
        if v not in (None, ""):
            if not isinstance(v, str):
                raise ProtocolError(f"node config {key} must be a file path, got {v!r}")
            return Path(v + suffix).expanduser()
    return Path(f"{ledger}.head")


def _ledger_init(context: Context) -> bool:
    """Whether the node config starts a fresh ledger where none exists (``ledger-init``)."""
    v = context.node_config.get(LEDGER_INIT, False)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def _ledger_path(context: Context) -> Path | None:
    path = context.node_config.get(LEDGER_PATH)
    if path is None or path == "":
        return None
    if not isinstance(path, str):
        raise ProtocolError(f"node config {LEDGER_PATH} must be a file path, got {path!r}")
    return Path(path).expanduser()


_NO_EVALUATION = ("this node holds a privacy budget (client-budget): its local test "
                  "accuracy would leave it un-noised, outside the budget, so it does not "
                  "answer evaluation requests")


def _budgeted(context: Context) -> bool:
    """Whether the node holds a privacy budget (then nothing un-noised leaves it: no
    evaluation answers)."""
    return context.node_config.get(CLIENT_BUDGET) not in (None, "")


def _ledger_head(context: Context) -> str | None:
    """The head of the node's ledger file (None without one); a ledger that does not
    verify is an error reply (the node does not join a run it cannot account for)."""
    path = _ledger_path(context)
    if path is None:
        return None
    try:
        return check_head(path, _head_path(context, path), init=_ledger_init(context)).head
    except LedgerError as exc:
        raise ProtocolError(f"this node's privacy ledger: {exc}") from None


class _Charge:
    """The node's budget step around one client step (:mod:`secagg.privacy.node_ledger`,
    :mod:`secagg.privacy.node_budget`), opened by :func:`_charged`.

    :meth:`admit` runs after the phase is known and before its step touches the data: it
    refuses a release that would take the node's epsilon, projected under the terms the
    instruction declares over every release its ledger charges, past its budget (a
    ``refusal`` entry is written; nothing is charged), else writes and syncs the release's
    intent. :meth:`commit` runs after the step and returns the reply's ``ledger_head``.
    A step that fails after :meth:`admit` leaves the intent uncommitted: spent. Every
    refusal is a ProtocolError: an error reply, no array sent."""

    def __init__(self, context: Context, rec: ConfigRecord, client: int) -> None:
        self.rec, self.client, self.ledger = rec, client, None
        self.sizing = "server"  # how the node sizes a DistributedDP share (set by the caller)
        self.path = _ledger_path(context)
        from secagg.privacy.node_budget import budget_from_node_config

        try:
            self.budget = budget_from_node_config(context.node_config)
        except PrivacyError as exc:
            raise ProtocolError(f"node config: {exc}") from None
        if self.path is None:
            raise ProtocolError(f"node config {CLIENT_BUDGET} needs {LEDGER_PATH} (a budget "
                                "kept in memory would reset with the process)")
        self.run = field(rec, Key.RUN, str)
        self.round, self.phase = field(rec, Key.ROUND, int), field(rec, Key.PHASE, str)
        self.rid = release_id(self.run, self.round, self.phase)
        try:
            self.ledger = NodeLedger(self.path, _head_path(context, self.path),
                                     init=_ledger_init(context))
        except LedgerError as exc:
            raise ProtocolError(f"this node's privacy ledger: {exc}") from None
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        """Refuse a replay, and a file that holds another client's releases."""
        assert self.ledger is not None
        client = self.client
        if self.rid in self.ledger.state.intents():
            raise ProtocolError(
                f"release {self.rid} is already charged on this node's ledger (a replayed "
                "message): refused, neither charged nor answered again")
        others = {str(p.get("client")) for p in self.ledger.charged()} - {str(client)}
        if others:  # one file per node: another client's history is not this one's
            raise ProtocolError(f"this node's privacy ledger {self.path} holds releases of "
                                f"client(s) {sorted(others)}, this node is client "
                                f"{client}: give each node its own ledger-path")

    def admit(self, spec: UploadSpec) -> None:
        """Charge the release, or refuse it (see the class docstring); ``spec``: the
        phase's spec, with the run's public bounds (public: shapes and bounds only)."""
        from secagg.privacy.node_budget import node_admit, node_event

        assert self.ledger is not None
        rec = self.rec
        try:
            event = node_event(self.client, self.run, self.round, self.phase, rec.get(Key.DP),
                               spec=spec, cohort=rec.get(Key.N), layer=rec.get(Key.LAYER),
                               sizing=self.sizing)
            ok = None if self.budget is None else node_admit(
                self.ledger.charged(), event, *self.budget)
        except PrivacyError as exc:
            raise ProtocolError(f"this node's privacy ledger: {exc}") from None
        if ok is not None and not ok.admitted:
            self.ledger.refuse(self.rid, replace(event, action="refused",
                                                 reason=ok.reason).to_dict())
            raise ProtocolError(f"refused by this node's privacy budget: {ok.reason}")
        self.ledger.intend(self.rid, event.to_dict())  # synced: from here, spent

    def commit(self) -> dict[str, Any]:
        """After the step: commit the release; the reply's ``ledger_head``."""
        assert self.ledger is not None
        return {Key.LEDGER_HEAD: self.ledger.commit(self.rid, {"status": "uploaded"})}

    def close(self) -> None:
        """Release the ledger's lock."""
        if self.ledger is not None:
            self.ledger.close()


@contextmanager
def _charged(context: Context, rec: ConfigRecord, client: Callable[[], int]
             ) -> Iterator[_Charge | None]:
    """The node's :class:`_Charge` for one client step, or None when its config names
    neither a ledger nor a budget (then nothing is charged)."""
    if _ledger_path(context) is None and context.node_config.get(CLIENT_BUDGET) in (None, ""):
        yield None
        return
    charge = _Charge(context, rec, client())
    try:
        yield charge
    finally:
        charge.close()
