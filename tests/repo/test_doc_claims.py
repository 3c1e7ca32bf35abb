"""What the user docs state of the code is what the code does.

The user docs (README.md and docs/*.md but the developers' page) name
commands, flags, defaults, paths the install writes, counts, versions and the
headings other files point at. Each kind of statement has a rule here that
finds every one of them in the text and checks it against the code that
decides it: the CLI parsers (``ncclwatch.cli.build_parser``), the options
declared once (``ncclwatch/config.py`` and the settings dataclasses),
``ncclwatch/install.py``'s KINDS, the units in ``systemd/``, the shipped
example configs and manifests, the release's Python list. A rule that finds
nothing to check fails too, so a rewrite of the docs cannot silence it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable, Iterator

import pytest

from ncclwatch import certs, install, kubecerts
from ncclwatch.cli import AGENT_OPTIONS, DAEMON_OPTIONS, RUN_OPTIONS, build_parser
from tests.harness.paths import ROOT
from tests.harness.release import PYTHONS  # the release's one list of supported Pythons

DOCS = ROOT / "docs"
#: Pages for users: everything but the developers' page (tests, module map)
#: and BENCHMARKS.md (which names the bench scripts and tests it measured).
USER_DOCS = sorted([ROOT / "README.md", *(p for p in DOCS.glob("*.md")
                                          if p.name != "development.md")])
UNITS = sorted((ROOT / "systemd").glob("*.service"))


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Found:
    """One statement in a doc: where, and what it says."""
    doc: Path
    line: int
    text: str

    def at(self) -> str:
        return f"{rel(self.doc)}:{self.line}: {self.text}"


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def code_texts(doc: Path) -> Iterator[tuple[int, str]]:
    """Every piece of code in a page, as a shell would read it: each line of a
    fenced block (backslash continuations joined) and each inline `span`."""
    text = doc.read_text()
    fences = list(re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S))
    for m in fences:
        body = re.sub(r"\\\n\s*", " ", m.group(1))
        first = _line_of(text, m.start(1))
        # A session (`$ command`, then its output): only the commands are code.
        session = body.lstrip().startswith("$ ")
        for n, line in enumerate(body.split("\n")):
            if not session or line.startswith("$ "):
                yield first + n, line
    outside = text
    for m in reversed(fences):   # spans outside the blocks, at their own lines
        outside = outside[:m.start()] + "\n" * m.group(0).count("\n") + outside[m.end():]
    for m in re.finditer(r"`([^`\n]+)`", outside):
        yield _line_of(outside, m.start()), m.group(1).replace("\\|", " ")


# --- commands and their flags -------------------------------------------------

def _commands() -> dict[str, object]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(sub.choices)


COMMANDS = _commands()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Where one shell command ends and the next begins.
SEPARATOR = re.compile(r"&&|\|\||\s\|\s|;\s|\s#\s")


def invocations(code: str) -> Iterator[tuple[str, list[str]]]:
    """(verb, the words after it) of each command in ``code`` whose program is
    ncclwatch (after any VAR=value, `$ ` or sudo); `$(...)` reads as a word."""
    code = re.sub(r"\$\([^()]*\)", "X", code)
    for part in SEPARATOR.split(code):
        words = part.split()
        while words and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0])
                         or words[0] in ("$", "sudo")):
            words.pop(0)
        if len(words) >= 2 and (words[0] == "ncclwatch" or words[0].endswith("/bin/ncclwatch")):
            yield words[1], words[2:]


def command_uses() -> list[tuple[Found, str, str]]:
    """(where, verb, its arguments) for every `ncclwatch VERB ...` in code."""
    out = []
    for doc in USER_DOCS:
        for line, code in code_texts(doc):
            for verb, rest in invocations(code):
                text = " ".join(["ncclwatch", verb, *rest])
                out.append((Found(doc, line, text), verb, " ".join(rest)))
    return out


def test_every_command_and_flag_the_docs_give_exists() -> None:
    """Each `ncclwatch VERB --flag` is a verb of the CLI and a flag its parser
    takes; the words after `install`/`render` are kinds they take."""
    uses = command_uses()
    wrong = []
    for found, verb, rest in uses:
        sub = COMMANDS.get(verb)
        if sub is None:
            wrong.append(f"{found.at()}\n    no command `ncclwatch {verb}` "
                         f"(commands: {', '.join(sorted(COMMANDS))})")
            continue
        takes = {s for a in sub._actions for s in a.option_strings}
        for flag in FLAG.findall(rest):
            if flag not in takes:
                wrong.append(f"{found.at()}\n    `ncclwatch {verb}` takes no {flag} "
                             f"(`ncclwatch {verb} --help`)")
        # The words a positional with choices takes (install's KINDs, render's KIND).
        kind = next((a for a in sub._actions if not a.option_strings and a.choices), None)
        words = rest.split("--", 1)[0].split() if kind else []
        for word in words[:None if kind and kind.nargs in ("+", "*") else 1]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break          # a placeholder (KIND, DIR...), a redirect, the end
            if word not in kind.choices:
                wrong.append(f"{found.at()}\n    `ncclwatch {verb}` takes no {word!r} "
                             f"(it takes {', '.join(kind.choices)})")
    assert len(uses) >= 40, f"found only {len(uses)} `ncclwatch VERB` commands in the docs"
    assert not wrong, "\n".join(wrong)


#: Flags the docs name alone that belong to other programs, and whose.
#: (Flags of programs whose command lines the agent reads are in its source.)
FOREIGN = {
    "--container-mounts": "srun (pyxis)", "--container-remap-root": "srun (pyxis)",
    "--enable_each_rank_log": "DeepSpeed's launcher", "--master_port": "deepspeed",
    "--rdzv-endpoint": "torchrun", "--rdzv-id": "torchrun",
    "--use-env": "python -m torch.distributed.launch",
    "--tag-output": "mpirun (Open MPI)", "--timestamp-output": "mpirun (Open MPI)",
    "--no-build-isolation": "pip", "--require-hashes": "pip", "--state": "scancel",
    "--key": "a rank's command line (a redaction example)",
    "--password": "a rank's command line (a redaction example)",
}
ALONE = re.compile(r"--[a-z][\w.-]*\w|--[a-z][\w-]*-")


def test_every_flag_named_alone_is_a_flag_of_something() -> None:
    """A `--flag` in prose is a flag of an ncclwatch command (`--tls-` for a
    family of them), of a program ncclwatch reads the command line of (its
    source names it), or of another program FOREIGN names."""
    ours = {s for sub in COMMANDS.values() for a in sub._actions for s in a.option_strings}
    source = "\n".join(p.read_text() for top in ("ncclwatch", "deploy", "dashboards")
                       for p in (ROOT / top).rglob("*.py"))
    wrong, seen = [], 0
    for doc in USER_DOCS:
        for line, code in code_texts(doc):
            m = ALONE.match(code)
            if not m:
                continue
            flag, seen = m.group(0), seen + 1
            if (flag in ours or flag in FOREIGN or f'"{flag}' in source or f"'{flag}" in source
                    or flag.endswith("-") and any(o.startswith(flag) for o in ours)):
                continue
            wrong.append(f"{rel(doc)}:{line}: `{code}`\n    {flag} is no flag of an ncclwatch "
                         "command (`ncclwatch COMMAND --help`); another program's goes in "
                         "FOREIGN with its program")
    assert seen >= 30, f"found only {seen} flags named alone"
    assert not wrong, "\n".join(wrong)


# --- defaults stated beside an option -------------------------------------------

def option_defaults() -> dict[str, list[object]]:
    """Every way a user names a setting (--flag, toml_key, NCCLWATCH_ENV) ->
    its defaults: the declared option's (daemon, agent, run), or the plain
    argparse default of a command's own flag."""
    out: dict[str, list[object]] = {}
    for o in (*DAEMON_OPTIONS, *AGENT_OPTIONS, *RUN_OPTIONS):
        if not o.table:
            for name in (o.flag, o.name, o.env):
                out.setdefault(name, []).append(o.default)
    for sub in COMMANDS.values():
        for a in sub._actions:
            if a.default not in (None, False) and a.option_strings:
                for s in a.option_strings:
                    out.setdefault(s, []).append(a.default)
    return out


