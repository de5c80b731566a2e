"""Check that every field declared additive really is a sum over records.

A summing layer gives the server ``sum_k f(D_k)``; that is what the algorithm needs only if
``f`` is additive: ``f(A u B) = f(A) + f(B)`` for disjoint record sets. A per-client mean
declared ``additive=True`` passes through secure summation silently and the server's "mean"
is wrong. :func:`check_additivity` splits clients' records in two, runs each phase's client
step on A, on B and on A u B (same broadcast, fresh copies of the client state) and compares,
field by field. Every field is reported:

* ``additive`` — ``f(A u B) = f(A) + f(B)`` within a relative tolerance on every client tried;
* ``NOT additive`` — it is not (the error and the client are given): summing it is wrong;
  rewrite it as sums (see :mod:`algorithms.moments`) or declare ``additive=False``;
* ``training`` — the statistic depends on the order of the records (local training: the
  upload is a model, e.g. FedAvg's ``n * params``), so record additivity does not apply;
  the sum over clients is a weighted model average by design;
* ``not declared`` — the field is declared non-additive (nothing to check).

:func:`assert_additive` raises :class:`~secagg.errors.ConfigurationError` naming the fields
that are not, for tests; ``secagg check ALGORITHM`` prints the report.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.data import ClientData, Partition
from secagg.errors import ConfigurationError
from secagg.federation import ClientState, derive_seed


@dataclass(frozen=True)
class FieldCheck:
    """The additivity verdict for one (phase, field).

    Attributes:
        phase, field: which field.
        declared: the field's declared ``additive``.
        status: ``"additive"``, ``"NOT additive"``, ``"training"`` or ``"not declared"``.
        error: the largest relative error ``|f(A u B) - f(A) - f(B)| / scale`` seen.
        client: the client where that error occurred (None when not checked).
    """

    phase: str
    field: str
    declared: bool
    status: str
    error: float
    client: int | None

    @property
    def ok(self) -> bool:
        """False only for a field declared additive that is not."""
        return self.status != "NOT additive"

    def __str__(self) -> str:
        detail = "" if self.client is None else f" (max relative error {self.error:.2e} at " \
            f"client {self.client})"
        return f"{self.phase}/{self.field}: {self.status}{detail}"


def _sub(cd: ClientData, idx: np.ndarray) -> ClientData:
    return ClientData(cd.id, cd.x[idx], cd.y[idx], cd.x_test, cd.y_test)


def _run(phase: Any, state: ClientState, data: ClientData,
         bcast: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    st = ClientState(data, copy.deepcopy(state.state))
    return {k: np.asarray(v, dtype=np.float64) for k, v in phase.client_step(st, bcast).items()}


def _rel(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> float:
    s = max(float(np.max(np.abs(scale))) if scale.size else 0.0, 1e-300)
    return float(np.max(np.abs(a - b))) / s if a.size else 0.0


def check_additivity(algorithm: Any, partition: Partition, seed: int = 0,
                     clients: Sequence[int] | None = None, rounds: int = 2,
                     rtol: float = 1e-8) -> list[FieldCheck]:
    """Check every field of every phase of ``algorithm`` (the phases of rounds 0 and
    ``rounds - 1``), on ``clients`` (default: up to three clients with >= 2 records).

    The algorithm is ``setup`` on ``partition`` with ``seed``; phases are checked in the
    order they would run, and each phase's server step is applied to the plaintext sum
    (so a later phase sees the state it would in a run).
    """
    states = [ClientState(cd) for cd in partition]
    algorithm.setup(partition.dataset, states, seed)
    ids = list(clients) if clients is not None else [s.id for s in states if s.n_records >= 2][:3]
    if not ids:
        raise ConfigurationError("additivity needs a client with at least 2 records")
    rng = np.random.default_rng(derive_seed(seed, "additivity"))
    checks: dict[tuple[str, str], FieldCheck] = {}
    seen: set[str] = set()
    for r in sorted({0, rounds - 1}):
        for phase in algorithm.phases(r, rounds):
            spec = phase.spec()
            bcast = phase.broadcast()
            if phase.name in seen:  # checked in an earlier round: only advance the state
                _advance(phase, spec, states, bcast)
                continue
            worst: dict[str, tuple[float, int | None]] = {f.name: (0.0, None) for f in spec}
            ordered: dict[str, bool] = {f.name: False for f in spec}
            for c in ids:
                st = states[c]
                n = st.n_records
                perm = rng.permutation(n)
                a, b = np.sort(perm[: n // 2]), np.sort(perm[n // 2:])
                fa = _run(phase, st, _sub(st.data, a), bcast)
                fb = _run(phase, st, _sub(st.data, b), bcast)
                fab = _run(phase, st, st.data, bcast)
                fshuf = _run(phase, st, _sub(st.data, perm), bcast)
                for f in spec:
                    scale = np.abs(fa[f.name]) + np.abs(fb[f.name])
                    if _rel(fab[f.name], fshuf[f.name], np.abs(fab[f.name])) > rtol:
                        ordered[f.name] = True
                    e = _rel(fab[f.name], fa[f.name] + fb[f.name], scale)
                    if e > worst[f.name][0] or worst[f.name][1] is None:
                        worst[f.name] = (e, c)
            seen.add(phase.name)
            for f in spec:
                e, c = worst[f.name]
                if not f.additive:
                    status = "not declared"
                elif ordered[f.name]:
                    status = "training"
                else:
                    status = "additive" if e <= rtol else "NOT additive"
                checks[(phase.name, f.name)] = FieldCheck(phase.name, f.name, f.additive,
                                                          status, e, c)
            _advance(phase, spec, states, bcast)
    return list(checks.values())


def _advance(phase: Any, spec: Any, states: list[ClientState],
             bcast: dict[str, np.ndarray]) -> None:
    """Run the phase on every client in plaintext and apply the server step."""
    from secagg.layers.base import Aggregate

    ups = {s.id: phase.client_step(s, bcast) for s in states}
    sums = {f.name: np.sum([np.asarray(u[f.name], dtype=np.int64 if f.is_integer else
                                       np.float64) for u in ups.values()], axis=0)
            for f in spec.additive}
    values = {f.name: {c: np.asarray(u[f.name]) for c, u in ups.items()}
              for f in spec.non_additive}
    phase.server_step(Aggregate(phase.name, 0, sums, values, tuple(sorted(ups))))


def assert_additive(algorithm: Any, partition: Partition, **kwargs: Any) -> list[FieldCheck]:
    """:func:`check_additivity`, raising when a field declared additive is not.

    Raises:
        ConfigurationError: naming each such field, its error and what to do.
    """
    checks = check_additivity(algorithm, partition, **kwargs)
    bad = [c for c in checks if not c.ok]
    if bad:
        raise ConfigurationError(
            "declared additive but not a sum over records: "
            + "; ".join(str(c) for c in bad)
            + " - the server would sum per-client values that do not add up; upload sums "
            "instead (see algorithms.moments) or declare additive=False")
    return checks


def format_checks(checks: Sequence[FieldCheck]) -> str:
    """One line per field."""
    return "\n".join(str(c) for c in checks)
