"""Algorithms by name: the ``secagg.algorithms`` entry-point group (the ``algorithms``
package registers its own; a third-party package can add more), or ``module:Class``.

The command line, the sweep and anything else that builds an algorithm from a name use
these two functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from secagg.errors import ConfigurationError

__all__ = ["GROUP", "algorithm_arguments", "available_algorithms", "load_algorithm"]

#: The entry-point group algorithms register under.
GROUP = "secagg.algorithms"


def available_algorithms() -> dict[str, EntryPoint]:
    """Registered algorithm entry points, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_algorithm(name: str) -> type:
    """The algorithm class registered as ``name``, or named ``module:Class``.

    Raises:
        ConfigurationError: unknown name (the message lists the registered ones), or the
            class cannot be imported.
    """
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(f"cannot load algorithm {name!r}: {exc}") from None
    eps = available_algorithms()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none (is the package installed? pip install -e .)"
        raise ConfigurationError(f"unknown algorithm {name!r}; available: {known}")
    try:
        return eps[name].load()
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"algorithm {name!r} is registered but cannot be loaded: {exc}") from None


def algorithm_arguments(cls: type, given: Mapping[str, Any],
                        adjacency: str | None) -> dict[str, Any]:
    """The constructor arguments to build ``cls`` with: the user's ``given`` ones, plus,
    when its uploads go through a DP layer (``adjacency`` is that layer's ``"record"`` or
    ``"client"``; None: no DP layer), the defaults the algorithm declares for DP
    (``cls.dp_defaults(adjacency, given)``, e.g. FedLog's one release) for every argument
    the user did not give."""
    out = dict(given)
    hook = getattr(cls, "dp_defaults", None)
    if adjacency is not None and callable(hook):
        for key, value in hook(adjacency, out).items():
            out.setdefault(key, value)
    return out
