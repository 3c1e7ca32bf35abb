"""Walk a dashboard's queries and fill in its variables.

Two kinds of filling, for two readers:

- ``expand_placeholders`` (the linter): every variable outside a string
  literal becomes a placeholder that parses as PromQL (time variables a
  distinctive duration, so the rate-interval rule can recognise
  ``$__rate_interval`` after parsing); variables inside string literals stay
  as they are, so a matcher reads ``job=~"$job"`` after parsing. This is
  how grafana's dashboard-linter expands variables before it parses.
- ``panel_queries`` (end-to-end tests): every variable becomes a concrete
  value, the way Grafana interpolates it for the Prometheus data source
  (values inside a regex matcher are regex-escaped, several values are
  joined with ``|``, "All" is the variable's allValue), so each query can be
  sent to a real Prometheus as is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

#: Grafana's global time variables that stand for a duration.
DURATION_VARS = ("__rate_interval", "__interval", "__range")
#: Global variables that stand for a plain number (milliseconds, seconds, epoch ms).
NUMBER_VARS = ("__interval_ms", "__range_ms", "__range_s", "__from", "__to")

#: Placeholder seconds for duration variables (in the spirit of the real
#: linter's magic time range): ``$__rate_interval`` parses as
#: ``11277964s``, the next duration variable as ``11277965s``, and so on.
MAGIC_SECONDS = 11277964
MAGIC_STRING = "bgludgvy"

# $var, ${var} and ${var:format}, [[var]] and [[var:format]]
_VAR = re.compile(r"\$\{([^}]+)\}|\$([A-Za-z0-9_]+)|\[\[([^\[\]]+)\]\]")
_RE2_META = re.compile(r"([\\^$.|?*+()\[\]{}])")


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def iter_panels(dashboard: dict) -> Iterator[dict]:
    """Every panel that is not a row, including those inside collapsed rows."""
    for p in dashboard.get("panels") or []:
        if p.get("type") == "row":
            yield from (q for q in p.get("panels") or [] if q.get("type") != "row")
        else:
            yield p


def iter_rows(dashboard: dict) -> Iterator[dict]:
    yield from (p for p in dashboard.get("panels") or [] if p.get("type") == "row")


def annotation_title(annotation: dict) -> str:
    """The name an annotation query goes by in lint messages and exclusions."""
    return f"annotation: {annotation.get('name', '')}"


def iter_targets(dashboard: dict, *, annotations: bool = True
                 ) -> Iterator[tuple[str, int, dict, dict | None]]:
    """(panel title, target index, target, panel) for every query of the dashboard.

    Annotation queries come last, as targets of a pseudo panel titled
    ``annotation: NAME`` (panel None); the built-in Grafana annotation
    (no ``expr``) is skipped.
    """
    for p in iter_panels(dashboard):
        for i, t in enumerate(p.get("targets") or []):
            yield p.get("title", ""), i, t, p
    if annotations:
        for a in (dashboard.get("annotations") or {}).get("list") or []:
            if a.get("expr"):
                yield annotation_title(a), 0, a, None


def variable_name(token: str) -> str:
    """``$job`` / ``${job}`` / ``${job:regex}`` / ``[[job]]`` -> ``job``."""
    m = _VAR.fullmatch(token)
    if m is None:
        raise ValueError(f"not a variable reference: {token!r}")
    name = next(g for g in m.groups() if g is not None)
    return name.split(":", 1)[0]


def substitute(expr: str, outside: Callable[[str], str],
               inside: Callable[[str], str | None]) -> str:
    """Replace each variable reference in ``expr``.

    ``outside(name)`` gives the text for a reference outside string literals,
    ``inside(name)`` for one inside a string literal (None: leave it as is).
    PromQL string literals are "...", '...' (backslash escapes) and `...`.
    ``$1`` in a string is a regex group (label_replace's replacement), no variable:
    kept, as Grafana keeps a reference to a variable it does not have.
    """
    out: list[str] = []
    i, n = 0, len(expr)
    quote: str | None = None
    while i < n:
        c = expr[i]
        if quote is not None:
            if c == "\\" and quote != "`" and i + 1 < n:
                out.append(expr[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
                out.append(c)
                i += 1
                continue
        elif c in "\"'`":
            quote = c
            out.append(c)
            i += 1
            continue
        m = _VAR.match(expr, i) if c in "$[" else None
        if m is None:
            out.append(c)
            i += 1
            continue
        name = variable_name(m.group(0))
        if quote is not None and name.isdigit():
            out.append(m.group(0))
        elif quote is None:
            out.append(outside(name))
        else:
            text = inside(name)
            out.append(m.group(0) if text is None else text)
        i = m.end()
    return "".join(out)


def expand_placeholders(expr: str) -> str:
    """The linter's expansion: placeholders outside strings, strings untouched."""
    def outside(name: str) -> str:
        if name in DURATION_VARS:
            return f"{MAGIC_SECONDS + DURATION_VARS.index(name)}s"
        if name in NUMBER_VARS:
            return str(MAGIC_SECONDS + len(DURATION_VARS) + NUMBER_VARS.index(name))
        return f"{MAGIC_STRING}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"
    return substitute(expr, outside, lambda name: None)


def rate_interval_seconds() -> int:
    """What ``$__rate_interval`` parses to after ``expand_placeholders``."""
    return MAGIC_SECONDS + DURATION_VARS.index("__rate_interval")


def _regex_value(value: str | Sequence[str] | None, all_value: str) -> str:
    """A variable's value as Grafana puts it into a Prometheus regex matcher."""
    if value is None:
        return all_value
    values = [value] if isinstance(value, str) else list(value)
    return "|".join(_RE2_META.sub(r"\\\1", v) for v in values)


def _promql_string(text: str) -> str:
    """Escape text for the inside of a double-quoted PromQL string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def panel_queries(path: str | Path, *, job_id: str | Sequence[str] | None = None,
                  job: str | Sequence[str] | None = None,
                  instance: str | Sequence[str] | None = None,
                  node: str | Sequence[str] | None = None,
                  replica: str | None = None,
                  rate_interval: str = "1m", interval: str = "15s", time_range: str = "1h",
                  values: Mapping[str, str | Sequence[str] | None] | None = None,
                  annotations: bool = False) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the dashboard at ``path``.

    Variables are interpolated as Grafana would: ``job_id`` (the training
    job), ``job`` (the daemons' scrape job)/``instance``/``node``
    (or any other in ``values``) as regex-escaped literals, None for "All"
    (the variable's allValue, ``.+``; a single-select variable without All, like
    ``replica``, is empty as in Grafana when it has no options); ``$__rate_interval`` as
    ``rate_interval``, ``$__interval`` as ``interval``, ``$__range`` as
    ``time_range``. A variable the dashboard uses but that has no value here
    raises ValueError. ``annotations=True`` appends the annotation queries
    (title ``annotation: NAME``).
    """
    dash = load(path)
    given: dict[str, str | Sequence[str] | None] = {"job_id": job_id, "job": job,
                                                    "instance": instance,
                                                    "node": node, "replica": replica,
                                                    **(values or {})}
    templates = {t.get("name"): t for t in (dash.get("templating") or {}).get("list") or []}
    durations = {"__rate_interval": rate_interval, "__interval": interval,
                 "__range": time_range}

    def value(name: str, *, in_string: bool) -> str:
        if name in durations:
            return durations[name]
        t = templates.get(name)
        if t is None or t.get("type") not in ("query", "custom", "constant", "textbox"):
            raise ValueError(f"{Path(path).name}: no value for variable ${name}")
        v = given.get(name)
        if v is None and not t.get("multi") and not t.get("includeAll"):
            v = ""  # single-select without All and no options (no `replica` label): empty
        text = _regex_value(v, t.get("allValue") or ".+")
        return _promql_string(text) if in_string else text

    out = []
    for title, _idx, target, _panel in iter_targets(dash, annotations=annotations):
        expr = substitute(target["expr"], lambda n: value(n, in_string=False),
                          lambda n: value(n, in_string=True))
        out.append((title, expr))
    return out