DEFAULTS = option_defaults()
#: A setting in backquotes (`--flag`, `--flag METAVAR`, `toml_key`,
#: `NCCLWATCH_ENV`), then the number a reader takes for its default:
#: "(30 s", ", 30 s", "; default 10", "(default 1 GiB"...
NAMED = re.compile(r"`(?P<name>--[a-z][a-z0-9-]*|[a-z][a-z0-9_]*|NCCLWATCH_[A-Z0-9_]+)"
                   r"(?: [^`]*)?`")
#: A number with a unit may go on in words ("120 s after ..."); a bare one
#: must end its clause ("default 0: one process", "(5 s)").
#: A bare number after ';' is no default ("`--pause-budget`; 0: none").
STATED = re.compile(r"(?:\s*[,;(]?\s*default:?\s+|\s*[,(]?\s*)(?P<num>\d+(?:\.\d+)?)"
                    r"(?:(?P<unit>\s*(?:s|seconds|[KMG]iB))\b|(?=\s*[,;:)]))")
SCALE = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
#: A row of a settings table: | `name` | default | ...
ROW = re.compile(r"^\| `(?P<name>[a-z][a-z0-9_]*)` \| (?P<num>\d+)\b", re.M)


def stated_defaults() -> list[tuple[Found, str, float]]:
    out = []
    for doc in USER_DOCS:
        text = doc.read_text()
        for m in NAMED.finditer(text):
            if m["name"] not in DEFAULTS:
                continue
            said = STATED.match(text, m.end())
            if said:
                unit = (said["unit"] or "").strip()
                value = float(said["num"]) * SCALE.get(unit, 1)
                out.append((Found(doc, _line_of(text, m.start()),
                                  text[m.start():said.end()].replace("\n", " ")),
                            m["name"], value))
        for m in ROW.finditer(text):
            if m["name"] in DEFAULTS:
                out.append((Found(doc, _line_of(text, m.start()), m.group(0)), m["name"],
                            float(m["num"])))
    return out


