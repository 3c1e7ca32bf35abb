"""One precedence for every setting: flag > environment > config file > default.

Every option is declared once, on the dataclass field that holds it
(``field: float = option(5.0, "help", positive_float, "SECONDS")``);
``options_of(Cls)`` derives the Options, whose argparse flags,
``NCCLWATCH_<NAME>`` variables and TOML keys all derive from the field name,
and ``build(Cls, cfg)`` makes the dataclass from a resolved config.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

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
    #: A TOML table (``[name]``, KEY = VALUE) with no flag or variable of its
    #: own; the command that takes it parses its flags (--job-timeout).
    table: bool = False
    #: Where it is declared: "module.Class.field" (the default comes from there).
    home: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "NCCLWATCH_" + self.name.upper()


class ConfigError(ValueError):
    pass


_META = "ncclwatch.option"
_SAME = object()


@dataclass(frozen=True)
class _Spec:
    help: str
    type: Callable[[str], Any]
    metavar: str | None
    run: Any          # the default under `ncclwatch run` (_SAME: the field's)
    table: bool
    name: str | None  # the setting's name where it is not the field's


def option(default: Any = MISSING, help: str = "", type: Callable[[str], Any] = str,
           metavar: str | None = None, *, default_factory: Any = MISSING,
           run: Any = _SAME, table: bool = False, name: str | None = None) -> Any:
    """A dataclass field that is also a setting (flag, env and TOML key from
    its name, or from ``name`` where the setting says more than the field:
    ``native_stack_after`` for StackPolicy.native_after). ``run``: the
    default under ``ncclwatch run`` where it differs (loopback addresses);
    ``table``: a TOML table, see Option.table."""
    return field(default=default, default_factory=default_factory,
                 metadata={_META: _Spec(help, type, metavar, run, table, name)})


def field_default(f: Any) -> Any:
    """A dataclass field's default (a default_factory is called)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"{f.name} has no default")


def options_of(cls: type, *, run: bool = False,
               exclude: Collection[str] = ()) -> tuple[Option, ...]:
    """The settings declared on ``cls`` with option(), in field order; under
    ``run``, with the defaults of ``ncclwatch run``."""
    out = []
    for f in fields(cls):
        spec = f.metadata.get(_META)
        if spec is None or f.name in exclude:
            continue
        default = spec.run if run and spec.run is not _SAME else field_default(f)
        out.append(Option(spec.name or f.name, spec.type, default, spec.help, spec.metavar,
                          table=spec.table, home=f"{cls.__module__}.{cls.__qualname__}.{f.name}"))
    return tuple(out)


def build(cls: type, cfg: Mapping[str, Any], **given: Any) -> Any:
    """``cls`` from a resolved config: its option fields from ``cfg`` (those it
    lacks keep their defaults), the others from ``given``."""
    kw = {f.name: cfg[key] for f in fields(cls)
          if (spec := f.metadata.get(_META)) is not None
          and (key := spec.name or f.name) in cfg and f.name not in given}
    return cls(**kw, **given)


class ConfigFile(dict):
    """A loaded TOML file, which knows its path (for messages)."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        super().__init__(data)
        self.path = path


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for o in options:
        if o.table:
            continue
        if o.type is boolean:  # a switch: --flag, NCCLWATCH_FLAG=1, flag = true
            parser.add_argument(o.flag, action="store_true", default=None,
                                help=f"{o.help} (env {o.env}=1)")
            continue
        parser.add_argument(o.flag, type=o.type, default=None, metavar=o.metavar,
                            help=f"{o.help} (default: {o.default}; env {o.env})")


def load_file(path: str | None, default_path: str | None) -> dict[str, Any]:
    """The TOML file named by --config, else the default path if it exists."""
    chosen = path or (default_path if default_path and Path(default_path).exists() else None)
    if not chosen:
        return {}
    try:
        with open(chosen, "rb") as f:
            return ConfigFile(tomllib.load(f), chosen)
    except OSError as e:
        raise ConfigError(f"cannot read config file {chosen}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {chosen} is not valid TOML: {e}") from None


def resolve(options: Sequence[Option], args: argparse.Namespace,
            file: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    _check_file(options, file)
    out: dict[str, Any] = {}
    for o in options:
        if o.table:
            value = file.get(o.name)
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{_where(file)}: {o.name} must be a table ([{o.name}]), "
                                  f"not {value!r}")
            out[o.name] = o.default if value is None else dict(value)
            continue
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


def _where(file: Mapping[str, Any]) -> str:
    path = getattr(file, "path", None)
    return f"config file {path}" if path else "config file"


def _check_file(options: Sequence[Option], file: Mapping[str, Any]) -> None:
    """Every key and table of the file is a setting of this command."""
    known = {o.name for o in options}
    tables = sorted(o.name for o in options if o.table)
    unknown_tables = sorted(k for k, v in file.items() if isinstance(v, dict) and k not in known)
    if unknown_tables:
        takes = (f"its tables are {', '.join(f'[{t}]' for t in tables)}" if tables
                 else "it takes no tables")
        raise ConfigError(f"{_where(file)}: unknown table(s) "
                          f"{', '.join(f'[{t}]' for t in unknown_tables)} ({takes})")
    unknown = sorted(k for k in file if k not in known)
    if unknown:
        raise ConfigError(f"{_where(file)}: unknown config key(s): {', '.join(unknown)}")


def parse_ranks(text: str) -> frozenset[int] | None:
    """'0-3,7' -> {0, 1, 2, 3, 7}; '' -> None (every rank). Here, not in the
    agent: a setting's parser is the library's (tests/repo/test_layers.py)."""
    text = text.strip()
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad rank range {part!r} (expected e.g. 0-3,7)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"bad rank range {part!r}: end before start")
        out.update(range(a, b + 1))
    return frozenset(out)


def rank_set(v: Any) -> frozenset[int] | None:
    """Ranks from a flag, env or config: "0-3,7", a list of ints, or an already parsed set."""
    if isinstance(v, (set, frozenset, list, tuple)):
        return frozenset(int(r) for r in v)
    return parse_ranks(str(v))


def boolean(v: Any) -> bool:
    """A switch from a flag (True), the environment or TOML: 1/0, true/false, yes/no."""
    if isinstance(v, bool):
        return v
    word = str(v).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


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


def non_negative_int(v: Any) -> int:
    """A whole number >= 0."""
    if isinstance(v, bool) or float(v) != int(float(v)) or float(v) < 0:
        raise ValueError("must be a whole number >= 0")
    return int(float(v))


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
