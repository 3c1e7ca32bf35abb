"""deploy.imageroot reads the Containerfile itself: what it cannot build stops
the build with the line that says so, and ``COPY . .`` leaves out what
.dockerignore names, as an engine does. A RUN step is kept off the build host:
it runs here in a root of a few host binaries, as root, and must not write
what it is lent, see the host's processes or devices, keep a capability an
engine would not give it, or outlive itself; nothing the build does follows a
symlink out of the image. (tests/e2e/test_image.py builds the real image.)"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from deploy import imageroot, runstep
from tests.harness.paths import ROOT


def test_the_shipped_containerfile_parses_into_its_stages() -> None:
    stages = imageroot.stages((ROOT / "Containerfile").read_text())
    assert [s.name for s in stages][:2] == ["base", "build"]
    assert imageroot.DEBIAN_SLIM.match(stages[0].base)
    final = stages[-1]
    assert [i.op for i in final.steps if i.op in ("USER", "ENTRYPOINT", "CMD")] == [
        "USER", "ENTRYPOINT", "CMD"]
    copy = next(i for i in final.steps if i.op == "COPY")
    assert copy.args.startswith("--from=build ")


@pytest.mark.parametrize("line", [
    "ADD https://example.com/x /x",          # a download the build cannot pin
    "HEALTHCHECK CMD true",
    "ONBUILD RUN true",
    "SHELL [\"/bin/bash\", \"-c\"]",
])
def test_an_instruction_it_does_not_know_stops_the_build(line: str) -> None:
    text = f"FROM docker.io/library/debian:bookworm-slim\nRUN true\n{line}\n"
    with pytest.raises(imageroot.BuildError, match=r"Containerfile:3: .* not an instruction"):
        imageroot.stages(text)


def test_continuations_and_comments_inside_them_are_joined() -> None:
    text = ("# top\nARG S=bookworm\nFROM debian:${S}-slim AS base\n"
            "RUN a \\\n# a comment between\n && b\n")
    [stage] = imageroot.stages(text)
    assert stage.base == "debian:bookworm-slim" and stage.name == "base"
    [run] = stage.steps
    assert run.op == "RUN" and run.args.split() == ["a", "&&", "b"] and run.line == 4


def test_bases_it_cannot_make_are_refused_by_name(tmp_path: Path) -> None:
    b = imageroot.Builder(tmp_path, tmp_path / "w")
    with pytest.raises(imageroot.BuildError, match="python:3.12-slim.*only debian"):
        b._base("docker.io/library/python:3.12-slim", tmp_path / "r")
    with pytest.raises(imageroot.BuildError, match="FROM IMAGE"):
        imageroot.stages("FROM a b\n")
    with pytest.raises(imageroot.BuildError, match="before FROM"):
        imageroot.stages("RUN true\n")


@pytest.mark.parametrize(("rel", "skip"), [
    (".git", True), (".git/config", True), (".venv/bin/python", True),
    ("ncclwatch/__pycache__/x.pyc", True), ("ncclwatch.egg-info/PKG-INFO", True),
    ("artifacts/e2e.log", True), ("ncclwatch/agent/agent.py", False),
    ("docs/build.md", False),            # "build" is the top folder only
    ("requirements/runtime.lock", False),
])
def test_dockerignore_rules(rel: str, skip: bool) -> None:
    assert imageroot.ignored(rel, imageroot.ignore_patterns(ROOT)) is skip


def test_copy_leaves_out_ignored_paths_and_stays_in_the_context(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "pkg" / "__pycache__").mkdir(parents=True)
    (ctx / "pkg" / "a.py").write_text("x")
    (ctx / "pkg" / "__pycache__" / "a.pyc").write_text("x")
    (ctx / ".git").mkdir()
    (ctx / ".git" / "HEAD").write_text("x")
    (ctx / ".dockerignore").write_text(".git\n**/__pycache__\n")
    root = tmp_path / "root"
    root.mkdir()
    b = imageroot.Builder(ctx, tmp_path / "w")
    b._copy(". .", root, "/src", "Containerfile:1")
    got = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert got == ["src/.dockerignore", "src/pkg/a.py"]
    with pytest.raises(imageroot.BuildError, match="outside the build context"):
        b._copy("../ctx2 /x", root, "/", "Containerfile:2")
    with pytest.raises(imageroot.BuildError, match="no such earlier stage"):
        b._copy("--from=nope /dist/ /dist/", root, "/", "Containerfile:3")


def test_the_build_trusts_what_the_host_trusts(monkeypatch, tmp_path: Path) -> None:
    """RUN steps download through whatever this host's pip would (a site's
    intercepting proxy included): a bundle named by a variable, else the system's."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    system = imageroot.HOST_BUNDLE if Path(imageroot.HOST_BUNDLE).is_file() else ""
    assert imageroot.host_ca() == system
    mine = tmp_path / "ca.pem"
    mine.write_text("x")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(mine))
    assert imageroot.host_ca() == str(mine)
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.pem"))   # not a file: skipped
    assert imageroot.host_ca() == str(mine)


# --- RUN steps, in a root of a few host binaries and their libraries --------

