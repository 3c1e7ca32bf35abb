"""The wheel carries what a node needs besides code, and `ncclwatch install`
lays it out from an installed wheel (no source checkout): units, configs,
rules, dashboards, Kubernetes manifests, the Slurm TaskProlog, runbooks; the
units' Documentation= is a file the wheel installs, and the installed units
run the venv `install` ran from (or --prefix), as systemd-analyze verifies."""

from __future__ import annotations

import filecmp
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import ncclwatch
from ncclwatch import install
from tests.harness.paths import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

VENV_PREFIX = "/opt/ncclwatch"  # the venv the shipped units' ExecStart= runs from


def _run(*argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out


def _source_files(kind: str) -> list[Path]:
    return sorted({p for g in install.KINDS[kind].sources for p in ROOT.glob(g)})


def _unit_for(src: Path, prefix: Path) -> str:
    """A shipped unit as `install systemd` writes it for the venv ``prefix``:
    its settings' /opt/ncclwatch paths, not its comments."""
    return "".join(line if line.startswith("#") else line.replace(VENV_PREFIX, str(prefix))
                   for line in src.read_text().splitlines(True))


def test_pyproject_ships_what_install_copies() -> None:
    """pyproject's data-files and install.KINDS name the same files, to the same share folders."""
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"]
    for name, kind in install.KINDS.items():
        assert sorted(data_files[f"share/{kind.share}"]) == sorted(kind.sources), name
        assert _source_files(name), f"{name}: no files match {kind.sources}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """A wheel built from a copy of this checkout, installed into a fresh venv
    (dependencies from the test venv through PYTHONPATH, as in test_packaging)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "artifacts", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"), str(src))
    wheel = next((tmp / "dist").glob("ncclwatch-*.whl"))
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "-q", str(wheel))
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    return wheel, env, venv


def test_wheel_holds_every_kind_and_the_docs(installed) -> None:
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"ncclwatch-{ncclwatch.__version__}.data/data/share/"
    for name, kind in install.KINDS.items():
        for path in _source_files(name):
            assert f"{data}{kind.share}/{path.name}" in names, (name, path.name)
    assert f"{data}doc/ncclwatch/README.md" in names


def test_units_documentation_is_installed_by_the_wheel(installed) -> None:
    _, _, venv = installed
    for unit in _source_files("systemd"):
        (doc,) = re.findall(r"^Documentation=(.*)$", unit.read_text(), re.M)
        for uri in doc.split():
            assert uri.startswith(f"file://{VENV_PREFIX}/"), uri
            local = venv / uri.removeprefix(f"file://{VENV_PREFIX}/")
            assert local.is_file(), f"{unit.name}: {uri} is not installed by the wheel"


