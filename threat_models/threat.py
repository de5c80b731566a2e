"""The adversary the engine checks a run against.

A :class:`ThreatModel` is a :class:`~threat_models.coalition.Coalition` (the server,
honest-but-curious or active, up to ``t`` colluding clients, and whether the HE decryptor
joins; :meth:`~threat_models.coalition.Coalition.parse` reads ``"server+3"``) with the hook
:class:`secagg.federation.Federation` calls before the first phase,
:meth:`ThreatModel.check` (duck-typed, so that ``secagg`` does not import this package).

The model answers two questions: what an (algorithm, layer) composition lets this
coalition read (:mod:`threat_models.admissibility`, whose rules need only the coalition),
and what it actually saw in a run (:mod:`threat_models.views`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from threat_models.admissibility import Verdict, admissible
from threat_models.coalition import DECRYPTOR, SERVER, Coalition, ServerKind

__all__ = ["DECRYPTOR", "SERVER", "ServerKind", "ThreatModel"]


@dataclass(frozen=True)
class ThreatModel(Coalition):
    """A coalition of adversaries (see :class:`~threat_models.coalition.Coalition` for the
    arguments) that the engine can check a composition against."""

    def check(self, algorithm: Any, layer: Any, specs: Mapping[str, Any],
              n_clients: int | None = None, *, rounds: int = 2, fraction: float = 1.0,
              dropouts: bool = False) -> list[Verdict]:
        """Per (phase, field) verdicts of ``layer`` against this coalition (see
        :func:`threat_models.admissibility.admissible`, whose ``rounds``, ``fraction`` and
        ``dropouts`` judge differencing across cohorts); each has ``ok``, ``phase``,
        ``field`` and ``reason``."""
        return admissible(algorithm, layer, self, specs=specs, n_clients=n_clients,
                          rounds=rounds, fraction=fraction, dropouts=dropouts)
