"""`ncclwatch render kubernetes` from the wheel alone: no checkout, no deploy/.

The wheel is built as a release is and installed without dependencies into a
prefix of its own; the command runs from that prefix, outside the checkout,
with ``python -S`` (``tests/harness/k8s.py``: ``render_from_wheel``). For the
site the e2e tests deploy (``SITE``) the layout it writes is the one the tree
renders, file for file: the hand-written manifests, the rules and the
dashboards all came from the wheel's data files. These same wheel-rendered
files are what ``tests/e2e/test_rendered_pods.py`` starts in the tests' kubelet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclwatch.kuberender import render
from tests.harness.k8s import SITE, render_from_wheel, wheel_prefix

pytestmark = pytest.mark.e2e


def test_render_from_the_wheel_alone_writes_what_the_tree_renders(tmp_path: Path) -> None:
    prefix, site_packages = wheel_prefix()
    assert Path(site_packages, "ncclwatch", "kuberender.py").is_file()
    assert (prefix / "share" / "ncclwatch" / "kubernetes" / "daemon.yaml").is_file()
    got = render_from_wheel(SITE, "kubernetes", tmp_path / "out")
    want = render(SITE, "kubernetes")
    assert sorted(got) == sorted(want)
    for name, text in want.items():
        assert got[name] == text, name
    assert "certificates.yaml" in want and SITE.external_url.split("//")[1] in want["daemon.yaml"]
    assert f"namespace: {SITE.namespace}" in want["kustomization.yaml"]