def _numbers(values: list[object]) -> set[float]:
    out = set()
    for v in values:
        try:
            out.add(float(v))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass
    return out


def test_every_default_stated_beside_an_option_is_its_default() -> None:
    said = stated_defaults()
    wrong = [f"{found.at()}\n    the default of {name} is "
             f"{' or '.join(sorted({str(d) for d in DEFAULTS[name]}))}, not {value:g}"
             for found, name, value in said if value not in _numbers(DEFAULTS[name])]
    assert len(said) >= 20, f"found only {len(said)} stated defaults:\n" + "\n".join(
        f.at() for f, _, _ in said)
    assert not wrong, "\n".join(wrong)


# --- paths on a node ----------------------------------------------------------

#: Where ncclwatch puts things on a node: a path under one of these that a page
#: names must be one the code writes or names.
NODE_PLACES = ("/etc/ncclwatch", "/opt/ncclwatch", "/etc/systemd/system", "/usr/lib/systemd",
               "/etc/prometheus/ncclwatch", "/var/lib/grafana/dashboards",
               "/usr/local/share/doc/ncclwatch", "/etc/slurm", "/etc/default/ncclwatch",
               "/run/ncclwatch-view", "/run/credentials")
NODE_PATH = re.compile(r"(?<![\w.:/-])(?:" + "|".join(map(re.escape, NODE_PLACES))
                       + r")[\w.@*<>-]*(?:/[\w.@*<>-]+)*/?")
ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:etc|opt|usr|var|run)/[\w./@-]+")


def made_by_the_steps() -> set[str]:
    """What the pages' own commands put in place: `install -D ... SRC DEST`,
    and a unit's `LoadCredential=NAME:SRC` (NAME in the credentials folder of
    the unit that runs as a DynamicUser, the daemon's)."""
    [unit] = [u.name for u in UNITS if "DynamicUser=yes" in u.read_text()]
    out = set()
    for doc in USER_DOCS:
        for _, code in code_texts(doc):
            m = re.search(r"^\s*install -D .* (/\S+)$", code.split("#")[0].rstrip())
            if m:
                out.add(m[1])
            m = re.search(r"LoadCredential=([\w.-]+):(/\S+)", code)
            if m:
                out.update({f"/run/credentials/{unit}/{m[1]}", m[2]})
    return out


