"""Build the image's root filesystem from the Containerfile without a container engine.

CI has no engine and cannot pull base images, and Apptainer/enroot sites often
want a directory, not an OCI archive. This reads the Containerfile itself, so
the two cannot drift: ``FROM debian:<suite>-slim`` becomes an ``mmdebstrap``
of that suite from Debian's packages with slim's exclusions, ``FROM <stage>``
a copy of an earlier stage, ``RUN`` a ``chroot`` under the stage's ``USER``,
``WORKDIR`` and ``ENV``, ``COPY`` a copy honouring ``.dockerignore``. An
instruction it does not know stops the build (exit 2), never skipped.

A RUN step runs as root in the image but is kept off the build host as an
engine keeps it (``deploy/runstep.py``); nothing the build writes, mounts or
deletes follows a symlink a step left in the image out of it.

The output is ``OUT/rootfs`` and ``OUT/config.json``, the OCI image config's
runtime part (Env, Entrypoint, Cmd, User, WorkingDir, ExposedPorts), which is
what a runtime reads to start a container from it.

    python -m deploy.imageroot --out /var/tmp/ncclwatch-image     (root; mmdebstrap)

Behind a TLS-intercepting proxy, ``--build-ca FILE`` (default: the PIP_CERT,
REQUESTS_CA_BUNDLE or SSL_CERT_FILE this process has, else the host's system
bundle; ``--build-ca ''`` for none) is visible to RUN steps only, at
``/run/build-ca.pem`` with PIP_CERT pointing at it, as a build secret would be;
nothing of it stays in the image.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from deploy.runstep import BuildError, inside, run_step

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = ROOT / "Containerfile"
#: What a RUN step starts with, as Docker and Podman give it.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: docker.io/library/debian:<suite>-slim: Debian's minbase with these left out
#: (the slim variant's dpkg filters).
DEBIAN_SLIM = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+)-slim$")
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*", "/usr/share/groff/*", "/usr/share/linda/*",
                 "/usr/share/lintian/*")
SLIM_KEEP = ("/usr/share/doc/*/copyright",)
BUILD_CA = "/run/build-ca.pem"
#: Instructions read; any other stops the build.
KNOWN = ("ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD")


@dataclass
class Instruction:
    op: str
    args: str
    line: int


@dataclass
class Stage:
    name: str
    base: str
    steps: list[Instruction] = field(default_factory=list)


def instructions(text: str) -> list[Instruction]:
    """The Containerfile's instructions, continuation lines joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        if op.upper() not in KNOWN:
            raise BuildError(f"Containerfile:{start}: {op} is not an instruction this build "
                             f"knows ({', '.join(KNOWN)}); teach deploy/imageroot.py first")
        out.append(Instruction(op.upper(), args.strip(), start))
        buf = ""
    if buf:
        raise BuildError("Containerfile: a continuation line ends the file")
    return out


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def stages(text: str) -> list[Stage]:
    """Stages in order; ARGs before the first FROM are expanded in FROM lines."""
    global_args: dict[str, str] = {}
    out: list[Stage] = []
    for ins in instructions(text):
        if ins.op == "ARG" and not out:
            key, _, value = ins.args.partition("=")
            global_args[key] = value
        elif ins.op == "FROM":
            words = _expand(ins.args, global_args).split()
            if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
                raise BuildError(f"Containerfile:{ins.line}: FROM IMAGE [AS NAME]")
            out.append(Stage(words[2] if len(words) == 3 else str(len(out)), words[0]))
        elif not out:
            raise BuildError(f"Containerfile:{ins.line}: {ins.op} before FROM")
        else:
            out[-1].steps.append(ins)
    if not out:
        raise BuildError("Containerfile: no FROM")
    return out


