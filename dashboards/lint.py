"""The rules of grafana's dashboard-linter, in Python, for the ncclwatch dashboards.

    python -m dashboards.lint dashboards/grafana/*.json

prints one line per problem and exits 1 when there is any (2 on a file that
cannot be read). ``RULES`` is the table: rule name -> (scope, function);
each function's docstring says what it checks, after the rule of the same
name in github.com/grafana/dashboard-linter. Dashboard rules get the
dashboard, panel rules a panel, target rules one query (annotation queries
included, as targets of a pseudo panel ``annotation: NAME``). Each yields
messages; ``lint`` turns them into ``Problem``s.

Queries are parsed with a real PromQL parser (``promql-parser``, the Python
binding of the Rust promql-parser crate) after variables are expanded as the
real linter does (``dashboards.queries.expand_placeholders``).

Exclusions come from a ``.lint`` file beside the dashboards, in the real
linter's format (``exclusions: {RULE: {reason, entries: [{dashboard, panel,
targetIdx}]}}``); ours is JSON, which the Go linter reads as YAML too.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from pathlib import Path

import promql_parser

from dashboards.queries import expand_placeholders, iter_targets, rate_interval_seconds


@dataclass(frozen=True)
class Problem:
    rule: str
    dashboard: str
    panel: str | None
    target: int | None
    message: str

    def __str__(self) -> str:
        where = f"dashboard '{self.dashboard}'"
        if self.panel is not None:
            where += f", panel '{self.panel}'"
        if self.target is not None:
            where += f", target {self.target}"
        return f"{self.rule}: {where}: {self.message}"


@dataclass(frozen=True)
class Target:
    """One query: its panel's title (or ``annotation: NAME``), index, JSON, panel."""
    title: str
    idx: int
    json: dict
    panel: dict | None

    @property
    def expr(self) -> str:
        return self.json.get("expr") or ""


RuleFn = Callable[..., Iterable[str]]
#: rule name -> (scope: "dashboard" | "panel" | "target", function)
RULES: dict[str, tuple[str, RuleFn]] = {}


