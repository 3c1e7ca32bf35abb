"""`ncclwatch render kubernetes` from the wheel alone: no checkout, no deploy/.

The wheel is built here as a release is (``python -m build --wheel
--no-isolation``) and installed without dependencies into a prefix of its own;
the command runs from that prefix, outside the checkout, with ``python -S`` (no
site: the test venv's editable install of the checkout is not on the path, only
its dependencies' folder). The layout it writes for a site is the one the tree
renders, file for file: the hand-written manifests, the rules and the
dashboards all came from the wheel's data files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ncclwatch.kuberender import Site, render
from tests.harness.paths import ROOT

pytestmark = pytest.mark.e2e

ARGV = ["--namespace", "gpu-mon", "--image", "registry.example/ncclwatch:7", "--release-label",
        "kps", "--external-url", "https://ncclwatch.example.com", "--ingress-namespace",
        "ingress-nginx", "--node-certs", "cert-manager", "--nodes", "gpu-node-0,gpu-node-1"]
SITE = Site(namespace="gpu-mon", image="registry.example/ncclwatch:7", release_label="kps",
            external_url="https://ncclwatch.example.com", ingress_namespace="ingress-nginx",
            node_certs="cert-manager", nodes=("gpu-node-0", "gpu-node-1"))


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{argv}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_render_from_the_wheel_alone_writes_what_the_tree_renders(tmp_path: Path) -> None:
    src = tmp_path / "src"   # a copy: setuptools leaves build/ and *.egg-info behind
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "artifacts", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "certs"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
          str(tmp_path / "dist"), str(src)])
    [wheel] = list((tmp_path / "dist").glob("ncclwatch-*.whl"))
    prefix = tmp_path / "prefix"
    # --ignore-installed: never touch this venv's own (editable) install of ncclwatch,
    # which pip would otherwise uninstall before installing the wheel in the prefix.
    _run([sys.executable, "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps",
          "--no-index", "--prefix", str(prefix), str(wheel)])
    site_packages = sysconfig.get_path("purelib", vars={"base": str(prefix),
                                                        "platbase": str(prefix)})
    deps = sysconfig.get_path("purelib")          # this venv's: yaml and the rest
    assert Path(site_packages, "ncclwatch", "kuberender.py").is_file()
    assert (prefix / "share" / "ncclwatch" / "kubernetes" / "daemon.yaml").is_file()
    out, work = tmp_path / "out", tmp_path / "elsewhere"
    work.mkdir()
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; import ncclwatch; "
            "print(ncclwatch.__file__, file=sys.stderr); from ncclwatch.cli import main; "
            "sys.exit(main(sys.argv[3:]))")
    run = _run([sys.executable, "-S", "-c", code, site_packages, deps, "render", "kubernetes",
                "--out", str(out), *ARGV], cwd=work, env={"PATH": "/usr/bin:/bin"})
    assert run.stderr.splitlines()[0].startswith(str(prefix)), run.stderr   # not the checkout
    want = render(SITE, "kubernetes")
    assert sorted(p.name for p in out.iterdir()) == sorted(want)
    for name, text in want.items():
        assert (out / name).read_text() == text, name
    assert "certificates.yaml" in want and "ncclwatch.example.com" in want["daemon.yaml"]
