"""What a party or coalition actually observed in a run, read off its transcript.

:func:`view` filters a :class:`~secagg.transcript.Transcript` to the observations made by
the members of a coalition and condenses them per (phase, field) into a :class:`FieldView`:
which clients' uploads it saw in the clear, masked, encrypted or noised; whether it saw the
sum, and in what form; and the DP guarantee recorded for the field. Colluding clients also
know their own uploads (not in the transcript, since nobody sent it to them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from secagg.transcript import Transcript
from threat_models.coalition import Coalition


@dataclass
class FieldView:
    """A coalition's observations of one (phase, field).

    Attributes:
        phase, field: which field.
        uploads: form -> the clients whose individual uploads were seen in that form
            (``clear``, ``masked``, ``encrypted``, ``noised``).
        sums: form -> how many sums were seen in that form.
        rounds: the rounds with observations.
        epsilon: the DP epsilon recorded for this field (None: no DP guarantee recorded).
        own: the colluding clients' own uploads (they know them).
    """

    phase: str
    field: str
    uploads: dict[str, set[Any]] = field(default_factory=dict)
    sums: Counter = field(default_factory=Counter)
    rounds: set[int] = field(default_factory=set)
    epsilon: float | None = None
    own: set[int] = field(default_factory=set)

    @property
    def clear_uploads(self) -> set[Any]:
        """Clients whose individual upload was seen in the clear."""
        return set(self.uploads.get("clear", set()))

    @property
    def form(self) -> str:
        """The most revealing form in which single uploads were seen (``clear`` >
        ``noised`` > ``masked``/``encrypted``), or ``"sum only"`` / ``"nothing"``."""
        for f in ("clear", "noised", "masked", "encrypted"):
            if self.uploads.get(f):
                return f if f != "noised" or self.epsilon is None else \
                    f"noised (eps={self.epsilon:.3g})"
        if self.sums:
            return "sum only"
        return "nothing"

    def describe(self) -> str:
        """One line: what was seen."""
        parts = [f"{f} uploads from {len(s)} clients" for f, s in sorted(self.uploads.items())]
        parts += [f"{n} {f} sums" for f, n in sorted(self.sums.items())]
        if self.epsilon is not None:
            parts.append(f"DP eps={self.epsilon:.3g}")
        return "; ".join(parts) or "nothing"


def _parties(who: Any, clients: Iterable[int]) -> frozenset[Any]:
    if isinstance(who, Coalition):
        return who.parties(clients)
    if isinstance(who, str) and who in ("server", "decryptor"):
        return frozenset({who})
    if isinstance(who, str):
        return Coalition.parse(who).parties(clients)
    if isinstance(who, int):
        return frozenset({who})
    return frozenset(who)


def senders(transcript: Transcript) -> list[int]:
    """The clients that sent anything in the run."""
    return sorted({r["sender"] for r in transcript.observations()
                   if isinstance(r["sender"], int) and r.get("what") == "upload"})


def view(transcript: Transcript, party_or_coalition: Any) -> dict[tuple[str, str], FieldView]:
    """Per (phase, field), what ``party_or_coalition`` saw.

    Args:
        transcript: a run's transcript.
        party_or_coalition: a party name (``"server"``, ``"decryptor"``), a client id, an
            iterable of those, a :class:`ThreatModel`, or a threat name (``"server+3"``;
            the colluders are then the t smallest client ids).
    """
    members = _parties(party_or_coalition, senders(transcript))
    out: dict[tuple[str, str], FieldView] = {}
    for r in transcript.observations():
        key = (r["phase"], r["field"])
        fv = out.setdefault(key, FieldView(r["phase"], r["field"]))
        if isinstance(r["sender"], int) and r["sender"] in members and r["what"] == "upload":
            fv.own.add(r["sender"])
        if r["party"] not in members:
            continue
        fv.rounds.add(int(r["round"]))
        if r["what"] == "upload" and isinstance(r["sender"], int):
            fv.uploads.setdefault(r["form"], set()).add(r["sender"])
        else:
            fv.sums[r["form"]] += 1
    for p in transcript.records:
        if p.get("type") == "privacy" and p.get("field") and "epsilon" in p:
            for (_, fname), fv in out.items():
                if fname == p["field"]:
                    fv.epsilon = float(p["epsilon"])
    return out
