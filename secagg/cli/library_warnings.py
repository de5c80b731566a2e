"""Library warnings during a run: silenced when no user can act on them, else counted
and summarised in one line; secagg's own warnings shown one line each."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path


def _quiet_library_warnings() -> None:
    """Stop library warning floods: torch's backward-hook notice (raised on every DP-SGD
    batch, nothing a user can act on) is silenced; Opacus's warnings (e.g. that its noise
    RNG is not the secure one) are shown once per run instead of once per client."""
    import warnings

    warnings.filterwarnings("ignore", message=r"Full backward hook is firing")
    warnings.filterwarnings("ignore", message=r"Using a non-full backward hook")
    warnings.filterwarnings("once", module=r"opacus(\.|$)")
    plain = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):  # noqa: ANN001, ANN202
        # secagg's own warnings (e.g. the privacy plan's) are one line, with the fix
        if category.__module__.startswith("secagg."):
            return f"secagg: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = one_line  # type: ignore[assignment]


@contextlib.contextmanager
def _summarised_warnings() -> Iterator[None]:
    """secagg's own warnings shown as they come (one line each, with the fix); third-party
    warnings (Opacus, SciPy, torch) and absl's warning logs (dp-accounting's), which a
    user cannot act on line by line, counted and summarised in one line on stderr when the
    block ends."""
    import warnings

    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
            if getattr(category, "__module__", "").startswith("secagg."):
                return shown(message, category, filename, lineno, file, line)
            lib = next((p for p in Path(filename).parts if p in _LIBRARIES), "other")
            counts[lib] = counts.get(lib, 0) + 1
            first.setdefault(lib, str(message).splitlines()[0][:120] if str(message) else "")
            return None

        class _Count(logging.Handler):
            """absl log records (dp-accounting's RDP notes, e.g. an order that failed to
            converge, logged once per order and call) are counted like warnings."""

            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno >= logging.WARNING:
                    counts["absl"] = counts.get("absl", 0) + 1
                    first.setdefault("absl", record.getMessage().splitlines()[0][:120])

        absl, handler = logging.getLogger("absl"), _Count()
        propagate = absl.propagate
        absl.addHandler(handler)
        absl.propagate = False
        warnings.showwarning = show
        try:
            yield
        finally:
            absl.removeHandler(handler)
            absl.propagate = propagate
            if counts:
                per = ", ".join(f"{lib} {n}" for lib, n in sorted(counts.items()))
                lib = max(counts, key=lambda k: counts[k])
                print(f"secagg: {sum(counts.values())} library warning(s) during the run "
                      f"({per}); most from {lib}: {first[lib]}", file=sys.stderr)


#: Libraries named in the warning summary (by a folder in the warning's file path).
_LIBRARIES = ("opacus", "scipy", "torch", "numpy", "sklearn", "tenseal", "flwr", "ray")
