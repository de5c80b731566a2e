"""Threat models: adversaries, their views of a transcript, admissibility, and attacks.

* :class:`ThreatModel` (:mod:`threat_models.threat`) — who colludes (a
  :class:`Coalition`, :mod:`threat_models.coalition`), and the hook the engine calls.
* :func:`view` (:mod:`threat_models.views`) — what a coalition saw in a run.
* :func:`admissible` (:mod:`threat_models.admissibility`) — per field, whether a layer
  protects it against a coalition, and why.
* :mod:`threat_models.attacks` — what leaks when it does not.
* :mod:`threat_models.additivity` — checks that fields declared additive are sums.

Nothing here is imported by :mod:`secagg`.
"""

from secagg.lazy import lazy_exports

_EXPORTS = {
    "ThreatModel": "threat_models.threat", "Coalition": "threat_models.coalition",
    "view": "threat_models.views", "FieldView": "threat_models.views",
    "admissible": "threat_models.admissibility", "Verdict": "threat_models.admissibility",
    "check_additivity": "threat_models.additivity",
    "threat_audit": "threat_models.audit",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("threat_models", _EXPORTS, globals())
