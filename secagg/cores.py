"""How many CPU cores this process may use: the default number of worker processes.

``Federation(workers=...)``, ``secagg run --workers`` and ``secagg sweep --workers`` default
to :func:`available_cores`; kept apart from the code that forks, so that building the command
line's parser imports nothing heavy.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The CPU cores this process may run on: ``len(os.sched_getaffinity(0))`` (so a CPU set,
    ``taskset`` or a container's cpuset counts), else ``os.cpu_count()`` where the platform
    has no affinity call (macOS, Windows); never less than 1."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)
