"""The argparse conventions every subcommand shares: a parser whose errors are one
line (exit 2), a bounded-number option type, and the lookup of a subcommand's parser."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _bounded(kind: type, low: float, high: float | None = None, what: str = "") -> Any:
    """An argparse type: ``kind`` in (low, high), exclusive (high None: no upper end); a
    value outside is a usage error (exit 2), as in every subcommand."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (v > low and (high is None or v < high)):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return v
    return parse


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The subcommand ``name``'s parser."""
    sub = next(a for a in parser._actions  # noqa: SLF001
               if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return sub.choices[name]