def rule(name: str, scope: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES[name] = (scope, fn)
        return fn
    return register


# --- helpers -----------------------------------------------------------------------

#: Grafana's unit ids (packages/grafana-data/src/valueFormats/categories.ts).
VALID_UNITS = frozenset("""
none string short percent percentunit humidity dB hex0x hex sci locale pixel
accMS2 accFS2 accG degree radian grad arcmin arcsec areaM2 areaF2 areaMI2
flops mflops gflops tflops pflops eflops zflops yflops ppm conppb conngm3 conngNm3
conμgm3 conμgNm3 conmgm3 conmgNm3 congm3 congNm3 conmgdL conmmolL
currencyUSD currencyGBP currencyEUR currencyJPY currencyRUB currencyUAH currencyBRL
currencyDKK currencyISK currencyNOK currencySEK currencyCZK currencyCHF currencyPLN
currencyBTC currencymBTC currencyμBTC currencyZAR currencyINR currencyKRW currencyIDR
currencyPHP currencyVND
bytes decbytes bits decbits kbytes deckbytes mbytes decmbytes gbytes decgbytes tbytes
dectbytes pbytes decpbytes
pps binBps Bps binbps bps KiBs Kibits KBs Kbits MiBs Mibits MBs Mbits GiBs Gibits GBs
Gbits TiBs Tibits TBs Tbits PiBs Pibits PBs Pbits
dateTimeAsIso dateTimeAsIsoNoDateIfToday dateTimeAsUS dateTimeAsUSNoDateIfToday
dateTimeAsLocal dateTimeAsLocalNoDateIfToday dateTimeAsSystem dateTimeFromNow
watt kwatt megwatt gwatt mwatt Wm2 voltamp kvoltamp voltampreact kvoltampreact watth
watthperkg kwatth kwattm amph kamph mamph joule ev amp kamp mamp volt kvolt mvolt dBm
ohm kohm Mohm farad µfarad nfarad pfarad ffarad henry mhenry µhenry lumens
flowgpm flowcms flowcfs flowcfm litreh flowlpm flowmlpm lux
forceNm forcekNm forceN forcekN Hs KHs MHs GHs THs PHs EHs
massmg massg masslb masskg masst lengthmm lengthin lengthft lengthm lengthkm lengthmi
pressurembar pressurebar pressurekbar pressurepa pressurehpa pressurekpa pressurehg
pressurepsi
radbq radci radgy radrad radsv radmsv radusv radrem radexpckg radr radsvh radmsvh radusvh
rotrpm rothz rotrads rotdegs celsius fahrenheit kelvin
hertz ns µs ms s m h d dtdurationms dtdurations dthms dtdhms timeticks clockms clocks
cps ops reqps rps wps iops cpm opm rpm wpm
velocityms velocitykmh velocitymph velocityknot mlitre litre m3 Nm3 dm3 gallons
bool bool_yes_no bool_on_off
""".split())

#: Panel types that show data (rows and text panels have no queries, units or data source).
_NO_DATA_PANELS = {"row", "text", "news", "dashlist", "alertlist", "annolist", "welcome"}
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_COUNTER_FUNCS = {"rate", "irate", "increase"}


def _datasource_vars(d: dict) -> list[dict]:
    return [t for t in (d.get("templating") or {}).get("list") or []
            if t.get("type") == "datasource"]


def _template(d: dict, name: str) -> dict | None:
    return next((t for t in (d.get("templating") or {}).get("list") or []
                 if t.get("name") == name), None)


def _uid(ds) -> str | None:
    """A data source reference's uid: ``{"uid": ...}``, or the old plain string."""
    if isinstance(ds, dict):
        return ds.get("uid")
    if isinstance(ds, str):
        return ds
    return None


def _templated_uids(d: dict) -> set[str]:
    return {f for t in _datasource_vars(d) for f in (f"${t.get('name')}", f"${{{t.get('name')}}}")}


def _is_prometheus_dashboard(d: dict) -> bool:
    return any(t.get("query") == "prometheus" for t in _datasource_vars(d))


def _target_type(d: dict, t: Target) -> str:
    """The data source type of a query: its own, its panel's, or the templated one."""
    for ds in (t.json.get("datasource"), (t.panel or {}).get("datasource")):
        if isinstance(ds, dict) and ds.get("type") and ds.get("type") != "datasource":
            return ds["type"]
        uid = _uid(ds)
        if uid in _templated_uids(d):
            name = uid.strip("${}")
            return (_template(d, name) or {}).get("query", "prometheus")
    return "prometheus"


@lru_cache(maxsize=1024)
def parse_promql(expr: str):
    """(AST, None) or (None, error) for a query after variable expansion."""
    if not expr.strip():
        return None, "empty query"
    expanded = expand_placeholders(expr)
    try:
        return promql_parser.parse(expanded), None
    except ValueError as e:
        return None, f"{e} (expanded: {expanded})"


def walk_with_parents(ast) -> list[tuple[object, tuple]]:
    """Every node of the AST with its ancestors, root first (as Go's parser.Walk gives)."""
    out: list[tuple[object, tuple]] = []
    stack: list = []

    def pre(node):
        out.append((node, tuple(stack)))
        stack.append(node)

    def post(node):
        stack.pop()

    promql_parser.walk(ast, pre, post)
    return out


def selectors(ast) -> list:
    return [n for n, _ in walk_with_parents(ast) if isinstance(n, promql_parser.VectorSelector)]


def metric_name(selector) -> str | None:
    if selector.name:
        return selector.name
    for m in selector.matchers.matchers:
        if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal:
            return m.value
    return None


def metric_names(expr: str) -> set[str]:
    """Metric names a query selects (empty when it does not parse)."""
    ast, _ = parse_promql(expr)
    return set() if ast is None else {n for s in selectors(ast) if (n := metric_name(s))}


def _prom_targets_only(fn: RuleFn) -> RuleFn:
    """Target rules about PromQL skip other data sources and non-Prometheus dashboards."""
    def wrapped(d: dict, t: Target) -> Iterator[str]:
        if not _is_prometheus_dashboard(d) or _target_type(d, t) != "prometheus":
            return iter(())
        return fn(d, t)
    wrapped.__doc__, wrapped.__name__ = fn.__doc__, fn.__name__
    return wrapped


# --- dashboard rules -------------------------------------------------------------

@rule("template-datasource-rule", "dashboard")
def template_datasource(d: dict) -> Iterator[str]:
    """The dashboard has a templated data source: a ``datasource`` variable named
    ``datasource`` (or ``<type>_datasource``) labelled ``Data source`` (or
    ``<Type> data source``); and every query variable takes its data from it."""
    dss = _datasource_vars(d)
    if not dss:
        yield "does not have a templated data source"
        return
    for t in dss:
        kind = (t.get("query") or "").lower()
        names = {f"{kind}_datasource"} | ({"datasource"} if len(dss) == 1 else set())
        labels = {f"{kind.title()} data source"} | ({"Data source"} if len(dss) == 1 else set())
        if t.get("name") not in names:
            yield (f"templated data source variable named '{t.get('name')}', should be "
                   f"named one of {sorted(names)}")
        if t.get("label") not in labels:
            yield (f"templated data source variable labelled '{t.get('label')}', should be "
                   f"labelled one of {sorted(labels)}")
    allowed = _templated_uids(d)
    for t in (d.get("templating") or {}).get("list") or []:
        if t.get("type") == "query" and _uid(t.get("datasource")) not in allowed:
            yield (f"query variable '{t.get('name')}' does not use the templated data source, "
                   f"uses '{_uid(t.get('datasource'))}'")


def _check_template(d: dict, name: str) -> Iterator[str]:
    if not _is_prometheus_dashboard(d):
        return
    t = _template(d, name)
    if t is None:
        yield f"is missing the {name} template"
        return
    uid = _uid(t.get("datasource"))
    if uid not in ("$datasource", "${datasource}", "$prometheus_datasource",
                   "${prometheus_datasource}"):
        yield f"{name} template should use datasource '$datasource', is currently '{uid}'"
    if t.get("type") != "query":
        yield f"{name} template should be a Prometheus query, is currently '{t.get('type')}'"
    if t.get("label") != name.title():
        yield (f"{name} template should be labelled '{name.title()}', is currently "
               f"'{t.get('label')}'")
    if not t.get("multi"):
        yield f"{name} template should be a multi select"
    if t.get("allValue") != ".+":
        yield f"{name} template allValue should be '.+', is currently '{t.get('allValue')}'"


@rule("template-job-rule", "dashboard")
def template_job(d: dict) -> Iterator[str]:
    """A Prometheus dashboard has a ``job`` variable: a query variable on the templated
    data source, labelled ``Job``, multi-select, with allValue ``.+``."""
    return _check_template(d, "job")


@rule("template-instance-rule", "dashboard")
def template_instance(d: dict) -> Iterator[str]:
    """A Prometheus dashboard has an ``instance`` variable: a query variable on the
    templated data source, labelled ``Instance``, multi-select, with allValue ``.+``."""
    return _check_template(d, "instance")


_VAR_QUERY = re.compile(r"\s*([a-z_]+)\((.*)\)\s*", re.DOTALL)


def _split_last_arg(args: str) -> tuple[str, str | None]:
    """``expr, label`` -> (expr, label); a lone argument -> (arg, None). Top-level commas only."""
    depth, quote, cut = 0, None, -1
    for i, c in enumerate(args):
        if quote:
            if c == quote and args[i - 1] != "\\":
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            cut = i
    if cut < 0:
        return args.strip(), None
    return args[:cut].strip(), args[cut + 1:].strip()


def check_variable_query(query: str) -> str | None:
    """Why a Prometheus query variable's query is invalid, or None."""
    m = _VAR_QUERY.fullmatch(query or "")
    if m is None:
        return f"invalid 'query': {query}"
    fn, args = m.groups()
    if fn not in ("label_names", "label_values", "metrics", "query_result"):
        return f"invalid 'function': {fn}"
    expr: str | None = args.strip()
    if fn == "label_values":
        expr, label = _split_last_arg(args)
        if label is None:  # label_values(label)
            expr, label = None, args.strip()
            if not _LABEL.fullmatch(label):
                _, err = parse_promql(label)
                if err:
                    return f"invalid PromQL '{label}': {err}"
        if not _LABEL.fullmatch(label or ""):
            return f"invalid label name '{label}'"
    elif fn == "metrics":
        expr = None
    if expr:
        _, err = parse_promql(expr)
        if err:
            return f"invalid PromQL '{expr}': {err}"
    return None


@rule("template-label-promql-rule", "dashboard")
def template_label_promql(d: dict) -> Iterator[str]:
    """Every query variable of a Prometheus dashboard is ``label_names(...)``,
    ``label_values([expr,] label)``, ``metrics(regex)`` or ``query_result(expr)``,
    and its PromQL parses."""
    if not _is_prometheus_dashboard(d):
        return
    for t in (d.get("templating") or {}).get("list") or []:
        if t.get("type") != "query":
            continue
        query = t.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        err = check_variable_query(query)
        if err:
            yield f"template '{t.get('name')}' invalid templated label '{query}': {err}"


@rule("template-on-time-change-reload-rule", "dashboard")
def template_on_time_change_reload(d: dict) -> Iterator[str]:
    """Every query variable refreshes on time range change (``refresh: 2``), so new
    jobs and instances appear without reloading the dashboard."""
    for t in (d.get("templating") or {}).get("list") or []:
        if t.get("type") == "query" and t.get("refresh") != 2:
            yield (f"template '{t.get('name')}' should refresh 'On time range change' "
                   f"(refresh: 2), is currently {t.get('refresh')}")


@rule("uneditable-dashboard-rule", "dashboard")
def uneditable_dashboard(d: dict) -> Iterator[str]:
    """The dashboard is not editable (``editable: false``): it is generated, edits
    belong in dashboards/generate.py."""
    if d.get("editable") is not False:
        yield "is editable, it should be set to 'editable: false'"


# --- panel rules -----------------------------------------------------------------

def _shows_data(p: dict) -> bool:
    return p.get("type") not in _NO_DATA_PANELS


@rule("panel-datasource-rule", "panel")
def panel_datasource(d: dict, p: dict) -> Iterator[str]:
    """Every data panel, and each of its targets that names a data source, uses the
    templated data source (``$datasource`` / ``${datasource}``), never a fixed uid."""
    if not _shows_data(p):
        return
    allowed = _templated_uids(d)
    uid = _uid(p.get("datasource"))
    if uid not in allowed:
        yield f"does not use a templated datasource, uses '{uid}'"
    for i, t in enumerate(p.get("targets") or []):
        if "datasource" in t and _uid(t["datasource"]) not in allowed:
            yield f"target {i} does not use a templated datasource, uses '{_uid(t['datasource'])}'"


@rule("panel-title-description-rule", "panel")
def panel_title_description(d: dict, p: dict) -> Iterator[str]:
    """Every panel but rows has a title and a description."""
    if p.get("type") == "row":
        return
    if not p.get("title") or not p.get("description"):
        yield (f"panel with id '{p.get('id')}' has missing title or description, currently has "
               f"title '{p.get('title', '')}' and description '{p.get('description', '')}'")


@rule("panel-units-rule", "panel")
def panel_units(d: dict, p: dict) -> Iterator[str]:
    """Every data panel sets a valid Grafana unit on its field defaults (``none`` is a
    choice, not a default), and every unit set in an override is valid too."""
    if not _shows_data(p):
        return
    fc = p.get("fieldConfig") or {}
    unit = (fc.get("defaults") or {}).get("unit") or ""
    if unit not in VALID_UNITS:
        yield f"has no or invalid units defined: '{unit}'"
    for o in fc.get("overrides") or []:
        for prop in o.get("properties") or []:
            if prop.get("id") == "unit" and prop.get("value") not in VALID_UNITS:
                yield f"override {o.get('matcher')} has an invalid unit: '{prop.get('value')}'"


@rule("panel-no-targets-rule", "panel")
def panel_no_targets(d: dict, p: dict) -> Iterator[str]:
    """Every data panel has at least one target."""
    if _shows_data(p) and not p.get("targets"):
        yield "has no targets"


# --- target rules ----------------------------------------------------------------

@rule("target-promql-rule", "target")
@_prom_targets_only
def target_promql(d: dict, t: Target) -> Iterator[str]:
    """Every Prometheus query parses as PromQL (variables expanded to placeholders)."""
    _, err = parse_promql(t.expr)
    if err:
        yield f"invalid PromQL query '{t.expr}': {err}"


@rule("target-logql-rule", "target")
def target_logql(d: dict, t: Target) -> Iterator[str]:
    """Loki queries would be checked as LogQL: there is no LogQL parser here and the
    ncclwatch dashboards are Prometheus-only, so any Loki target is reported."""
    if _target_type(d, t) == "loki":
        yield f"LogQL query '{t.expr}' cannot be checked here (Prometheus-only dashboards)"


@rule("target-rate-interval-rule", "target")
@_prom_targets_only
def target_rate_interval(d: dict, t: Target) -> Iterator[str]:
    """Every range vector given to rate, irate or increase uses ``$__rate_interval``
    (which Grafana keeps at least four scrape intervals wide)."""
    ast, _ = parse_promql(t.expr)
    if ast is None:
        return
    magic = timedelta(seconds=rate_interval_seconds())
    for node, parents in walk_with_parents(ast):
        if not isinstance(node, promql_parser.MatrixSelector) or not parents:
            continue
        call = parents[-1]
        if (isinstance(call, promql_parser.Call) and call.func.name in _COUNTER_FUNCS
                and node.range != magic):
            yield f"invalid PromQL query '{t.expr}': {call.func.name}() should use $__rate_interval"


def _required_matcher(d: dict, t: Target, label: str) -> Iterator[str]:
    ast, _ = parse_promql(t.expr)
    if ast is None:
        return
    want = f"${label}"
    for s in selectors(ast):
        found = [m for m in s.matchers.matchers if m.name == label]
        if not found:
            yield f"invalid PromQL query '{t.expr}': {label} selector not found in {s}"
        elif not any(m.op == promql_parser.MatchOp.Re and m.value == want for m in found):
            yield f"invalid PromQL query '{t.expr}': {label} selector in {s} is not =~\"{want}\""


@rule("target-job-rule", "target")
@_prom_targets_only
def target_job(d: dict, t: Target) -> Iterator[str]:
    """Every selector of every Prometheus query has the matcher ``job=~"$job"``."""
    return _required_matcher(d, t, "job")


@rule("target-instance-rule", "target")
@_prom_targets_only
def target_instance(d: dict, t: Target) -> Iterator[str]:
    """Every selector of every Prometheus query has the matcher ``instance=~"$instance"``."""
    return _required_matcher(d, t, "instance")


@rule("target-counter-agg-rule", "target")
@_prom_targets_only
def target_counter_agg(d: dict, t: Target) -> Iterator[str]:
    """Every counter (a metric named ``*_total``) is read through rate, irate or
    increase over a range, never as a raw value."""
    ast, _ = parse_promql(t.expr)
    if ast is None:
        return
    for node, parents in walk_with_parents(ast):
        if not isinstance(node, promql_parser.VectorSelector):
            continue
        name = metric_name(node) or ""
        if not name.endswith("_total"):
            continue
        ok = (len(parents) >= 2 and isinstance(parents[-1], promql_parser.MatrixSelector)
              and isinstance(parents[-2], promql_parser.Call)
              and parents[-2].func.name in _COUNTER_FUNCS)
        if not ok:
            yield (f"counter metric '{node}' is not aggregated with rate, irate, or increase "
                   f"in '{t.expr}'")


# --- running the rules -------------------------------------------------------------

def load_config(folder: str | Path) -> dict:
    """The ``.lint`` file of a dashboards folder ({} when there is none)."""
    path = Path(folder) / ".lint"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def _excluded(config: dict, p: Problem) -> bool:
    if p.rule not in (config.get("exclusions") or {}):
        return False
    entries = (config["exclusions"][p.rule] or {}).get("entries") or []
    if not entries:
        return True  # the whole rule is off
    for e in entries:
        if "dashboard" in e and e["dashboard"] != p.dashboard:
            continue
        if "panel" in e and e["panel"] != p.panel:
            continue
        if str(e.get("targetIdx", "")) not in ("", str(p.target)):
            continue
        return True
    return False


def lint(dashboard: dict, config: dict | None = None,
         rules: Sequence[str] | None = None) -> list[Problem]:
    """Every problem the rules (default: all of ``RULES``) find, less the exclusions."""
    title = dashboard.get("title", "")
    out: list[Problem] = []
    for name in rules or RULES:
        scope, fn = RULES[name]
        if scope == "dashboard":
            out += [Problem(name, title, None, None, m) for m in fn(dashboard)]
        elif scope == "panel":
            for p in dashboard.get("panels") or []:
                for q in [p, *(p.get("panels") or [])]:
                    out += [Problem(name, title, q.get("title", ""), None, m)
                            for m in fn(dashboard, q)]
        else:
            for ptitle, idx, tj, panel in iter_targets(dashboard):
                t = Target(ptitle, idx, tj, panel)
                out += [Problem(name, title, ptitle, idx, m) for m in fn(dashboard, t)]
    return [p for p in out if not _excluded(config or {}, p)]


def lint_file(path: str | Path) -> list[Problem]:
    path = Path(path)
    return lint(json.loads(path.read_text()), load_config(path.parent))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    total = 0
    for arg in args:
        try:
            problems = lint_file(arg)
        except (OSError, ValueError) as e:
            print(f"{arg}: {e}", file=sys.stderr)
            return 2
        for p in problems:
            print(f"{arg}: {p}")
        total += len(problems)
    print(f"{total} problem(s) in {len(args)} dashboard(s)", file=sys.stderr)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
