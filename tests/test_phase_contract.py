"""Declared contracts instead of probes (issue 34, point 4, for phases and algorithms): what
the engine asks of a phase or an algorithm is declared, with its default, on
:class:`secagg.phase.PhaseBase` / :class:`secagg.phase.AlgorithmBase`, and neither the
engine nor the client step probes a phase or an algorithm with ``getattr``/``hasattr``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.base import Algorithm, LocalPhase, Phase
from secagg.messages import Field, UploadSpec
from secagg.phase import AlgorithmBase, ClientState, PhaseBase

ROOT = Path(__file__).resolve().parents[1]
#: the engine and the modules split from it (issue 34), and the client step
ENGINE = ("secagg/engine.py", "secagg/engine_accounts.py", "secagg/round_steps.py",
          "secagg/run_plan.py", "secagg/transport.py", "secagg/remote_layers.py")
READERS = (*ENGINE, "secagg/client_step.py")
#: the names the engine and the client step give a phase or an algorithm
SUBJECTS = {"phase", "ph", "algorithm", "alg", "algo"}


def _probes(rel: str) -> list[str]:
    """``getattr``/``hasattr`` calls on a phase or an algorithm in ``rel``."""
    out = []
    for node in ast.walk(ast.parse((ROOT / rel).read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id in SUBJECTS):
            out.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return out


def test_the_engine_probes_no_phase_or_algorithm() -> None:
    found = [p for rel in READERS for p in _probes(rel)]
    assert found == [], found


def test_the_engine_reads_the_declared_members() -> None:
    text = "".join((ROOT / rel).read_text() for rel in ENGINE)
    for member in ("prepare", "trained_with_dpsgd", "dp_covered_fields", "privacy_events",
                   "trained_fields", "round_invariant_fields", "measurements"):
        assert f".{member}(" in text, member
    assert ".client_cpu_s(" in (ROOT / "secagg/client_step.py").read_text()


class _Bare(PhaseBase):
    name = "bare"

    def spec(self) -> UploadSpec:
        return UploadSpec((Field("x", (1,), additive=True),))

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
        return {"x": np.zeros(1)}

    def server_step(self, aggregate: Any) -> None:
        return None


class _BareAlgo(AlgorithmBase):
    def setup(self, dataset: Any, clients: Any, seed: int) -> None:
        return None

    def phases(self, round: int, rounds: int) -> list[PhaseBase]:
        return [_Bare()]

    def evaluate(self, dataset: Any, clients: Any) -> float:
        return 0.0


def test_a_bare_phase_gets_every_default() -> None:
    ph = _Bare()
    assert ph.broadcast() == {} and ph.client_flops(None) == 0.0  # type: ignore[arg-type]
    assert ph.prepare([], {}) is None and ph.client_cpu_s(None, 1.5) == 1.5  # type: ignore
    assert ph.trained_fields() == () and not ph.upload_depends_on_training
    assert ph.trained_with_dpsgd() is False and ph.dp_covered_fields() == ()
    assert ph.privacy_events() == [] and ph.round_invariant_fields() == ()
    assert ph.measurements() == {} and ph.training_note == ""
    algo = _BareAlgo()
    assert algo.personalized is False and algo.clip_policy is None
    assert algo.export_model([]) is None and algo.describe() == {"name": "algorithm"}


def test_the_algorithms_contracts_are_the_declared_ones() -> None:
    assert issubclass(Phase, PhaseBase) and issubclass(LocalPhase, PhaseBase)
    assert issubclass(Algorithm, AlgorithmBase)


class _DuckPhase:
    """A duck-typed phase with only the abstract members (no base, no defaults)."""

    name = "duck"

    def spec(self) -> UploadSpec:
        return UploadSpec((Field("x", (1,), additive=True),))

    def client_step(self, client: Any, broadcast: Any) -> dict[str, np.ndarray]:
        return {"x": np.zeros(1)}

    def server_step(self, aggregate: Any) -> None:
        return None


class _DuckAlgo(_BareAlgo):
    def phases(self, round: int, rounds: int) -> list[Any]:
        return [_DuckPhase()]


def test_a_phase_without_the_declared_members_is_refused_with_a_typed_error() -> None:
    """Before any client steps, not as an AttributeError mid-round."""
    import pytest

    from secagg import Federation, Plaintext
    from secagg.data import dirichlet_split, load_dataset
    from secagg.errors import ConfigurationError

    ds = load_dataset("digits")
    part = dirichlet_split(ds, 3, alpha=1.0, seed=0)
    fed = Federation(_DuckAlgo(), Plaintext(), part, rounds=1, seed=0)
    with pytest.raises(ConfigurationError, match=r"_DuckPhase lacks .*prepare.*derive it"):
        fed.run()
