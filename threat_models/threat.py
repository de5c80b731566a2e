"""The adversary: who colludes, and whether the server follows the protocol.

A :class:`ThreatModel` names a coalition: the server (honest-but-curious, i.e. it follows
the protocol and reads everything it receives, or active, i.e. it may deviate), up to ``t``
colluding clients, and whether the party holding a decryption key (the HE ``decryptor``)
colludes with the server. :meth:`ThreatModel.parse` reads the CLI form (``"server+3"``).

The model answers two questions: what an (algorithm, layer) composition lets this
coalition read (:mod:`threat_models.admissibility`), and what it actually saw in a run
(:mod:`threat_models.views`). :meth:`ThreatModel.check` is the hook
:class:`secagg.federation.Federation` calls before the first phase (duck-typed, so that
``secagg`` does not import this package).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from secagg.errors import ConfigurationError

ServerKind = Literal["honest-but-curious", "active"]
SERVER = "server"
DECRYPTOR = "decryptor"


@dataclass(frozen=True)
class ThreatModel:
    """A coalition of adversaries.

    Args:
        server: ``"honest-but-curious"`` (follows the protocol, reads what it receives),
            ``"active"`` (may deviate: lie about dropouts, forge messages), or ``None`` when
            the server is not in the coalition (colluding clients only).
        colluding_clients: t, how many clients share everything they know with the coalition.
        decryptor_colludes: the party holding the HE secret key (``decryptor``) joins.
        client_ids: which clients collude, when it matters (views of a transcript); default
            the t smallest ids of the run.
    """

    server: ServerKind | None = "honest-but-curious"
    colluding_clients: int = 0
    decryptor_colludes: bool = False
    client_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.server not in ("honest-but-curious", "active", None):
            raise ConfigurationError(
                f"server must be 'honest-but-curious', 'active' or None, got {self.server!r}")
        t = self.colluding_clients
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ConfigurationError(f"colluding_clients must be an integer >= 0, got {t!r}")
        if self.client_ids is not None:
            ids = tuple(int(i) for i in self.client_ids)
            if len(ids) != t or len(set(ids)) != t:
                raise ConfigurationError(
                    f"client_ids must name {t} distinct clients, got {self.client_ids!r}")
            object.__setattr__(self, "client_ids", ids)
        if self.server is None and t == 0 and not self.decryptor_colludes:
            raise ConfigurationError("an empty coalition: name the server, clients or decryptor")

    # -- construction ------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> ThreatModel:
        """Read ``"server"``, ``"server+3"``, ``"active-server+1"``, ``"server+decryptor"``,
        ``"clients:2"`` style names ('+'-separated parts: ``server``, ``active-server``,
        ``decryptor``, a client count, ``clients:N``).

        Raises:
            ConfigurationError: an unknown part (the message lists the accepted ones).
        """
        server: ServerKind | None = None
        t, dec = 0, False
        for raw in str(text).split("+"):
            part = raw.strip().lower()
            if part in ("server", "curious-server", "honest-but-curious"):
                server = "honest-but-curious"
            elif part in ("active-server", "active", "malicious-server"):
                server = "active"
            elif part == "decryptor":
                dec = True
            elif part.isdigit() or (part.startswith("clients:") and part[8:].isdigit()):
                t += int(part.rsplit(":", 1)[-1])
            else:
                raise ConfigurationError(
                    f"cannot read threat {text!r}: part {raw!r} is not one of server, "
                    "active-server, decryptor, a number of colluding clients, clients:N "
                    "(e.g. 'server+3')")
        return cls(server=server, colluding_clients=t, decryptor_colludes=dec)

    # -- facts -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Short name, e.g. ``server+3`` or ``active-server+decryptor``."""
        parts = []
        if self.server == "honest-but-curious":
            parts.append("server")
        elif self.server == "active":
            parts.append("active-server")
        if self.decryptor_colludes:
            parts.append(DECRYPTOR)
        if self.colluding_clients:
            parts.append(f"{self.colluding_clients}" if parts
                         else f"clients:{self.colluding_clients}")
        return "+".join(parts)

    @property
    def has_server(self) -> bool:
        """True when the server is in the coalition."""
        return self.server is not None

    def parties(self, clients: Iterable[int] = ()) -> frozenset[Any]:
        """The coalition's members as transcript party names: ``"server"``,
        ``"decryptor"`` and client ids (``client_ids``, or the t smallest of ``clients``)."""
        out: set[Any] = set()
        if self.has_server:
            out.add(SERVER)
        if self.decryptor_colludes:
            out.add(DECRYPTOR)
        ids = self.client_ids
        if ids is None:
            ids = tuple(sorted(int(c) for c in clients))[: self.colluding_clients]
        out.update(ids)
        return frozenset(out)

    def describe(self) -> dict[str, Any]:
        """JSON-able description (recorded in the transcript header)."""
        return {"name": self.name, "server": self.server,
                "colluding_clients": self.colluding_clients,
                "decryptor_colludes": self.decryptor_colludes}

    # -- the Federation hook -------------------------------------------------------------
    def check(self, algorithm: Any, layer: Any, specs: Mapping[str, Any],
              n_clients: int | None = None, *, rounds: int = 2, fraction: float = 1.0,
              dropouts: bool = False) -> list[Any]:
        """Per (phase, field) verdicts of ``layer`` against this coalition (see
        :func:`threat_models.admissibility.admissible`, whose ``rounds``, ``fraction`` and
        ``dropouts`` judge differencing across cohorts); each has ``ok``, ``phase``,
        ``field`` and ``reason``."""
        from threat_models.admissibility import admissible

        return admissible(algorithm, layer, self, specs=specs, n_clients=n_clients,
                          rounds=rounds, fraction=fraction, dropouts=dropouts)