def test_install_lays_out_every_kind_from_the_installed_wheel(installed, tmp_path: Path) -> None:
    _, env, venv = installed
    exe = str(venv / "bin" / "ncclwatch")
    where = _run(str(venv / "bin" / "python"), "-c",
                 "from ncclwatch import install; print(install.sources('systemd')[0])",
                 env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv / "share" / "ncclwatch")), where  # not this checkout
    root = tmp_path / "root"
    out = _run(exe, "install", "all", "--root", str(root), env=env, cwd=tmp_path).stdout
    # `all` is what every node takes: the Slurm prolog only where asked for.
    assert not (root / "etc/slurm").exists(), out
    out += _run(exe, "install", "slurm", "--root", str(root), env=env, cwd=tmp_path).stdout
    for name, kind in install.KINDS.items():
        dest = Path(kind.dest)
        dest = root / (dest.relative_to("/") if dest.is_absolute() else dest)
        want = _source_files(name)
        assert (sorted(p.name for p in dest.iterdir())
                == sorted(kind.name(p.name) for p in want)), name
        for src in want:
            if name == "systemd":   # written for this venv: tests below
                assert (dest / src.name).read_text() == _unit_for(src, venv), src.name
            else:
                assert filecmp.cmp(src, dest / kind.name(src.name), shallow=False), \
                    (name, src.name)
            assert (dest / kind.name(src.name)).stat().st_mode & 0o777 == kind.mode
    assert (root / "etc/systemd/system/ncclwatch-agent.service").exists()
    assert f"units run {venv}/bin/ncclwatch (the venv this command runs from" in out
    assert (root / "etc/slurm/ncclwatch-task-prolog.sh").stat().st_mode & 0o777 == 0o755
    assert "next: systemctl daemon-reload" in out
    # Configs are edited in place: a second run keeps them, --force replaces them.
    agent = root / "etc/ncclwatch/agent.toml"
    agent.write_text('collector = "mine:7470"\n')
    again = _run(exe, "install", "config", "--root", str(root), env=env, cwd=tmp_path).stdout
    assert f"kept {agent}" in again and agent.read_text() == 'collector = "mine:7470"\n'
    _run(exe, "install", "config", "--root", str(root), "--force", env=env, cwd=tmp_path)
    assert filecmp.cmp(agent, ROOT / "systemd/examples/agent.toml", shallow=False)
    # --dest for one kind; --list copies nothing.
    _run(exe, "install", "rules", "--dest", str(tmp_path / "rules"), env=env, cwd=tmp_path)
    assert (tmp_path / "rules" / "alerts.yaml").exists()
    listed = _run(exe, "install", "kubernetes", "--list", "--dest", str(tmp_path / "k"),
                  env=env, cwd=tmp_path).stdout
    assert "kustomization.yaml" in listed and not (tmp_path / "k").exists()


def _verify(unit: Path) -> None:
    """systemd-analyze verify, as tests/repo/test_systemd.py runs it on the shipped units."""
    from tests.harness.tools import systemd_analyze

    r = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    foreign = re.compile(r"^/(etc|run|usr/lib|lib)/systemd/\S+:")
    ours = [x for x in (r.stdout + r.stderr).splitlines() if x.strip() and not foreign.match(x)]
    assert r.returncode == 0 and not ours, f"systemd-analyze verify {unit}:\n" + "\n".join(ours)


def _installed_units(root: Path) -> dict[str, tuple[list[str], list[str]]]:
    """unit name -> (ExecStart= argv, Documentation= URIs) of the units under ``root``."""
    out = {}
    for unit in sorted((root / "etc/systemd/system").glob("*.service")):
        text = unit.read_text()
        [exec_start] = re.findall(r"^ExecStart=(.*)$", text, re.M)
        [docs] = re.findall(r"^Documentation=(.*)$", text, re.M)
        out[unit.name] = (shlex.split(exec_start), docs.split())
    assert sorted(out) == sorted(p.name for p in _source_files("systemd")), out
    return out


def test_installed_units_run_the_venv_install_ran_from(installed, tmp_path: Path) -> None:
    """`install systemd` from a venv that is not /opt/ncclwatch: the units it
    writes run that venv's ncclwatch and link the docs that venv holds, it says
    so, and systemd-analyze verifies each installed unit as it is."""
    _, env, venv = installed
    root = tmp_path / "root"
    out = _run(str(venv / "bin" / "ncclwatch"), "install", "systemd", "--root", str(root),
               env=env, cwd=tmp_path).stdout
    assert out.startswith(f"units run {venv}/bin/ncclwatch (the venv this command runs from; "
                          "--prefix for another)\n"), out
    for name, (argv, docs) in _installed_units(root).items():
        assert argv[0] == str(venv / "bin" / "ncclwatch"), (name, argv)
        for uri in docs:
            assert uri.startswith(f"file://{venv}/share/doc/ncclwatch/"), (name, uri)
            assert Path(uri.removeprefix("file://")).is_file(), (name, uri)
        _verify(root / "etc/systemd/system" / name)