TOOLS = ("sh", "env", "ls", "cat", "grep", "mount", "sleep", "id")


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("RUN steps need root (namespaces, mounts, chroot), as the build does")
    root = tmp_path / "root"
    for d in ("usr/bin", "dev", "proc", "run", "etc"):
        (root / d).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")            # merged /usr, as Debian's
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)
    for tool in TOOLS:
        exe = shutil.which(tool)
        assert exe, tool
        shutil.copy2(exe, root / "usr" / "bin" / tool)
        ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=30)
        for line in ldd.stdout.splitlines():
            lib = next((w for w in line.split() if w.startswith("/")), None)
            if lib:
                (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(lib, root / lib.lstrip("/"))
    return root


def _step(root: Path, command: str, ca: Path | None = None, user: str = "") -> None:
    b = imageroot.Builder(root.parent, root.parent / "work", build_ca=str(ca) if ca else "")
    b._run(root, command, {"PATH": imageroot.DEFAULT_PATH}, user, "/", "Containerfile:9")


def _tried(what: str) -> str:
    """A shell line that says whether ``what`` worked, without failing the step."""
    return f"{{ {what}; }} 2>/dev/null && echo done || echo refused"


def test_what_a_run_step_is_lent_it_cannot_write(tiny_root: Path, tmp_path: Path,
                                                 monkeypatch) -> None:
    """The CA bundle and the host's resolver files are bound read-only; remounting
    them writable takes CAP_SYS_ADMIN, which a step does not hold."""
    ca = tmp_path / "host-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nhost\n")
    hosts = tmp_path / "host-hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    monkeypatch.setattr(runstep, "HOST_FILES", (str(hosts),))
    remount = "mount -o remount,bind,rw /run/build-ca.pem && echo evil >> /run/build-ca.pem"
    _step(tiny_root, " && ".join([
        f"({_tried('echo evil >> /run/build-ca.pem')}) > /out",
        f"({_tried('echo evil >> ' + shlex.quote(str(hosts)))}) >> /out",
        f"({_tried(remount)}) >> /out",
        "cat /run/build-ca.pem >> /out"]), ca)
    assert (tiny_root / "out").read_text().splitlines() == [
        "refused", "refused", "refused", "-----BEGIN CERTIFICATE-----", "host"]
    assert ca.read_text() == "-----BEGIN CERTIFICATE-----\nhost\n"
    assert hosts.read_text() == "127.0.0.1 localhost\n"
    # A step that appends stops the build; the host's bundle is untouched.
    with pytest.raises(imageroot.BuildError, match="Containerfile:9: RUN exited"):
        _step(tiny_root, "echo evil >> /run/build-ca.pem", ca)
    assert ca.read_text() == "-----BEGIN CERTIFICATE-----\nhost\n"
    assert not (tiny_root / "run" / "build-ca.pem").exists()   # nothing left in the image


def test_a_run_step_sees_only_its_own_processes_and_none_outlives_it(tiny_root: Path) -> None:
    mark = f"{4000 + os.getpid() % 1000}.5"
    _step(tiny_root, f"sleep {mark} & ls /proc > /procs && cat /proc/1/cmdline > /init")
    pids = [p for p in (tiny_root / "procs").read_text().split() if p.isdigit()]
    # Its shell is PID 1; beside it only the sleep and the ls.
    assert "1" in pids and len(pids) <= 3, pids
    assert (tiny_root / "init").read_text().split("\0")[:2] == ["/bin/sh", "-ec"]
    time.sleep(0.5)
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()
            and mark.encode() in _cmdline(p)]
    assert not left, f"a RUN step's background process outlived it: {left}"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_run_step_gets_a_minimal_dev(tiny_root: Path) -> None:
    _step(tiny_root, "ls -A /dev > /devs && ls -A /dev/pts > /pts && echo x > /dev/null "
                     "&& cat /dev/null > /null")
    got = set((tiny_root / "devs").read_text().split())
    assert got == {"null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "ptmx",
                   "fd", "stdin", "stdout", "stderr"}, got
    # A pts of its own: no terminal of the host's in it.
    assert (tiny_root / "pts").read_text().split() == ["ptmx"]
    assert (tiny_root / "null").read_text() == ""


def test_a_run_step_holds_an_engines_capabilities_and_a_read_only_proc_sys(
        tiny_root: Path) -> None:
    _step(tiny_root, " && ".join([
        "grep -E '^Cap(Bnd|Eff|Prm|Inh|Amb):' /proc/self/status > /caps",
        # Its own hostname's value written back: refused, /proc/sys is read-only.
        f"({_tried('cat /proc/sys/kernel/hostname > /proc/sys/kernel/hostname')}) > /sys-write",
    ]))
    caps = dict(line.split(":") for line in (tiny_root / "caps").read_text().splitlines())
    # Docker's default set less MKNOD, NET_RAW and SYS_CHROOT: CHOWN DAC_OVERRIDE
    # FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE AUDIT_WRITE SETFCAP.
    want = sum(1 << n for n in (0, 1, 3, 4, 5, 6, 7, 8, 10, 29, 31))
    assert int(caps["CapBnd"], 16) == int(caps["CapEff"], 16) == want, caps
    assert int(caps["CapInh"], 16) == int(caps["CapAmb"], 16) == 0, caps
    for name, bit in (("SYS_ADMIN", 21), ("SYS_CHROOT", 18), ("MKNOD", 27), ("SYS_PTRACE", 19),
                      ("SYS_MODULE", 16), ("NET_ADMIN", 12)):
        assert not int(caps["CapBnd"], 16) >> bit & 1, name
    assert (tiny_root / "sys-write").read_text().strip() == "refused"