def known_paths() -> set[str]:
    """Every path the install writes (each kind's destination and files), the
    units, example configs, manifests and the package name, the venv the docs
    install into holds, and what the pages' own steps put in place."""
    out = set()
    for name, k in install.KINDS.items():
        out.add(k.dest)
        out.update(f"{k.dest}/{k.name(src.name)}" for src in install.sources(name))
    named = [*UNITS, *(ROOT / "systemd" / "examples").glob("*.toml"),
             *(ROOT / "deploy" / "kubernetes").glob("*.yaml"), ROOT / "deploy/slurm/task-prolog.sh",
             ROOT / "Containerfile", *(ROOT / "ncclwatch").rglob("*.py")]
    for f in named:
        out.update(p.rstrip(".,;:)'\"") for p in ABSOLUTE.findall(f.read_text()))
    prefix = install.SHIPPED_PREFIX
    out.update({f"{prefix}/bin/ncclwatch", f"{prefix}/bin/pip", f"{prefix}/bin/python",
                f"{prefix}/share/doc/ncclwatch", f"{prefix}/share/ncclwatch"})
    out.update(f"{prefix}/share/{k.share}" for k in install.KINDS.values())
    return out | made_by_the_steps()


def test_every_node_path_the_docs_name_is_one_the_code_writes_or_names() -> None:
    known = known_paths()
    places = {p.rstrip("/") for p in known}
    dirs = {str(q) for p in places for q in Path(p).parents}   # a folder of a known file
    wrong, seen = [], 0
    for doc in USER_DOCS:
        text = doc.read_text()
        for m in NODE_PATH.finditer(text):
            path = m.group(0).rstrip("/.")
            seen += 1
            if path in places or path in dirs or any(fnmatch(path, p) or fnmatch(p, path)
                                                     for p in places):
                continue
            wrong.append(f"{rel(doc)}:{_line_of(text, m.start())}: {path}\n    no kind of "
                         "`ncclwatch install` writes it and no unit, example config, "
                         "manifest or default names it")
    assert seen >= 30, f"found only {seen} node paths in the docs"
    assert not wrong, "\n".join(wrong)


#: What the README says `ncclwatch install` puts where: kind -> the files it names of it.
README_INSTALLS = {"rules": ("alerts.yaml", "rules.yaml", "alertmanager"),
                   "dashboards": ("Grafana dashboards",)}


def test_the_readme_says_where_the_install_puts_what_prometheus_and_grafana_load() -> None:
    """A wheel install has no checkout: the README names each kind's command and
    destination (install.KINDS), the files it names are the kind's, and it names no
    checkout path of an installed file in backquotes (`dashboards/grafana/*.json`)."""
    text = (ROOT / "README.md").read_text()
    flat = " ".join(text.split())
    wrong = []
    for kind, names in README_INSTALLS.items():
        k = install.KINDS[kind]
        at = re.search(rf"`ncclwatch install [a-z ]*\b{kind}\b[a-z ]*`", flat)
        if not at:
            wrong.append(f"README.md gives no `ncclwatch install ... {kind}`")
            continue
        # The destination follows the command, before the next paragraph's end.
        said = flat[at.end():at.end() + 400]
        if not re.search(rf"`{re.escape(k.dest)}/?`", said):
            wrong.append(f"README.md: `install {kind}` writes to {k.dest}: not said after "
                         f"{at.group(0)}")
        shipped = " ".join([k.name(src.name) for src in install.sources(kind)] + [k.help])
        for name in names:
            if name not in said:
                wrong.append(f"README.md: {name!r} not said of `install {kind}`")
            elif name.lower() not in shipped.lower():
                wrong.append(f"README.md: {name!r} is no file or part of `install {kind}` "
                             f"({shipped})")
    for m in re.finditer(r"`([\w./*-]+)`", text):
        for kind, k in install.KINDS.items():
            if any(fnmatch(m[1], g) or m[1].rstrip("/") == g.rsplit("/", 1)[0]
                   for g in k.sources):
                wrong.append(f"README.md:{_line_of(text, m.start())}: {m[1]} is a checkout "
                             f"path; on a node `install {kind}` puts it in {k.dest}")
    assert not wrong, "\n".join(wrong)


