"""Settings precedence: flag > environment > config file > default."""

import pytest

from ncclwatch.cli import DAEMON_OPTIONS, _job_timeouts, build_parser, main
from ncclwatch.config import ConfigError, load_file, resolve


def _cfg(argv, env=None, file_text=None, tmp_path=None):
    args = build_parser().parse_args(["daemon", *argv])
    file = {}
    if file_text is not None:
        p = tmp_path / "daemon.toml"
        p.write_text(file_text)
        file = load_file(str(p), None)
    return resolve(DAEMON_OPTIONS, args, file, env or {})


def test_precedence(tmp_path) -> None:
    text = 'watchdog_timeout = 300\nstall_threshold = 7\nstaleness = 9\n'
    env = {"NCCLWATCH_STALL_THRESHOLD": "8", "NCCLWATCH_STALENESS": "11"}
    cfg = _cfg(["--staleness", "12"], env, text, tmp_path)
    assert cfg["staleness"] == 12          # flag beats env and file
    assert cfg["stall_threshold"] == 8     # env beats file
    assert cfg["watchdog_timeout"] == 300  # file beats default
    assert cfg["grpc"] == "0.0.0.0:7470"   # default


def test_bad_values_say_where_they_came_from(tmp_path) -> None:
    with pytest.raises(ConfigError, match="NCCLWATCH_WATCHDOG_TIMEOUT"):
        _cfg([], {"NCCLWATCH_WATCHDOG_TIMEOUT": "-1"})
    with pytest.raises(ConfigError, match="unknown config key"):
        _cfg([], None, "watchdog = 1\n", tmp_path)
    with pytest.raises(ConfigError, match="not valid TOML"):
        _cfg([], None, "watchdog_timeout = \n", tmp_path)


def test_job_timeouts_from_file_and_flags() -> None:
    assert _job_timeouts({"slurm:*": 1800}, ["torchelastic:*=900"]) == {
        "slurm:*": 1800.0, "torchelastic:*": 900.0}
    with pytest.raises(ConfigError):
        _job_timeouts({}, ["nonsense"])


def test_cli_reports_config_errors_with_exit_2(tmp_path, capsys) -> None:
    bad = tmp_path / "x.toml"
    bad.write_text("grpc = 'no-port'\n")
    assert main(["daemon", "--config", str(bad)]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["run", "daemon", "agent", "status", "certs", "dump"])
def test_every_subcommand_has_help(cmd, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage: ncclwatch " + cmd in capsys.readouterr().out


def test_status_without_a_daemon_is_a_clear_error(capsys) -> None:
    from tests.harness.procs import free_port

    assert main(["status", "--daemon", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot reach the ncclwatch daemon" in capsys.readouterr().err


def test_rank_ranges_for_the_agent_filter() -> None:
    from ncclwatch.config import parse_ranks

    assert parse_ranks("") is None
    assert parse_ranks("0-3,7") == frozenset({0, 1, 2, 3, 7})
    assert parse_ranks(" 5 ") == frozenset({5})
    for bad in ("3-1", "a", "1-", "-2", "1,,2"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_ranks_flag_survives_the_real_parser_and_resolve() -> None:
    """argparse already applies the option type; resolve() must accept its result."""
    from ncclwatch.cli import AGENT_OPTIONS, build_parser
    from ncclwatch.config import resolve

    args = build_parser().parse_args(["agent", "--ranks", "0-1,4"])
    assert resolve(AGENT_OPTIONS, args, {}, env={})["ranks"] == frozenset({0, 1, 4})
    args = build_parser().parse_args(["agent"])
    assert resolve(AGENT_OPTIONS, args, {"ranks": "2-3"}, env={})["ranks"] == frozenset({2, 3})
