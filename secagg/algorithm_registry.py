"""Algorithms by name: the ``secagg.algorithms`` entry-point group (the ``algorithms``
package registers its own; a third-party package can add more), or ``module:Class``.

The command line, the sweep and anything else that builds an algorithm from a name use
these two functions.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from secagg.errors import ConfigurationError

__all__ = ["GROUP", "available_algorithms", "load_algorithm"]

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