# --- paths in the repository -------------------------------------------------------

REPO_PATH = re.compile(r"(?<![\w.:/<-])(?:ncclwatch|deploy|systemd|dashboards|requirements|bench"
                       r"|docs)/[\w.*/-]*[\w*/]")


def test_every_file_of_the_repository_the_docs_name_is_there() -> None:
    wrong, seen = [], 0
    for doc in USER_DOCS:
        text = doc.read_text()
        for m in REPO_PATH.finditer(text):
            path = m.group(0)
            seen += 1
            if not (any(ROOT.glob(path.rstrip("/"))) or (ROOT / path).exists()):
                wrong.append(f"{rel(doc)}:{_line_of(text, m.start())}: {path} is not in "
                             "the repository")
    assert seen >= 50, f"found only {seen} repository paths in the docs"
    assert not wrong, "\n".join(wrong)


def test_no_user_doc_cites_a_test_file() -> None:
    """Users read what is proven, not where: test paths belong to
    docs/development.md."""
    found = [f"{rel(doc)}:{n}: {line.strip()}"
             for doc in [*USER_DOCS, *sorted((DOCS / "runbooks").glob("*.md"))]
             for n, line in enumerate(doc.read_text().splitlines(), 1)
             if re.search(r"(?<![\w/.-])tests/", line)]
    assert not found, "say what the test proves instead of its path:\n" + "\n".join(found)


# --- unit settings -------------------------------------------------------------

def unit_lines() -> dict[str, list[str]]:
    """Directive -> its values, over every shipped unit."""
    out: dict[str, list[str]] = {}
    for unit in UNITS:
        for line in unit.read_text().splitlines():
            m = re.match(r"([A-Z][A-Za-z]+)=(.*)$", line)
            if m:
                out.setdefault(m[1], []).append(m[2])
    return out


def test_every_unit_setting_the_docs_quote_is_in_a_unit() -> None:
    units = unit_lines()
    wrong, seen = [], 0
    for doc in USER_DOCS:
        for line, code in code_texts(doc):
            m = re.fullmatch(r"([A-Z][A-Za-z]+)=(\S.*)", code.strip())
            if not m or m[1] not in units:
                continue
            seen += 1
            if not any(v == m[2] or v.startswith(m[2] + " ") for v in units[m[1]]):
                wrong.append(f"{rel(doc)}:{line}: {code}\n    the units say "
                             + "; ".join(f"{m[1]}={v}" for v in units[m[1]]))
    assert seen >= 5, f"found only {seen} unit settings quoted in the docs"
    assert not wrong, "\n".join(wrong)


# --- counts, versions and other single facts ------------------------------------

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def _number(word: str) -> int:
    return WORDS[word.lower()] if word.lower() in WORDS else int(word)


def _agent_capabilities() -> int:
    [caps] = [line.split("=", 1)[1].split() for line in
              (ROOT / "systemd" / "ncclwatch-agent.service").read_text().splitlines()
              if line.startswith("CapabilityBoundingSet=")]
    return len(caps)


def _support(component: str) -> str:
    """The 'needs' cell of a row of the support matrix."""
    text = (DOCS / "support.md").read_text()
    m = re.search(rf"^\| {re.escape(component)} \| ([^|]*)\|", text, re.M)
    assert m, f"docs/support.md has no row '{component}'"
    return m[1]


def _port(option: str) -> int:
    [default] = {o.default for o in DAEMON_OPTIONS if o.name == option}
    return int(str(default).rpartition(":")[2])


def _example_daemon_host() -> str:
    """The one host both listeners of the example daemon.toml (what `install
    config` writes, the unit reads) bind."""
    text = (ROOT / "systemd" / "examples" / "daemon.toml").read_text()
    hosts = {re.search(rf'^{key} = "([^"]*):\d+"', text, re.M)[1] for key in ("grpc", "http")}
    assert len(hosts) == 1, hosts
    return hosts.pop()


def _container_user() -> int:
    [user] = re.findall(r"^USER (\d+)", (ROOT / "Containerfile").read_text(), re.M)
    return int(user)