def test_a_run_step_under_user_is_that_user_with_no_capability(tiny_root: Path) -> None:
    (tiny_root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n"
                                            "app:x:1234:1234::/home/app:/bin/sh\n")
    (tiny_root / "etc" / "group").write_text("root:x:0:\napp:x:1234:\nvideo:x:44:app\n")
    assert runstep.user_ids(tiny_root, "app") == (1234, 1234, [44, 1234])
    assert runstep.user_ids(tiny_root, "65532:65532") == (65532, 65532, [65532])
    assert runstep.user_ids(tiny_root, "app:root") == (1234, 0, [0, 44])
    with pytest.raises(imageroot.BuildError, match="no user nobody"):
        runstep.user_ids(tiny_root, "nobody")
    _step(tiny_root, "id > /tmp/id && grep '^CapEff:' /proc/self/status >> /tmp/id", user="app")
    out = (tiny_root / "tmp" / "id").read_text()
    assert "uid=1234" in out and "gid=1234" in out and "44" in out, out
    assert "CapEff:\t0000000000000000" in out, out


def test_the_build_follows_no_symlink_out_of_the_image(tiny_root: Path, tmp_path: Path) -> None:
    """A link an earlier step left (``/run -> /host/dir``) is not written, mounted
    or deleted through: the build stops and the host's file stays."""
    outside = tmp_path / "host-dir"
    outside.mkdir()
    (outside / "build-ca.pem").write_text("keep")
    ca = tmp_path / "ca.pem"
    ca.write_text("ca")
    shutil.rmtree(tiny_root / "run")
    (tiny_root / "run").symlink_to(outside)
    with pytest.raises(imageroot.BuildError, match="/run/build-ca.pem: a symlink in the image "
                                                   "leads out of it"):
        _step(tiny_root, "true", ca)
    assert (outside / "build-ca.pem").read_text() == "keep"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a.txt").write_text("from the context")
    (tiny_root / "src").symlink_to(outside)
    b = imageroot.Builder(ctx, tmp_path / "w")
    with pytest.raises(imageroot.BuildError, match="leads out of it"):
        b._copy(". /src/", tiny_root, "/", "Containerfile:4")
    with pytest.raises(imageroot.BuildError, match="leads out of it"):
        b._copy("a.txt /src/a.txt", tiny_root, "/", "Containerfile:5")
    (tiny_root / "app").mkdir()
    (tiny_root / "app" / "pkg").symlink_to(outside)
    (ctx / "pkg").mkdir()
    (ctx / "pkg" / "m.py").write_text("x")
    with pytest.raises(imageroot.BuildError, match="leads out of it"):
        b._copy(". /app/", tiny_root, "/", "Containerfile:6")
    assert sorted(p.name for p in outside.iterdir()) == ["build-ca.pem"]
    # Links that stay inside (Debian's /bin -> usr/bin) are followed as before.
    (tiny_root / "usr" / "lib").mkdir(parents=True)
    (tiny_root / "lib2").symlink_to("usr/lib")
    b._copy("a.txt /lib2/", tiny_root, "/", "Containerfile:7")
    assert (tiny_root / "usr" / "lib" / "a.txt").read_text() == "from the context"


def test_the_build_stage_lets_pip_fetch_no_backend_of_its_choosing() -> None:
    """pip builds the wheel with the backend requirements/build.lock pins and
    hashes (no build isolation, which would fetch setuptools unpinned), and
    installs nothing but hashed binary wheels or the local wheel itself, so no
    sdist is built with a backend fetched on the way."""
    runs = [i.args for s in imageroot.stages((ROOT / "Containerfile").read_text())
            for i in s.steps if i.op == "RUN"]
    pips = [shlex.split(cmd) for run in runs for cmd in run.split("&&")
            if "pip" in cmd and (" install " in cmd or " wheel " in cmd)]
    assert any("wheel" in p for p in pips) and any("requirements/build.lock" in p for p in pips)
    for words in pips:
        if "wheel" in words:
            assert {"--no-build-isolation", "--no-deps"} <= set(words), words
        elif all(w.endswith(".whl") for w in words[words.index("install") + 1:]
                 if not w.startswith("-")):
            assert "--no-deps" in words, words
        else:
            assert "--require-hashes" in words and "-r" in words, words
            assert "--only-binary" in words, words
            assert words[words.index("--only-binary") + 1] == ":all:", words
    order = [" ".join(p) for p in pips]
    assert next(i for i, p in enumerate(order) if "build.lock" in p) < next(
        i for i, p in enumerate(order) if " wheel " in p), order