def test_install_prefix_writes_the_units_for_another_venv(installed, tmp_path: Path) -> None:
    """--prefix: the units run PREFIX/bin/ncclwatch and link PREFIX's docs (an
    image's venv under --root, or another venv on this host); a prefix without
    bin/ncclwatch, one that would not read back from ExecStart= as written, or
    --prefix without the systemd kind is refused, and nothing is written."""
    _, env, venv = installed
    exe = str(venv / "bin" / "ncclwatch")
    root = tmp_path / "root"
    prefix = root / "srv/ncclwatch-2"   # /srv/ncclwatch-2 in the image --root builds
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/ncclwatch").symlink_to(venv / "bin" / "ncclwatch")
    out = _run(exe, "install", "systemd", "--root", str(root), "--prefix", "/srv/ncclwatch-2/",
               env=env, cwd=tmp_path).stdout
    assert out.startswith("units run /srv/ncclwatch-2/bin/ncclwatch (--prefix)\n"), out
    for name, (argv, docs) in _installed_units(root).items():
        assert argv[0] == "/srv/ncclwatch-2/bin/ncclwatch", (name, argv)
        assert all(u.startswith("file:///srv/ncclwatch-2/share/doc/ncclwatch/") for u in docs)
    # verify resolves ExecStart= on this host: the same units for the host's path.
    host = tmp_path / "host"
    _run(exe, "install", "systemd", "--root", str(host), "--prefix", str(prefix), env=env,
         cwd=tmp_path)
    for name in _installed_units(host):
        _verify(host / "etc/systemd/system" / name)
    for argv, code, says in (
            (["--prefix", str(tmp_path / "none")], 1, "missing or not executable"),
            (["--prefix", str(tmp_path / "a b")], 2, "absolute path of letters"),
            (["--prefix", "opt/ncclwatch"], 2, "absolute path of letters"),
            (["--prefix", "/opt/%n"], 2, "absolute path of letters")):
        r = subprocess.run([exe, "install", "systemd", "--root", str(tmp_path / "no"), *argv],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert (r.returncode, says in r.stderr) == (code, True), (argv, r.stderr)
    r = subprocess.run([exe, "install", "rules", "--prefix", str(prefix), "--root",
                        str(tmp_path / "no")], capture_output=True, text=True, timeout=60,
                       env=env, cwd=tmp_path)
    assert r.returncode == 2 and "--prefix is for the systemd units" in r.stderr, r.stderr
    assert not (tmp_path / "no").exists()


def test_install_slurm_puts_the_task_prolog_where_slurm_conf_names_it(tmp_path: Path,
                                                                       capsys) -> None:
    """`ncclwatch install slurm`: /etc/slurm/ncclwatch-task-prolog.sh (the path the
    docs give TaskProlog=), executable, and a site's edits kept unless --force; the
    installed copy runs as slurmstepd runs it."""
    from ncclwatch.cli import main
    from tests.harness.slurm import run_prolog

    root = tmp_path / "root"
    assert main(["install", "slurm", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    prolog = root / "etc/slurm/ncclwatch-task-prolog.sh"
    assert f"installed {prolog}" in out and "TaskProlog=/etc/slurm/ncclwatch-task-prolog.sh" in out
    assert [p.name for p in prolog.parent.iterdir()] == [prolog.name]
    assert filecmp.cmp(prolog, ROOT / "deploy/slurm/task-prolog.sh", shallow=False)
    assert prolog.stat().st_mode & 0o777 == 0o755
    got = run_prolog({"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242",
                      "TMPDIR": str(tmp_path)}, prolog)
    assert got["TORCH_FR_BUFFER_SIZE"] == "2000", got
    # FR_BUFFER_SIZE is the site's to edit: a second run keeps it, --force replaces it.
    prolog.write_text(prolog.read_text().replace("FR_BUFFER_SIZE=2000", "FR_BUFFER_SIZE=5000"))
    assert main(["install", "slurm", "--root", str(root)]) == 0
    assert f"kept {prolog}" in capsys.readouterr().out and "=5000" in prolog.read_text()
    assert main(["install", "slurm", "--root", str(root), "--force"]) == 0
    assert filecmp.cmp(prolog, ROOT / "deploy/slurm/task-prolog.sh", shallow=False)
    assert main(["install", "slurm", "--dest", str(tmp_path / "d"), "--list"]) == 0
    assert f"-> {tmp_path / 'd' / 'ncclwatch-task-prolog.sh'}" in capsys.readouterr().out


def test_install_rejects_dest_for_several_kinds(capsys) -> None:
    from ncclwatch.cli import main

    assert main(["install", "rules", "dashboards", "--dest", "/nonexistent"]) == 2
    assert "--dest takes one KIND" in capsys.readouterr().err


def test_containerfile_installs_the_wheel_where_units_and_manifests_expect() -> None:
    """What the image does, read from its Containerfile as deploy.imageroot reads it
    (tests/e2e/test_image.py builds and runs it), checked against the units, the
    manifests and pyproject."""
    from deploy import imageroot

    text = (ROOT / "Containerfile").read_text()
    stages = imageroot.stages(text)
    # One base from outside, Debian's own; every other stage starts from an earlier one.
    [outside] = [s.base for s in stages if s.base not in {t.name for t in stages}]
    suite = imageroot.DEBIAN_SLIM.match(outside)["suite"]
    python = DEBIAN_PYTHON[suite]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert tuple(map(int, python.split("."))) >= tuple(map(int, requires[2:].split(".")))
    # Build-time downloads: Debian's packages through apt, PyPI's through pip; no curl/wget.
    runs = [i.args for s in stages for i in s.steps if i.op == "RUN"]
    for cmd in (c.strip() for r in runs for c in r.split("&&")):
        assert re.match(r"(apt-get update$|DEBIAN_FRONTEND=noninteractive apt-get install -y "
                        r"--no-install-recommends |python3 -m venv |/build/bin/pip wheel "
                        r"--no-cache-dir --no-deps |/build/bin/pip install --no-cache-dir -q "
                        r"--require-hashes |/opt/ncclwatch/bin/pip install |rm |cp )",
                        cmd), cmd
    # Dependencies only as the lock pins and hashes them; the wheel itself without any.
    pips = [c.strip() for r in runs for c in r.split("&&") if "/opt/ncclwatch/bin/pip" in c]
    assert [("--require-hashes" in c, "-r /dist/runtime.lock" in c, "--no-deps" in c)
            for c in pips] == [(True, True, False), (False, False, True)], pips
    # The venv is where the units' ExecStart= and Documentation= point.
    assert f"python3 -m venv {VENV_PREFIX}" in text and f"PATH={VENV_PREFIX}/bin:" in text
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    assert user and int(user.group(1)) != 0
    assert re.search(r'^ENTRYPOINT \["ncclwatch"\]$', text, re.M)
    ignored = imageroot.ignore_patterns(ROOT)
    assert ".venv" in ignored and ".git" in ignored


#: The python3 of each Debian suite the image may start from.
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}


def test_install_into_a_folder_it_cannot_write_is_a_clear_error(tmp_path: Path, capsys) -> None:
    from ncclwatch.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the destination folder would be
    assert main(["install", "dashboards", "--dest", str(blocker / "sub")]) == 1
    err = capsys.readouterr().err
    assert str(blocker / "sub") in err and "Traceback" not in err


def test_rules_link_the_runbooks_where_runbook_url_says(tmp_path: Path) -> None:
    """With no daemon seen in a week the alerts link the installed copy, or the
    --runbook-url given to `install rules`: absolute either way."""
    from ncclwatch.cli import main
    from tests.harness.alerting import RUNBOOK_FALLBACK

    assert install.RUNBOOK_FALLBACK == RUNBOOK_FALLBACK
    assert main(["install", "rules", "--dest", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "alerts.yaml").read_text().count(RUNBOOK_FALLBACK) >= 10
    assert main(["install", "rules", "--dest", str(tmp_path / "b"),
                 "--runbook-url", "https://wiki.example/ncclwatch/runbooks"]) == 0
    text = (tmp_path / "b" / "alerts.yaml").read_text()
    assert RUNBOOK_FALLBACK not in text
    assert "{{ else }}https://wiki.example/ncclwatch/runbooks/{{ end }}checkpoint_gather.md" in text
    assert main(["install", "rules", "--dest", str(tmp_path / "c"),
                 "--runbook-url", "wiki/runbooks"]) == 2