@dataclass(frozen=True)
class Claim:
    """A kind of statement: where a page says it (a pattern whose first group is
    the value said), what that value is by the code, and how a said value reads."""
    what: str
    said: re.Pattern[str]
    truth: Callable[[], object]
    read: Callable[[str], object] = str
    #: Some page must say it (a fact users need).
    required: bool = True


CLAIMS = (
    Claim("the number of units (systemd/*.service)",
          re.compile(r"\b(one|two|three|four|five|six|\d+) (?:systemd )?units\b", re.I),
          lambda: len(UNITS), _number),
    Claim("the agent's capabilities (its unit's CapabilityBoundingSet)",
          re.compile(r"\bagent\b[^.]{0,60}?\b(one|two|three|four|\d+) capabilities\b", re.I),
          _agent_capabilities, _number),
    Claim("the oldest Python the release supports (the release's PYTHONS)",
          re.compile(r"\bC?Python (3\.\d+) to 3\.\d+"), lambda: PYTHONS[0]),
    Claim("the newest Python the release supports (the release's PYTHONS)",
          re.compile(r"\bC?Python 3\.\d+ to (3\.\d+)"), lambda: PYTHONS[-1]),
    Claim("the daemon's gRPC port (--grpc's default)",
          re.compile(r"\b(\d{4})/tcp \(gRPC"), lambda: _port("grpc"), int),
    Claim("the daemon's HTTP port (--http's default)",
          re.compile(r"\b(\d{4})/tcp \(HTTPS?"), lambda: _port("http"), int),
    Claim("the image's user (the Containerfile's USER)",
          re.compile(r"\b(?:user|uid) (\d{5})\b"), _container_user, int),
    Claim("how long cert-manager certificates last (kubecerts.DURATION)",
          re.compile(r"Certificates last (a year)"), lambda: kubecerts.DURATION,
          lambda s: "8760h"),
    Claim("how long before their end they are renewed (kubecerts.RENEW_BEFORE)",
          re.compile(r"renewed (\d+) days before"), lambda: kubecerts.RENEW_BEFORE,
          lambda s: f"{int(s) * 24}h"),
    Claim("how long `ncclwatch certs` certificates last (certs.VALID_DAYS)",
          re.compile(r"certificates valid (one year)"), lambda: certs.VALID_DAYS,
          lambda s: 365),
    Claim("the Prometheus the rules need (docs/support.md)",
          re.compile(r"Prometheus \(>= ([\d.]+)\)"),
          lambda: re.search(r">= ([\d.]+)", _support("Prometheus"))[1]),
    Claim("the Grafana the dashboards need (docs/support.md)",
          re.compile(r"Grafana(?:\*\*)? \(>= ([\d.]+)\)"),
          lambda: re.search(r">= ([\d.]+)", _support("Grafana"))[1]),
    Claim("the Prometheus Operator the PrometheusRule needs (docs/support.md)",
          re.compile(r"Prometheus Operator \(>= ([\d.]+)\)"),
          lambda: re.search(r"operator >= ([\d.]+)", _support("Prometheus Operator"))[1]),
    Claim("the kinds `install all` leaves out (install.KINDS in_all)",
          re.compile(r"`install all` installs every kind but `(\w+)`"),
          lambda: ",".join(n for n, k in install.KINDS.items() if not k.in_all)),
    Claim("where `install slurm` puts the TaskProlog",
          re.compile(r"(/etc/slurm/[\w.-]*ncclwatch[\w.-]*)"),
          lambda: f"{install.KINDS['slurm'].dest}/{install.KINDS['slurm'].name('task-prolog.sh')}"),
    Claim("what the example daemon.toml listens on (its grpc and http)",
          re.compile(r"example `daemon\.toml` listens on ([\d.]+\d|[\w-]+)"),
          _example_daemon_host, lambda s: "127.0.0.1" if s == "loopback" else s),
    Claim("where the example configs are on a node (`install config`'s destination)",
          re.compile(r"\bExamples?: `([^`]+?)/?`"), lambda: install.KINDS["config"].dest),
    Claim("the lock the wheel installs with (requirements/*.lock)",
          re.compile(r"`((?:requirements/)?runtime\.lock)`"),
          lambda: "requirements/runtime.lock",
          lambda s: "requirements/runtime.lock" if (ROOT / "requirements" / Path(s).name)
          .is_file() else s),
)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.what)
def test_each_stated_fact_is_the_codes(claim: Claim) -> None:
    truth = claim.truth()
    pattern = re.compile(claim.said.pattern.replace(" ", r"\s+"), claim.said.flags)  # any wrap
    said = [(Found(doc, _line_of(text, m.start()), " ".join(m.group(0).split())),
             claim.read(m.group(1)))
            for doc in USER_DOCS for text in [doc.read_text()]
            for m in pattern.finditer(text)]
    if claim.required:
        assert said, f"no page states {claim.what} ({claim.said.pattern})"
    wrong = [f"{found.at()}\n    {claim.what} is {truth!r}, not {value!r}"
             for found, value in said if value != truth]
    assert not wrong, "\n".join(wrong)


