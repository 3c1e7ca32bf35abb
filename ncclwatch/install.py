"""`ncclwatch install KIND`: put what a node needs besides code in place.

The wheel carries the systemd units, example configs, alert and recording
rules, Grafana dashboards, Kubernetes manifests, the Slurm TaskProlog and
runbooks as data files
under ``<prefix>/share/ncclwatch/`` (and the docs under
``<prefix>/share/doc/ncclwatch/``; pyproject.toml ``data-files``), so no node
needs a source checkout. This command finds them where pip put them (the
installed distribution's RECORD, whatever the scheme: venv, --user,
--prefix) or, in a source checkout or editable install, in the tree itself,
and copies them to where each belongs. ``--root`` is prepended to every
destination (DESTDIR: image builds, packaging, tests).

The shipped units name the venv ``/opt/ncclwatch`` (``ExecStart=``,
``Documentation=``); ``install systemd`` writes them for the venv this command
runs from (``sys.prefix``: its ``bin/ncclwatch`` and ``share/doc/ncclwatch``),
or the one ``--prefix`` names, says which, and refuses a prefix without
``bin/ncclwatch`` (under ``--root`` or on this host): a unit that cannot start
is no install.

Each file is written to a temporary file in its destination folder, synced,
given its mode on the descriptor and renamed over: a reader sees the old file
or the new one, never half of it. A symlink at the destination folder or at a
file's name is refused (an error, nothing written through it): often run as
root, this must never write or chmod wherever a link points.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent

#: The venv the shipped units name (ExecStart=, Documentation=, their comments):
#: `install systemd` writes the prefix it installs them for in its place.
SHIPPED_PREFIX = "/opt/ncclwatch"
#: A prefix goes into ExecStart= and file:// URLs as it is: no spaces to quote,
#: no % specifiers, no $ variables, nothing systemd would read another way.
SAFE_PREFIX = re.compile(r"(/[A-Za-z0-9._+-]+)+")


@dataclass(frozen=True)
class Values:
    """What the files of a kind are written with, besides their own text."""
    prefix: str               # the venv the units run ncclwatch from
    runbook_url: str | None   # rules: where alerts link the runbooks (None: RUNBOOK_FALLBACK)


def _for_prefix(name: str, text: str, values: Values) -> str:
    """A unit for the venv ``values.prefix``: every SHIPPED_PREFIX path of its
    settings (ExecStart=, Documentation=); comments still say what was shipped."""
    path = re.compile(rf"{re.escape(SHIPPED_PREFIX)}(?![\w-])")
    return "".join(line if line.lstrip().startswith(("#", ";"))
                   else path.sub(values.prefix, line) for line in text.splitlines(True))


def _runbook_url(name: str, text: str, values: Values) -> str:
    """alerts.yaml linking the runbooks at ``values.runbook_url`` when given."""
    if name != "alerts.yaml" or not values.runbook_url:
        return text
    return text.replace(RUNBOOK_FALLBACK, values.runbook_url.rstrip("/") + "/")


@dataclass(frozen=True)
class Kind:
    share: str                 # folder under <prefix>/share of the installed wheel
    sources: tuple[str, ...]   # globs in a source checkout (pyproject.toml data-files)
    dest: str                  # default destination
    keep_existing: bool        # files people edit (configs): never overwritten without --force
    then: str                  # the next step, printed after copying
    help: str
    prefix: str = ""           # put before each file's name (a folder other software shares)
    mode: int = 0o644          # of the installed files (0o755: a script something runs)
    in_all: bool = True        # part of `install all` (not: what only some sites run)
    #: (file name, text, values) -> the text to install; None: the bytes as shipped
    edit: Callable[[str, str, Values], str] | None = None

    def name(self, source: str) -> str:
        """The installed name of the shipped file ``source``."""
        return self.prefix + source


#: What can be installed. pyproject.toml's [tool.setuptools.data-files] ships the same
#: globs to the same share folders (tests/unit/test_install.py checks both agree).
KINDS = {
    "systemd": Kind("ncclwatch/systemd", ("systemd/*.service",), "/etc/systemd/system", False,
                    "systemctl daemon-reload && systemctl enable --now ncclwatch-agent "
                    "(or ncclwatch-daemon on the collector host)",
                    "the agent, daemon and view-helper units, for the venv this command "
                    "runs from or --prefix (ExecStart=PREFIX/bin/ncclwatch)", edit=_for_prefix),
    "config": Kind("ncclwatch/config", ("systemd/examples/*.toml",), "/etc/ncclwatch", True,
                   "set collector = in agent.toml",
                   "example agent.toml and daemon.toml (kept if present, unless --force)"),
    "rules": Kind("ncclwatch/prometheus",
                  ("dashboards/prometheus/alerts.yaml", "dashboards/prometheus/rules.yaml",
                   "dashboards/prometheus/alertmanager.example.yml"),
                  "/etc/prometheus/ncclwatch", False,
                  "add alerts.yaml and rules.yaml to Prometheus's rule_files",
                  "Prometheus alerting and recording rules, an Alertmanager example",
                  edit=_runbook_url),
    "dashboards": Kind("ncclwatch/grafana", ("dashboards/grafana/*.json",),
                       "/var/lib/grafana/dashboards/ncclwatch", False,
                       "point a Grafana dashboard provider at this folder",
                       "the Grafana dashboards (JSON)"),
    "kubernetes": Kind("ncclwatch/kubernetes", ("deploy/kubernetes/*.yaml",),
                       "ncclwatch-kubernetes", False,
                       "set the image in kustomization.yaml, then kubectl apply -k <dest> "
                       "(or `ncclwatch render kubernetes --out DIR` with your site's values: "
                       "image, namespace, release label, external URL, node certificates)",
                       "the Kubernetes manifests (kustomization) as shipped"),
    "kubernetes-sharded": Kind("ncclwatch/kubernetes-sharded", ("deploy/kubernetes/sharded/*.yaml",),
                               "ncclwatch-kubernetes-sharded", False,
                               "set the image in kustomization.yaml, then kubectl apply -k <dest> "
                               "(or `ncclwatch render kubernetes-sharded --out DIR` with your "
                               "site's values)",
                               "the same, for two shards of daemon pairs (docs/scaling.md)"),
    "slurm": Kind("ncclwatch/slurm", ("deploy/slurm/task-prolog.sh",), "/etc/slurm", True,
                  "set TaskProlog=/etc/slurm/ncclwatch-task-prolog.sh in slurm.conf on every "
                  "node (its --dest if you gave one), then scontrol reconfigure",
                  "the Slurm TaskProlog: the Flight Recorder for every task, in a folder of "
                  "its own (ncclwatch-task-prolog.sh, kept if present, unless --force)",
                  prefix="ncclwatch-", mode=0o755, in_all=False),
    "runbooks": Kind("doc/ncclwatch/runbooks", ("docs/runbooks/*.md",),
                     "/usr/local/share/doc/ncclwatch/runbooks", False, "",
                     "the alerts' runbooks (Markdown)"),
}


#: The alert rules' runbook link when no daemon was seen in a week: the copy the
#: "runbooks" kind installs. `install rules --runbook-url URL` puts URL there instead.
RUNBOOK_FALLBACK = f"file://{KINDS['runbooks'].dest}/"


def _installed(share: str) -> list[Path]:
    """Files pip installed under <data>/share/<share>/, from the RECORD of the
    distribution this very module came from (another ncclwatch on sys.path,
    such as an editable install's metadata, is not ours)."""
    me = Path(__file__).resolve()
    marker = ("share",) + PurePosixPath(share).parts
    for dist in metadata.distributions(name="ncclwatch"):
        files = list(dist.files or ())
        if not any(str(f).endswith("ncclwatch/install.py")
                   and Path(dist.locate_file(f)).resolve() == me for f in files):
            continue
        out = []
        for f in files:
            parts = PurePosixPath(str(f)).parts
            for i in range(len(parts) - len(marker)):
                if parts[i:i + len(marker)] == marker and len(parts) == i + len(marker) + 1:
                    out.append(Path(dist.locate_file(f)).resolve())
        return sorted(p for p in out if p.is_file())
    return []


def sources(kind: str) -> list[Path]:
    """The files of one kind: from the installed wheel, else from the source tree."""
    k = KINDS[kind]
    found = _installed(k.share)
    if not found:
        found = sorted({p for g in k.sources for p in ROOT.glob(g) if p.is_file()})
    return found


class Refused(Exception):
    """A symlink where a file or folder is to be written: ``path``, and why not."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")


def open_folder(dest: Path) -> int:
    """A descriptor of the destination folder, made if missing; Refused when
    ``dest`` itself is a symlink (the folders above it are the operator's)."""
    link = Refused(dest, "is a symlink: not followed (give the real folder with --dest)")
    if dest.is_symlink():
        raise link
    dest.mkdir(parents=True, exist_ok=True)
    try:
        return os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        if dest.is_symlink():   # planted since the check above
            raise link from None
        raise


def exists(dir_fd: int, target: Path) -> bool:
    """Whether ``target`` is in the folder; Refused when it is a symlink."""
    try:
        st = os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise Refused(target, "is a symlink: not followed nor replaced (remove it to "
                      "install)")
    return True


def replace(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``name`` in the folder as a whole: a new temporary file beside it
    (O_EXCL|O_NOFOLLOW), synced, its mode set on the descriptor, renamed over."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    os.fsync(dir_fd)


def add_parser(sub: argparse._SubParsersAction) -> None:
    text = ("copy the shipped units, configs, rules, dashboards, manifests, Slurm prolog or "
            "runbooks into place")
    p = sub.add_parser("install", help=text, description=text + ": " + "; ".join(
        f"{name}: {k.help}, to {k.dest}" for name, k in KINDS.items()))
    p.add_argument("kinds", nargs="+", choices=[*KINDS, "all"], metavar="KIND",
                   help=f"what to install: {', '.join(KINDS)}, or all (every one but "
                   f"{', '.join(n for n, k in KINDS.items() if not k.in_all)})")
    p.add_argument("--dest", metavar="DIR", help="destination folder (one KIND only; "
                   "default: the KIND's usual place)")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="prepended to every destination, like DESTDIR (default: /)")
    p.add_argument("--force", action="store_true", help="overwrite configs that exist")
    p.add_argument("--list", action="store_true",
                   help="print what would be copied where, and copy nothing")
    p.add_argument("--prefix", metavar="DIR",
                   help="systemd: the venv the units run ncclwatch from, PREFIX/bin/ncclwatch, "
                   "and link the docs of, PREFIX/share/doc/ncclwatch (default: the venv this "
                   f"command runs from, {sys.prefix}; the shipped units say {SHIPPED_PREFIX})")
    p.add_argument("--runbook-url", metavar="URL",
                   help="rules: where alerts link the runbooks when no daemon was seen in a "
                   f"week (an http(s) copy of docs/runbooks; default: {RUNBOOK_FALLBACK})")


def _under_root(root: str, path: Path) -> Path:
    """``path`` as seen from the host when ``root`` is the system's root (DESTDIR)."""
    return Path(root) / path.relative_to(path.anchor) if path.is_absolute() \
        else Path(root) / path if root != "/" else path


def unit_prefix(args: argparse.Namespace) -> tuple[str | None, str, int]:
    """(the venv the units are written for, why that one, 0); (None, the error, exit
    status) when it is no plain absolute path (2) or has no bin/ncclwatch, under
    --root nor on this host (1)."""
    given = args.prefix is not None
    prefix = os.path.normpath(args.prefix) if given else sys.prefix
    why = "--prefix" if given else "the venv this command runs from; --prefix for another"
    if not os.path.isabs(prefix) or not SAFE_PREFIX.fullmatch(prefix):
        return None, (f"--prefix {args.prefix}: an absolute path of letters, digits and "
                      "._+- only (it goes into ExecStart= unquoted)" if given
                      else f"{prefix} ({why}) is no plain absolute path: give --prefix"), 2
    exe = Path(prefix) / "bin" / "ncclwatch"
    where = {_under_root(args.root, exe), exe}   # in the image --root builds, or this host's
    if not any(os.access(e, os.X_OK) for e in where) and not args.list:
        return None, (f"{' nor '.join(map(str, sorted(where)))}: missing or not executable, "
                      "the units would not start (give --prefix of the venv that has it)"), 1
    return prefix, why, 0


def main(args: argparse.Namespace) -> int:
    kinds = [n for n, k in KINDS.items() if k.in_all] if "all" in args.kinds \
        else list(dict.fromkeys(args.kinds))
    if args.dest and len(kinds) != 1:
        print("ncclwatch install: --dest takes one KIND", file=sys.stderr)
        return 2
    if args.runbook_url and not args.runbook_url.startswith(("http://", "https://")):
        print("ncclwatch install: --runbook-url must be an http:// or https:// URL",
              file=sys.stderr)
        return 2
    if args.prefix is not None and "systemd" not in kinds:
        print("ncclwatch install: --prefix is for the systemd units", file=sys.stderr)
        return 2
    prefix, why, status = unit_prefix(args) if "systemd" in kinds else (SHIPPED_PREFIX, "", 0)
    if prefix is None:
        print(f"ncclwatch install: {why}", file=sys.stderr)
        return status
    if "systemd" in kinds:
        print(f"units run {prefix}/bin/ncclwatch ({why})")
    values = Values(prefix=prefix, runbook_url=args.runbook_url)
    for name in kinds:
        k = KINDS[name]
        files = sources(name)
        if not files:
            print(f"ncclwatch install: no {name} files found (a broken install?)", file=sys.stderr)
            return 1
        dest = _under_root(args.root, Path(args.dest or k.dest))
        dir_fd = None
        try:
            for src in files:
                target = dest / k.name(src.name)
                if args.list:
                    print(f"{src} -> {target}")
                    continue
                try:
                    if dir_fd is None:
                        dir_fd = open_folder(dest)
                    if exists(dir_fd, target) and k.keep_existing and not args.force:
                        print(f"kept {target} (exists; --force overwrites)")
                        continue
                    data = src.read_bytes() if k.edit is None \
                        else k.edit(src.name, src.read_text(), values).encode()
                    replace(dir_fd, target.name, data, k.mode)
                except Refused as e:
                    print(f"ncclwatch install: {e}", file=sys.stderr)
                    return 1
                except OSError as e:  # typically not root for /etc: say so, no traceback
                    print(f"ncclwatch install: {target}: {e.strerror or e}", file=sys.stderr)
                    return 1
                print(f"installed {target}")
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        if k.then and not args.list:
            print(f"next: {k.then}")
    return 0