def ignore_patterns(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.exists():
        return []
    return [p.strip().rstrip("/") for p in path.read_text().splitlines()
            if p.strip() and not p.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rules, as far as this repository uses them: a pattern matches the
    path or a folder above it; a leading ``**/`` matches at any depth."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        if pat.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pat[3:]) for p in parts):
                return True
        elif any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            return True
    return False


@dataclass
class Builder:
    context: Path
    work: Path
    build_ca: str = ""
    log: object = sys.stderr
    roots: dict[str, Path] = field(default_factory=dict)

    def say(self, text: str) -> None:
        print(f"imageroot: {text}", file=self.log, flush=True)

    def build(self, containerfile: Path) -> tuple[Path, dict]:
        """The last stage's root and its config."""
        config: dict = {}
        for stage in stages(containerfile.read_text()):
            root = self.work / f"stage-{stage.name}"
            self._base(stage.base, root)
            config = self._run_steps(stage, root)
            self.roots[stage.name] = root
        return root, config

    def _base(self, image: str, root: Path) -> None:
        if root.exists():
            shutil.rmtree(root)
        if image in self.roots:
            self.say(f"FROM {image}: a copy of that stage")
            subprocess.run(["cp", "-a", "--reflink=auto", str(self.roots[image]), str(root)],
                           check=True)
            return
        m = DEBIAN_SLIM.match(image)
        if not m:
            raise BuildError(f"FROM {image}: only debian:<suite>-slim (built with mmdebstrap) "
                             "or an earlier stage can be built without a container engine")
        if not shutil.which("mmdebstrap"):
            raise BuildError("mmdebstrap is not installed (Debian package mmdebstrap)")
        self.say(f"FROM {image}: mmdebstrap --variant=minbase {m['suite']}")
        argv = ["mmdebstrap", "--variant=minbase", "--quiet"]
        argv += [f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES]
        argv += [f"--dpkgopt=path-include={p}" for p in SLIM_KEEP]
        subprocess.run([*argv, m["suite"], str(root)], check=True)

    def _run_steps(self, stage: Stage, root: Path) -> dict:
        env: dict[str, str] = {"PATH": DEFAULT_PATH}
        args: dict[str, str] = {}
        config: dict = {"Env": [], "Entrypoint": None, "Cmd": None, "User": "",
                        "WorkingDir": "/", "ExposedPorts": {}}
        for ins in stage.steps:
            text = _expand(ins.args, {**args, **env})
            where = f"Containerfile:{ins.line}"
            if ins.op == "ARG":
                key, _, value = ins.args.partition("=")
                args[key] = value
            elif ins.op == "WORKDIR":
                config["WorkingDir"] = text
                inside(root, text).mkdir(parents=True, exist_ok=True)
            elif ins.op == "ENV":
                for word in shlex.split(text):
                    key, sep, value = word.partition("=")
                    if not sep:
                        raise BuildError(f"{where}: ENV KEY=VALUE ...")
                    env[key] = value
            elif ins.op == "USER":
                config["User"] = text
            elif ins.op == "EXPOSE":
                config["ExposedPorts"].update({f"{p}/tcp" if "/" not in p else p: {}
                                               for p in text.split()})
            elif ins.op in ("ENTRYPOINT", "CMD"):
                value = json.loads(text)
                if not isinstance(value, list):
                    raise BuildError(f"{where}: {ins.op} in exec form only (a JSON list)")
                config["Entrypoint" if ins.op == "ENTRYPOINT" else "Cmd"] = value
            elif ins.op == "COPY":
                self._copy(text, root, config["WorkingDir"], where)
            elif ins.op == "RUN":
                self.say(f"RUN {text[:100]}")
                self._run(root, text, env, config["User"], config["WorkingDir"], where)
        config["Env"] = [f"{k}={v}" for k, v in env.items()]
        return config

    def _copy(self, text: str, root: Path, workdir: str, where: str) -> None:
        words = text.split()
        source_root, patterns = self.context, ignore_patterns(self.context)
        if words and words[0].startswith("--from="):
            stage = words.pop(0).split("=", 1)[1]
            if stage not in self.roots:
                raise BuildError(f"{where}: COPY --from={stage}: no such earlier stage")
            source_root, patterns = self.roots[stage], []
        if len(words) < 2 or any(w.startswith("--") for w in words):
            raise BuildError(f"{where}: COPY [--from=STAGE] SRC... DEST")
        *sources, dest = words
        target = inside(root, dest if dest.startswith("/") else f"{workdir}/{dest}")
        for src in sources:
            if any(c in src for c in "*?["):
                raise BuildError(f"{where}: COPY {src}: wildcards are not read here")
            path = (source_root / src.lstrip("/")).resolve() if src not in (".", "./") \
                else source_root
            if not path.is_relative_to(source_root.resolve()):
                raise BuildError(f"{where}: COPY {src}: outside the build context")
            if path.is_dir():
                self._copy_tree(root, path, target, patterns,
                                path.relative_to(source_root.resolve())
                                if path != source_root else Path(""))
            else:
                final = inside(root, target / path.name if dest.endswith("/") else target)
                final.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, final)

    def _copy_tree(self, root: Path, src: Path, dest: Path, patterns: list[str],
                   rel0: Path) -> None:
        for dirpath, dirnames, filenames in os.walk(src):
            rel_dir = Path(dirpath).relative_to(src)
            keep = []
            for d in dirnames:
                rel = (rel0 / rel_dir / d).as_posix()
                if not ignored(rel, patterns):
                    keep.append(d)
            dirnames[:] = keep
            folder = inside(root, dest / rel_dir)
            folder.mkdir(parents=True, exist_ok=True)
            for f in filenames:
                if not ignored((rel0 / rel_dir / f).as_posix(), patterns):
                    shutil.copy2(Path(dirpath) / f, inside(root, folder / f),
                                 follow_symlinks=False)

    def _run(self, root: Path, command: str, env: dict[str, str], user: str, workdir: str,
             where: str) -> None:
        """One RUN, kept off this host as an engine keeps it (deploy/runstep.py)."""
        run_env, lend = {"HOME": "/root", **env}, []
        if self.build_ca:
            run_env.setdefault("PIP_CERT", BUILD_CA)
            lend.append((self.build_ca, BUILD_CA))
        code = run_step(root, command, run_env, user, workdir, lend)
        if code:
            raise BuildError(f"{where}: RUN exited {code}")


#: The host's own trust store (Debian's update-ca-certificates output, a site's
#: proxy CA included), when no variable names one.
HOST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def host_ca() -> str:
    """What this host trusts for downloads: a CA bundle its pip or requests are
    told of, else its system bundle."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(name) and Path(os.environ[name]).is_file():
            return os.environ[name]
    return HOST_BUNDLE if Path(HOST_BUNDLE).is_file() else ""


def build(out: Path, context: Path = ROOT, containerfile: Path = CONTAINERFILE,
          build_ca: str | None = None, log=sys.stderr) -> tuple[Path, dict]:
    """Build into ``out``: ``out/rootfs`` and ``out/config.json``."""
    work = out / "stages"
    work.mkdir(parents=True, exist_ok=True)
    builder = Builder(context, work, host_ca() if build_ca is None else build_ca, log)
    last, config = builder.build(containerfile)
    rootfs = out / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    last.rename(rootfs)
    shutil.rmtree(work)
    (out / "config.json").write_text(json.dumps({"config": config}, indent=1) + "\n")
    return rootfs, config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.imageroot", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder for rootfs/ and config.json")
    p.add_argument("--containerfile", type=Path, default=CONTAINERFILE)
    p.add_argument("--build-ca", default=None, metavar="FILE",
                   help="CA bundle for RUN steps' downloads (default: PIP_CERT, "
                        "REQUESTS_CA_BUNDLE or SSL_CERT_FILE if set, else "
                        f"{HOST_BUNDLE}; '' for none)")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("imageroot: needs root (mmdebstrap, chroot, mount)", file=sys.stderr)
        return 2
    try:
        rootfs, _ = build(a.out.resolve(), ROOT, a.containerfile, a.build_ca)
    except BuildError as e:
        print(f"imageroot: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"imageroot: {e}", file=sys.stderr)
        return 1
    print(rootfs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
