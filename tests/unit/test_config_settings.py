"""Every setting is declared once, on the dataclass field that holds it.

The Options of each command derive from those fields (config.options_of):
their defaults are the fields' defaults, agent and run take the same agent
settings, no code repeats a default where it reads a setting, and a config
file's keys and tables are only those the command takes.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import subprocess
import sys

import pytest

from ncclwatch.cli import AGENT_OPTIONS, DAEMON_OPTIONS, RUN_OPTIONS, build_parser
from ncclwatch.config import _META, _SAME, ConfigError, field_default, load_file, resolve
from tests.harness.paths import ROOT

COMMANDS = {"daemon": DAEMON_OPTIONS, "agent": AGENT_OPTIONS, "run": RUN_OPTIONS}


def _field(home: str) -> dataclasses.Field:
    module, cls, name = home.rsplit(".", 2)
    holder = getattr(importlib.import_module(module), cls)
    return {f.name: f for f in dataclasses.fields(holder)}[name]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_default_is_its_field_default(command) -> None:
    for o in COMMANDS[command]:
        assert o.home, f"{o.name} is declared apart from the dataclass that holds it"
        f = _field(o.home)
        spec = f.metadata.get(_META)
        if command == "run" and spec is not None and spec.run is not _SAME:
            assert o.default == spec.run, o.name
        else:
            assert o.default == field_default(f), (o.name, o.home)
        if spec is not None:       # declared with option(): one name everywhere
            assert o.name == (spec.name or f.name) and o.help == spec.help and o.type is spec.type


def test_every_setting_is_declared_on_its_field() -> None:
    """No Option written by hand: the stack and pause policies declare theirs."""
    for command in COMMANDS:
        for o in COMMANDS[command]:
            assert _META in _field(o.home).metadata, (command, o.name, o.home)


def test_daemon_settings_used_elsewhere_take_their_defaults_from_it() -> None:
    from ncclwatch.daemon.budget import BudgetConfig
    from ncclwatch.daemon.detect import DetectConfig
    from ncclwatch.daemon.settings import DaemonConfig

    d, detect = DaemonConfig(), DetectConfig()
    assert (detect.stall_threshold, detect.hang_threshold, detect.hang_floor) == (
        d.stall_threshold, d.hang_threshold, d.hang_floor)
    assert BudgetConfig().default_timeout == d.watchdog_timeout


def _actions(command: str) -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {a.option_strings[-1]: a for a in sub.choices[command]._actions if a.option_strings}


def test_agent_and_run_take_the_same_agent_settings() -> None:
    from ncclwatch.agent.settings import ClientTLSFiles

    agent, run = _actions("agent"), _actions("run")
    # The connection to the daemon is the agent's own: run makes it itself.
    connection = {"--collector"} | {"--" + f.name.replace("_", "-")
                                    for f in dataclasses.fields(ClientTLSFiles)}
    shared = set(agent) - connection - {"--help", "--config"}
    assert shared <= set(run), f"agent settings run lacks: {sorted(shared - set(run))}"
    for flag in shared:
        a, r = agent[flag], run[flag]
        assert (a.type, a.help, a.metavar) == (r.type, r.help, r.metavar), flag
    assert {"--cpu-budget", "--pause-budget", "--native-stack-ceiling", "--pods-log-dir",
            "--interval"} <= shared


def test_native_stack_ceiling_help_says_the_factor_the_code_uses() -> None:
    from ncclwatch.agent.pausing import PausePolicy

    p = PausePolicy()
    text = next(o.help for o in AGENT_OPTIONS if o.name == "native_stack_ceiling")
    assert p.rule.describe() in text
    assert f"{p.rule.factor:g}x the rank's longest normal still period + {p.rule.slack:g} s" in text


def test_no_code_repeats_a_default_where_it_reads_a_setting() -> None:
    """cfg.get("cpu_budget", 0.25) wrote a default a second time; a resolved
    config holds every setting, so reading one takes no default."""
    found = []
    for path in sorted((ROOT / "ncclwatch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("cfg", "file", "config", "settings")
                    and len(node.args) + len(node.keywords) > 1):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_unknown_keys_and_tables_name_the_file(tmp_path) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text("watchdog_timeout = 900\n[job_timeout]\n'slurm:*' = 1200\n")
    args = build_parser().parse_args(["daemon"])
    with pytest.raises(ConfigError,
                       match=r"unknown table\(s\) \[job_timeout\].*\[job_timeouts\]") as e:
        resolve(DAEMON_OPTIONS, args, load_file(str(path), None), env={})
    assert str(path) in str(e.value)
    path.write_text("watchdog_timout = 900\n")
    with pytest.raises(ConfigError, match="unknown config key.*watchdog_timout") as e:
        resolve(DAEMON_OPTIONS, args, load_file(str(path), None), env={})
    assert str(path) in str(e.value)
    path.write_text("job_timeouts = 900\n")
    with pytest.raises(ConfigError, match="job_timeouts must be a table"):
        resolve(DAEMON_OPTIONS, args, load_file(str(path), None), env={})
    path.write_text("[job_timeouts]\n'slurm:*' = 1200\n")
    assert resolve(DAEMON_OPTIONS, args, load_file(str(path), None), env={})[
        "job_timeouts"] == {"slurm:*": 1200}


@pytest.mark.parametrize("command,text,named", [
    ("daemon", "[job_timeout]\n'slurm:*' = 1200\n", "[job_timeout]"),
    ("agent", "[job_timeouts]\n'slurm:*' = 1200\n", "[job_timeouts]"),
    ("agent", "[tls]\nca = '/etc/ncclwatch/ca.pem'\n", "[tls]"),
    ("daemon", "stall_treshold = 5\n", "stall_treshold"),
])
def test_the_cli_exits_2_on_an_unknown_table_or_key(command, text, named, tmp_path) -> None:
    path = tmp_path / f"{command}.toml"
    path.write_text(text)
    p = subprocess.run([sys.executable, "-m", "ncclwatch", command, "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert named in p.stderr and str(path) in p.stderr, p.stderr
