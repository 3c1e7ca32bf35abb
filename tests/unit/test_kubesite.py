"""A site's values for the Kubernetes layout (``ncclwatch render``): from flags, the
environment and a TOML file, in that order; a value that cannot work refused by
its name before anything is written; the nodes for cert-manager from a list or
from ``kubectl get nodes -o name``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ncclwatch.cli import main
from ncclwatch.kuberender import render
from ncclwatch.kubesite import Site, SiteError
from tests.harness.k8s import objects


def test_site_values_come_from_flags_environment_and_toml(tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    toml = tmp_path / "site.toml"
    toml.write_text('namespace = "from-file"\nimage = "registry.example/ncclwatch:9"\n'
                    'nodes = ["gpu-a", "node/gpu-b"]\nnode_certs = "cert-manager"\n')
    monkeypatch.setenv("NCCLWATCH_RELEASE_LABEL", "from-env")
    monkeypatch.setenv("NCCLWATCH_NAMESPACE", "ns-env")
    out = tmp_path / "out"
    assert main(["render", "kubernetes", "--out", str(out), "--config", str(toml),
                 "--namespace", "from-flag"]) == 0
    k = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert k["namespace"] == "from-flag"                          # flag > env > file
    assert k["images"] == [{"name": "ncclwatch", "newName": "registry.example/ncclwatch",
                            "newTag": "9"}]
    assert "certificates.yaml" in k["resources"]
    rule = yaml.safe_load((out / "prometheusrule.yaml").read_text().split("\n", 2)[2])
    assert rule["metadata"]["labels"]["release"] == "from-env"
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(
        (out / "agent-daemonset.yaml").read_text()) if d and d["kind"] == "DaemonSet"]
    assert names == ["ncclwatch-agent-gpu-a", "ncclwatch-agent-gpu-b"]
    # the command that renders it again, in the kustomization
    assert ("ncclwatch render kubernetes --out DIR --namespace from-flag --image "
            "registry.example/ncclwatch:9 --release-label from-env --node-certs cert-manager "
            "--nodes gpu-a,gpu-b") in (out / "kustomization.yaml").read_text()
    assert f"wrote {out / 'kustomization.yaml'}" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--namespace", "Not_A_Namespace"], "not a Kubernetes namespace name"),
    (["--external-url", "https://ncclwatch.example.com/ncclwatch"], "scheme, host and port only"),
    (["--external-url", "ncclwatch.example.com"], "not an http:// or https:// URL"),
    (["--external-url", "https://ncclwatch-{shard}.example.com"], "'{shard}' is for"),
    (["--node-certs", "cert-manager"], "needs the nodes"),
    (["--nodes", "gpu-1"], "go with --node-certs cert-manager"),
    (["--node-certs", "cert-manager", "--nodes", "GPU_1"], "not a Kubernetes node name"),
    (["--image", "registry.example/ncclwatch:1 ; rm"], "not an image reference"),
])
def test_values_that_cannot_work_are_refused_by_name(tmp_path: Path, capsys, argv,
                                                     message) -> None:
    try:
        code = main(["render", "kubernetes", "--out", str(tmp_path / "o"), *argv])
    except SystemExit as e:            # a flag's own value: argparse says why
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_sharded_layout_needs_a_url_per_shard(tmp_path: Path, capsys) -> None:
    argv = ["render", "kubernetes-sharded", "--out", str(tmp_path / "o"), "--external-url"]
    assert main([*argv, "https://ncclwatch.example.com"]) == 2
    assert "put '{shard}' in it" in capsys.readouterr().err
    assert main([*argv, "https://ncclwatch-{shard}.example.com"]) == 0


def test_the_nodes_can_come_from_kubectl(tmp_path: Path) -> None:
    listing = tmp_path / "nodes"
    listing.write_text("node/gpu-node-0\nnode/gpu-node-1   # rack 2\n\n")
    files = render(Site(node_certs="cert-manager", nodes_file=str(listing),
                        nodes=("gpu-node-0", "gpu-node-9")), "kubernetes")
    assert [d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchFields"][0]["values"] for d in objects(files) if d["kind"] == "DaemonSet"] == [
        ["gpu-node-0"], ["gpu-node-9"], ["gpu-node-1"]]
    listing.write_text("node/GPU 1\n")
    with pytest.raises(SiteError, match="not a Kubernetes node name"):
        render(Site(node_certs="cert-manager", nodes_file=str(listing)), "kubernetes")
    os.unlink(listing)
    with pytest.raises(SiteError, match="--nodes-file"):
        render(Site(node_certs="cert-manager", nodes_file=str(listing)), "kubernetes")
