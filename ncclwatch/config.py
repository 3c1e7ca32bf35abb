"""One precedence for every setting: flag > environment > config file > default.

Options are declared once (name, type, default, help); argparse flags,
``NCCLWATCH_<NAME>`` variables and TOML keys all derive from the name.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Option:
    name: str                    # snake_case: flag --name-with-dashes, env NCCLWATCH_NAME
    type: Callable[[str], Any]
    default: Any
    help: str
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "NCCLWATCH_" + self.name.upper()


class ConfigError(ValueError):
    pass


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for o in options:
        parser.add_argument(o.flag, type=o.type, default=None, metavar=o.metavar,
                            help=f"{o.help} (default: {o.default}; env {o.env})")


def load_file(path: str | None, default_path: str | None) -> dict[str, Any]:
    """The TOML file named by --config, else the default path if it exists."""
    chosen = path or (default_path if default_path and Path(default_path).exists() else None)
    if not chosen:
        return {}
    try:
        with open(chosen, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {chosen}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {chosen} is not valid TOML: {e}") from None


def resolve(options: Sequence[Option], args: argparse.Namespace,
            file: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    known = {o.name for o in options}
    unknown = [k for k, v in file.items() if k not in known and not isinstance(v, dict)]
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for o in options:
        value = getattr(args, o.name, None)
        source = o.flag
        if value is None and o.env in env:
            value, source = env[o.env], o.env
        elif value is None and o.name in file:
            value, source = file[o.name], "config file"
        if value is None:
            out[o.name] = o.default
            continue
        try:
            out[o.name] = o.type(value) if not isinstance(value, bool) else value
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{o.name} from {source}: invalid value {value!r} ({e})") from None
    return out


def rank_set(v: Any) -> frozenset[int] | None:
    """Ranks from a flag, env or config: "0-3,7", a list of ints, or an already parsed set."""
    from ncclwatch.agent.discover import parse_ranks

    if isinstance(v, (set, frozenset, list, tuple)):
        return frozenset(int(r) for r in v)
    return parse_ranks(str(v))


def positive_float(v: Any) -> float:
    x = float(v)
    if not x > 0:
        raise ValueError("must be > 0")
    return x


def non_negative_float(v: Any) -> float:
    x = float(v)
    if not x >= 0:
        raise ValueError("must be >= 0")
    return x


def positive_int(v: Any) -> int:
    if isinstance(v, bool) or float(v) != int(float(v)):
        raise ValueError("must be a whole number")
    x = int(float(v))
    if x < 1:
        raise ValueError("must be >= 1")
    return x


def hostport(v: Any) -> str:
    s = str(v)
    if ":" not in s:
        raise ValueError("expected HOST:PORT")
    port = s.rpartition(":")[2]
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("port must be 0-65535")
    return s


def hostports(v: Any) -> str:
    """Daemons as shards of HOST:PORT: "a:7470" (one), "a:7470,b:7470" (an HA
    pair), "a0:7470,b0:7470;a1:7470,b1:7470" (two shards of pairs), or the
    TOML forms of ``ncclwatch.shard.shard_list``; kept in the flag form."""
    from ncclwatch.shard import shard_list, shard_text

    return shard_text([[hostport(t) for t in g] for g in shard_list(v)])


def urls(v: Any) -> str:
    """HTTP(S) URLs as shards ("http://a0:7471,http://b0:7471;http://a1:7471"), flag form."""
    from ncclwatch.shard import shard_list, shard_text

    groups = shard_list(v)
    for u in (u for g in groups for u in g):
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"{u!r} is not an http:// or https:// URL")
    return shard_text(groups)