# --- links and the headings other files name -------------------------------------

def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    fenced = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    out = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", fenced, re.M)}
    return out | set(re.findall(r'<a id="([^"]+)"></a>', text))


def headings(page: Path) -> list[str]:
    """Section headings and bold lead-ins (`**Budget.**`) of a page."""
    text = page.read_text()
    return (re.findall(r"^#{1,6} (.+)$", text, re.M)
            + re.findall(r"^\s*(?:- )?\*\*([^*]+)\*\*", text, re.M))


def test_every_link_to_a_section_of_the_docs_finds_it() -> None:
    wrong, seen = [], 0
    for doc in [*USER_DOCS, DOCS / "development.md"]:
        text = doc.read_text()
        for m in re.finditer(r"\]\(([\w./-]*\.md)#([\w-]+)\)", text):
            target = (doc.parent / m[1]).resolve()
            seen += 1
            if not target.exists() or m[2] not in anchors(target):
                wrong.append(f"{rel(doc)}:{_line_of(text, m.start())}: {m[1]}#{m[2]}: no such "
                             "section")
    assert seen >= 20, f"found only {seen} links to sections"
    assert not wrong, "\n".join(wrong)


#: A page named as text: docs/PAGE.md, or as a unit's Documentation= names it
#: (share/doc/ncclwatch/PAGE.md), with an anchor or a quoted title, a title also
#: on the comment's next line.
DOC_REF = re.compile(r'(?:docs|share/doc/ncclwatch)/([\w-]+\.md)'
                     r'(?:#([\w-]+)|,?\s+(?:#\s*)?\(?"([A-Z][^"\n]*)")?')
MORE_TITLES = re.compile(r',\s+(?:#\s*)?"([A-Z][^"\n]*)"')
#: Where files name a docs section as text, by anchor (docs/scaling.md#high-availability)
#: or by title (docs/security.md "Ranks whose root is a chroot"): each one exists.
SOURCES = ("systemd", "deploy", "dashboards", "ncclwatch", "docs", "tests")


def test_every_section_a_file_names_exists() -> None:
    wrong, seen = [], 0
    for top in SOURCES:
        for f in sorted((ROOT / top).rglob("*")):
            if (not f.is_file() or f.suffix in (".pyc", ".json", ".gz", ".pt", ".svg")
                    or "data" in f.relative_to(ROOT).parts):
                continue
            try:
                text = f.read_text()
            except UnicodeDecodeError:
                continue
            for m in DOC_REF.finditer(text):
                page, anchor, title = DOCS / m[1], m[2], m[3]
                if not (anchor or title) or not m[0].startswith("docs/"):
                    continue
                seen += 1
                if not page.exists() or (
                        anchor not in anchors(page) if anchor
                        else not any(h.startswith(title) for h in headings(page))):
                    wrong.append(f"{rel(f)}:{_line_of(text, m.start())}: docs/{m[1]} has no "
                                 f"section {anchor or title!r}")
    assert seen >= 30, f"found only {seen} sections named by anchor or title"
    assert not wrong, "\n".join(wrong)


