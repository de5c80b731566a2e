"""``secagg run``'s options as a config file: read a TOML file and ``-c KEY=VALUE``
overrides into the parsed options, and write a run's resolved options as ``config.toml``.

Every long option of ``secagg run`` is a key, spelled as the option without its dashes
(``clients``, ``layer``, ``dpsgd-noise`` or ``dpsgd_noise``), at the top level or under one
of the help's groups (``[data]``, ``[algorithm]``, ``[layer]``, ``[privacy]``,
``[output]``). Repeatable options (``arg``, ``group-layer``, ``client-budget``) take a list
of strings. Precedence, lowest first: the option defaults, the file, the ``-c``
overrides, the options given on the command line. Values go through the same checks as on
the command line, so a bad one is a usage error (exit 2) either way.

The resolved file omits where the outputs go and how the run is shown (``out``,
``force``, ``quiet``, ``dry-run``, ...): ``secagg run --config runs/X/config.toml --out Y``
repeats run X into Y: bit for bit (the same model) for a run without DP noise; DP noise
is drawn afresh from the OS's cryptographic generator, never from the seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover -- Python 3.10
    import tomli as tomllib

__all__ = ["NOT_WRITTEN", "SECTIONS", "apply_config", "given_options", "to_toml",
           "write_config"]

#: The sections a config file may group its keys under (the help's option groups).
SECTIONS: tuple[str, ...] = ("data", "algorithm", "layer", "privacy", "output")
#: Keys a resolved config.toml leaves out: where the outputs go and how the run is shown.
NOT_WRITTEN: frozenset[str] = frozenset({
    "config", "overrides", "evaluate_only", "out", "force", "quiet", "dry_run", "list",
    "help", "command"})


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by destination (help excluded)."""
    return {a.dest: a for a in parser._actions  # noqa: SLF001 -- argparse has no public list
            if a.option_strings and a.dest != "help"}


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations of the options written on the command line ``argv`` (the
    subcommand's arguments only)."""
    probe = argparse.ArgumentParser(add_help=False)
    for a in parser._actions:  # noqa: SLF001
        if not a.option_strings or a.dest == "help":
            continue
        kwargs: dict[str, Any] = {"dest": a.dest, "default": argparse.SUPPRESS}
        if a.nargs == 0:
            kwargs["action"] = "store_const"
            kwargs["const"] = a.const
        elif isinstance(a, argparse._AppendAction):  # noqa: SLF001
            kwargs["action"] = "append"
        probe.add_argument(*a.option_strings, **kwargs)
    known, _ = probe.parse_known_args(list(argv))
    return set(vars(known))


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, key: str,
             value: Any) -> Any:
    """One config value through the option's own checks (type, choices); a bad one is a
    usage error."""
    def fail(why: str) -> Any:
        parser.error(f"config key {key!r}: {why}")

    def one(v: Any) -> Any:
        if isinstance(v, (dict, list)):
            return fail(f"expected a single value, got {v!r}")
        text = v if isinstance(v, str) else json.dumps(v)
        try:
            out = action.type(text) if action.type is not None else text
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            return fail(str(exc) or f"bad value {v!r}")
        if action.choices is not None and out not in action.choices:
            return fail(f"{out!r} is not one of {', '.join(map(str, action.choices))}")
        return out

    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            return fail(f"expected true or false, got {value!r}")
        return action.const if value else action.default
    if isinstance(action, argparse._AppendAction):  # noqa: SLF001
        items = value if isinstance(value, list) else [value]
        return [one(v) for v in items]
    return one(value)


def _flatten(parser: argparse.ArgumentParser, table: Mapping[str, Any],
             where: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            if k not in SECTIONS:
                parser.error(f"{where}: unknown section [{k}] (sections: {', '.join(SECTIONS)})")
            flat.update(_flatten(parser, v, where))
        else:
            flat[k.replace("-", "_")] = v
    return flat


def _override(parser: argparse.ArgumentParser, item: str) -> tuple[str, Any]:
    key, eq, raw = item.partition("=")
    key = key.strip()
    if not eq or not key:
        parser.error(f"-c {item!r}: expected KEY=VALUE, e.g. -c rounds=3")
    key = key.split(".")[-1] if key.split(".")[0] in SECTIONS else key
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    return key.replace("-", "_"), value


def apply_config(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 given: set[str], config: Path | None) -> set[str]:
    """Fill ``args`` from the config file and ``args.overrides`` where the command line
    did not give the option; returns the keys set by any of the three."""
    actions = _actions(parser)
    values: dict[str, Any] = {}
    if config is not None:
        try:
            table = tomllib.loads(Path(config).read_text(encoding="utf-8"))
        except OSError as exc:
            parser.error(f"--config {config}: {exc.strerror or exc}")
        except tomllib.TOMLDecodeError as exc:
            parser.error(f"--config {config}: not valid TOML: {exc}")
        values.update(_flatten(parser, table, str(config)))
    for item in args.overrides or []:
        k, v = _override(parser, item)
        values[k] = v
    for key in values:
        if key not in actions or key in ("config", "overrides"):
            known = ", ".join(sorted(k.replace("_", "-") for k in actions
                                     if k not in ("config", "overrides")))
            parser.error(f"unknown config key {key.replace('_', '-')!r}; keys: {known}")
    for key, value in values.items():
        if key not in given:
            setattr(args, key, _convert(parser, actions[key], key, value))
    return set(values) | given


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(
            v) else repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string


def to_toml(parser: argparse.ArgumentParser, values: Mapping[str, Any]) -> str:
    """The options ``values`` (destination -> value) as TOML, one section per help group;
    None values (the option's "not given") and :data:`NOT_WRITTEN` keys are left out."""
    lines = ["# secagg run's resolved options: secagg run --config THIS_FILE [--out DIR]"]
    for group in parser._action_groups:  # noqa: SLF001
        if group.title not in SECTIONS:
            continue
        rows = []
        for a in group._group_actions:  # noqa: SLF001
            if a.dest in NOT_WRITTEN or a.dest not in values:
                continue
            v = values[a.dest]
            if v is None or (isinstance(v, list) and not v and a.default in (None, [])):
                continue
            rows.append(f"{a.dest.replace('_', '-')} = {_toml_value(v)}")
        if rows:
            lines += ["", f"[{group.title}]", *rows]
    return "\n".join(lines) + "\n"


def write_config(parser: argparse.ArgumentParser, values: Mapping[str, Any],
                 path: str | Path) -> Path:
    """Write :func:`to_toml` of ``values`` to ``path``."""
    p = Path(path)
    p.write_text(to_toml(parser, values), encoding="utf-8")
    return p
