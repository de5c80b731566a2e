"""The flower extra installs beside secagg: flwr in the extra's range (the newest release,
1.42.0, under constraints.txt), and one cryptography that satisfies both secagg's range and
flwr's (flwr 1.41 and 1.42 need >= 50), with pip finding no
broken requirement in the environment the tests run in (CI installs ``.[test,flower]``)."""

import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)


def _requirement(dist: str, name: str, extra: str | None = None) -> Requirement:
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.name == name and (req.marker is None or extra is None
                                 or req.marker.evaluate({"extra": extra})):
            return req
    raise AssertionError(f"{dist} declares no requirement on {name}")


def _constraints() -> list[str]:
    from pathlib import Path
    return (Path(__file__).resolve().parents[1] / "constraints.txt").read_text().splitlines()


def test_the_flower_extra_pins_flwr_and_one_cryptography_satisfies_both():
    pin = _requirement("secagg", "flwr", extra="flower")
    assert "simulation" in pin.extras
    assert pin.specifier.contains("1.41.0") and pin.specifier.contains("1.42.0"), pin.specifier
    assert metadata.version("flwr") in pin.specifier
    pinned = [line.split("==")[1].strip() for line in _constraints() if line.startswith("flwr==")]
    assert pinned == [metadata.version("flwr")] == ["1.42.0"], pinned
    installed = metadata.version("cryptography")
    ours = _requirement("secagg", "cryptography").specifier
    theirs = _requirement("flwr", "cryptography").specifier
    assert installed in ours and installed in theirs, (installed, ours, theirs)
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