#: What ships (the units, example configs, Slurm prolog, Kubernetes layouts, rules,
#: dashboards, runbooks and the docs themselves, which the wheel installs under
#: share/doc/ncclwatch): each docs page they name exists, and each section they name
#: (by anchor, docs/scaling.md#high-availability, by title, or by a Markdown link
#: between pages) is one that says it, not a heading left behind with only a link
#: to where it moved.
SHIPPED = ("README.md", "systemd/*.service", "systemd/examples/*.toml", "deploy/slurm/*",
           "deploy/kubernetes/**/*.yaml", "dashboards/prometheus/*", "dashboards/grafana/*.json",
           "ncclwatch/runbook_pages/*.md", "docs/**/*.md")
#: A Markdown link to a section of another page (the docs' own links).
MD_SECTION = re.compile(r"\]\(([\w./-]*\.md)#([\w-]+)\)")
#: A link in Markdown, for a section's words without them.
LINK = re.compile(r"\[[^\]]*\]\([^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def section_words(page: Path, anchor: str | None, title: str | None) -> str | None:
    """The words of a page's section (the heading with that anchor, or a heading or
    bold lead-in starting with that title) up to the next heading (a `#` line of a
    fenced block is code, not a heading), links left out; None when the page has
    no such section."""
    text = page.read_text()
    # Blank each fenced block's `#` lines, keeping the line count.
    lines = FENCE.sub(lambda m: re.sub(r"(?m)^#", " ", m[0]), text).splitlines()
    for i, line in enumerate(lines):
        h = re.match(r"^#{1,6} (.+)$", line)
        lead = re.match(r"^\s*(?:- )?\*\*([^*]+)\*\*(.*)$", line)
        # An explicit anchor names the heading on the line after it.
        named = anchor and line.strip() == f'<a id="{anchor}"></a>'
        hit = ((anchor and h and slug(h[1]) == anchor)
               or (title and ((h and h[1].startswith(title)) or (lead and lead[1].startswith(title)))))
        if hit or named:
            body = [lead[2]] if lead and not h else []
            for nxt in lines[i + (2 if named else 1):]:
                if nxt.startswith("#"):
                    break
                body.append(nxt)
            return " ".join(LINK.sub(" ", " ".join(body)).split())
    return None


def shipped_doc_refs() -> Iterator[tuple[str, Path, str | None, str | None]]:
    """(where, page, anchor, title) of every docs page or section a shipped file names."""
    for pattern in SHIPPED:
        for f in sorted(ROOT.glob(pattern)):
            if not f.is_file():
                continue
            text = f.read_text()
            refs = []
            for m in DOC_REF.finditer(text):
                if f.suffix == ".md" and text[m.start() - 2:m.start()] == "](":
                    continue   # a link's target in Markdown: MD_SECTION's, from the page's folder
                page = (ROOT / "README.md" if m[1] == "README.md" and m[0].startswith("share")
                        else DOCS / m[1])
                refs.append((m.start(), m[0], page, m[2], m[3]))
                # more titles of the same page, each after a comma
                pos = m.end()
                while m[3] and (more := MORE_TITLES.match(text, pos)):
                    refs.append((more.start(1), f'docs/{m[1]} "{more[1]}"', page, None, more[1]))
                    pos = more.end()
            if f.suffix == ".md":
                refs += [(m.start(), m[0], (f.parent / m[1]).resolve(), m[2], None)
                         for m in MD_SECTION.finditer(text)]
            for pos, said, page, anchor, title in refs:
                yield f"{rel(f)}:{_line_of(text, pos)}: {said}", page, anchor, title


def test_every_docs_section_a_shipped_file_names_says_it() -> None:
    wrong, seen, sections = [], 0, 0
    for at, page, anchor, title in shipped_doc_refs():
        seen += 1
        if not page.exists():
            wrong.append(f"{at}: no such page")
            continue
        if not (anchor or title):
            continue
        sections += 1
        words = section_words(page, anchor, title)
        if words is None:
            wrong.append(f"{at}: no such section")
        elif len(re.findall(r"[A-Za-z]{2,}", words)) < 5:
            wrong.append(f"{at}: the section only points on ({words!r}): name the "
                         "page and section it links to")
    assert seen >= 80 and sections >= 60, (
        f"found only {seen} docs references ({sections} to a section) in {SHIPPED}")
    assert not wrong, "\n".join(wrong)
