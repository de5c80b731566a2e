"""A client's budget per observer, and the admission check it runs before a round touches
its data: the projected epsilons with the round's declared terms added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from secagg.errors import PrivacyError
from secagg.privacy.client_ledger.epsilon import ObserverEpsilon, client_epsilons
from secagg.privacy.client_ledger.events import OBSERVERS, ClientEvent
from secagg.privacy.events import positive_or_none


@dataclass(frozen=True)
class ClientBudget:
    """A client's epsilon budget per observer (None: no budget against that observer).

    A client holding a ``server`` budget refuses every round that gives no guarantee
    against the server (CentralDP, un-noised releases)."""

    release: float | None = None
    server: float | None = None

    def __post_init__(self) -> None:
        positive_or_none("client budget release", self.release)
        positive_or_none("client budget server", self.server)

    @property
    def observers(self) -> dict[str, float]:
        """Observer -> budget, for the observers that have one."""
        return {o: v for o in OBSERVERS if (v := getattr(self, o)) is not None}

    @classmethod
    def parse(cls, specs: str | Sequence[str]) -> ClientBudget:
        """From CLI text: ``"EPS"`` (every observer), ``"server=EPS"``,
        ``"release=EPS"``, or several of these (a list, or comma-separated).

        Raises:
            PrivacyError: an unknown observer or a value that is not a positive number."""
        items = [specs] if isinstance(specs, str) else list(specs)
        parts = [p.strip() for it in items for p in str(it).split(",") if p.strip()]
        if not parts:
            raise PrivacyError("an empty client budget")
        got: dict[str, float] = {}
        for p in parts:
            name, _, value = p.rpartition("=")
            targets = OBSERVERS if not name else (name.strip(),)
            for t in targets:
                if t not in OBSERVERS:
                    raise PrivacyError(f"client budget observer must be one of {OBSERVERS}, "
                                       f"got {t!r} (in {p!r})")
                try:
                    got[t] = float(value)
                except ValueError:
                    raise PrivacyError(f"client budget {p!r}: {value!r} is not a "
                                       "number") from None
        return cls(**got)

    def to_dict(self) -> dict[str, float | None]:
        """JSON-able form."""
        return {"release": self.release, "server": self.server}


@dataclass(frozen=True)
class Admission:
    """The answer of :func:`admit`: whether the client may take part in the round, its
    projected epsilon per observer with the round added, and why it refuses."""

    admitted: bool
    projected: dict[str, float | None]
    reason: str = ""


def _terms_list(terms: ClientEvent | Sequence[ClientEvent]) -> list[ClientEvent]:
    return [terms] if isinstance(terms, ClientEvent) else list(terms)


def project(history: Sequence[ClientEvent], terms: ClientEvent | Sequence[ClientEvent],
            delta: float) -> dict[str, ObserverEpsilon]:
    """Each observer's epsilon if the client took part in the round ``terms`` declares
    (one event, or one per phase of the round; each charged as an upload, whatever its
    ``action``)."""
    return client_epsilons(
        [*history, *(replace(t, action="uploaded") for t in _terms_list(terms))], delta)


def admit(history: Sequence[ClientEvent], terms: ClientEvent | Sequence[ClientEvent],
          budget: ClientBudget | None, delta: float, policy: Any | None = None) -> Admission:
    """The check a client runs before it touches its data in a round: refuse terms against
    its ``policy`` (a :class:`~secagg.privacy.policy.NodePolicy`), then refuse when the
    projected epsilon against an observer it holds a budget for is above that budget, or
    has no guarantee. Data-independent: the answer depends on the declared terms and the
    history only, so a refusal reveals nothing about the client's data.

    Args:
        history: the client's events so far (every run).
        terms: the round as the server declared it (noise, sampling, cohort...): one
            event, or one per phase of the round.
        budget: the client's budget (None: no budget, only the policy is checked).
        delta: the delta its budget is stated at.
        policy: the client's NodePolicy, or None.
    """
    if policy is not None:
        try:
            for t in _terms_list(terms):
                policy.check_terms(t)
        except PrivacyError as exc:
            return Admission(False, {}, f"policy: {exc}")
    if budget is None or not budget.observers:
        return Admission(True, {})
    eps = project(history, terms, delta)
    projected = {o: e.epsilon for o, e in eps.items()}
    for o, limit in budget.observers.items():
        e = eps[o]
        if e.epsilon is None:
            return Admission(False, projected, f"no guarantee against the {o}: {e.reason}")
        if e.epsilon > limit:
            return Admission(False, projected,
                             f"taking part would bring epsilon against the {o} to "
                             f"{e.epsilon:.4g} at delta={delta:g}, above its budget "
                             f"{limit:g}")
    return Admission(True, projected)
