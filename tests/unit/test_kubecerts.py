"""Node certificates from cert-manager (``ncclwatch render kubernetes --node-certs
cert-manager``): each node's Certificate names it and reaches only that node's
agent DaemonSet; the daemons' names every Service they are reached by; a
private CA unless the site names its issuer; and, issued as cert-manager's CA
issuer would issue them, the real TLS checks of agent and daemon accept a node's
certificate for that node only. Node names long or dotted still make object
names and labels that fit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ncclwatch import kubecerts
from ncclwatch.cli import AGENT_OPTIONS, build_parser
from ncclwatch.config import ConfigError, resolve
from ncclwatch.kuberender import Site, render
from tests.harness.k8s import (CERTS, K8S, NODES, container_env, issue_as_cert_manager, objects,
                               one)


def _daemonsets(files: dict[str, str]) -> list[dict]:
    return [o for o in objects(files) if o["kind"] == "DaemonSet"]


def test_each_node_has_a_certificate_naming_it_and_an_agent_mounting_only_it() -> None:
    files = render(CERTS, "kubernetes")
    sets = _daemonsets(files)
    assert len(sets) == len(NODES)
    secrets = set()
    for node, ds in zip(NODES, sets):
        secret = kubecerts.node_secret(node)
        secrets.add(secret)
        cert = one(files, "Certificate", secret)["spec"]
        assert cert["secretName"] == secret and cert["dnsNames"] == [node]
        assert cert.get("commonName", node) == node        # none past 64 characters
        assert ("commonName" in cert) == (len(node) <= 64)
        assert set(cert["usages"]) == {"digital signature", "client auth"}
        assert cert["privateKey"] == {"algorithm": "ECDSA", "size": 256,
                                      "rotationPolicy": "Always"}
        pod = ds["spec"]["template"]["spec"]
        (term,) = pod["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term == {"matchFields": [{"key": "metadata.name", "operator": "In",
                                         "values": [node]}]}
        vol = next(v for v in pod["volumes"] if v["name"] == "node-tls")
        assert vol == {"name": "node-tls", "secret": {"secretName": secret, "defaultMode": 0o400}}
        (c,) = pod["containers"]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "node-tls")
        assert mount["readOnly"] is True
        env = container_env(c)
        assert {env[k] for k in ("NCCLWATCH_TLS_CA", "NCCLWATCH_TLS_CERT", "NCCLWATCH_TLS_KEY")} \
            == {f"{mount['mountPath']}/{f}" for f in ("ca.crt", "tls.crt", "tls.key")}
        assert "valueFrom" in next(e for e in c["env"] if e["name"] == "NCCLWATCH_NODE")
        # each DaemonSet's selector takes its own pods only
        for other in sets:
            mine = ds["spec"]["selector"]["matchLabels"].items() <= \
                other["spec"]["template"]["metadata"]["labels"].items()
            assert mine == (other is ds)
        assert not any("hostPath" in v and v["hostPath"]["path"] == "/etc/ncclwatch/tls"
                       for v in pod["volumes"])
    assert len(secrets) == len(NODES)
    # otherwise the shipped DaemonSet, unchanged
    shipped = next(d for d in yaml.safe_load_all((K8S / "agent-daemonset.yaml").read_text())
                   if d and d["kind"] == "DaemonSet")
    pod, want = sets[0]["spec"]["template"]["spec"], shipped["spec"]["template"]["spec"]
    assert {k: v for k, v in pod.items() if k not in ("affinity", "volumes", "containers")} \
        == {k: v for k, v in want.items() if k not in ("volumes", "containers")}


def test_the_daemon_certificate_names_every_service_agents_and_prometheus_use() -> None:
    for kind in ("kubernetes", "kubernetes-sharded"):
        files = render(Site(node_certs="cert-manager", nodes=NODES[:1], namespace="gpu-mon",
                            external_url="https://nw.example.com" if kind == "kubernetes"
                            else "https://nw-{shard}.example.com"), kind)
        cert = one(files, "Certificate", "ncclwatch-daemon")["spec"]
        assert cert["secretName"] == "ncclwatch-daemon-tls"
        assert set(cert["usages"]) == {"digital signature", "server auth"}
        (ds,) = _daemonsets(files)
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        collectors = resolve(AGENT_OPTIONS, build_parser().parse_args(c["args"]), {},
                             env={k: v for k, v in container_env(c).items() if v})["collector"]
        hosts = {t.rsplit(":", 1)[0] for t in re.split("[,;]", collectors)}
        monitor = next(o for o in objects(files) if o["kind"] == "PodMonitor")
        hosts.add(monitor["spec"]["podMetricsEndpoints"][0]["tlsConfig"]["serverName"])
        toml = one(files, "ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"]
        hosts |= set(re.search(r'^allowed_hosts = "(.*)"$', toml, re.M).group(1).split(","))
        assert hosts <= set(cert["dnsNames"]), hosts - set(cert["dnsNames"])
        assert "ncclwatch-daemon-a.gpu-mon.svc" in cert["dnsNames"] or kind != "kubernetes"


def test_a_private_ca_unless_the_site_names_its_issuer() -> None:
    files = render(CERTS, "kubernetes")
    own = one(files, "Issuer", kubecerts.CA)["spec"]
    assert own == {"ca": {"secretName": kubecerts.CA}}
    ca = one(files, "Certificate", kubecerts.CA)["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == kubecerts.SELF_SIGNED
    assert one(files, "Issuer", kubecerts.SELF_SIGNED)["spec"] == {"selfSigned": {}}
    refs = {json.dumps(o["spec"]["issuerRef"]) for o in objects(files)
            if o["kind"] == "Certificate" and o["metadata"]["name"] != kubecerts.CA}
    assert refs == {json.dumps({"name": kubecerts.CA, "kind": "Issuer",
                                "group": "cert-manager.io"})}
    files = render(Site(node_certs="cert-manager", nodes=NODES[:1], issuer="corp",
                        issuer_kind="ClusterIssuer"), "kubernetes")
    assert not [o for o in objects(files) if o["kind"] == "Issuer"]
    assert {json.dumps(o["spec"]["issuerRef"]) for o in objects(files)
            if o["kind"] == "Certificate"} == {json.dumps(
                {"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"})}


def test_a_node_certificate_as_issued_is_that_agents_identity_only(tmp_path: Path) -> None:
    """The agent's real TLS check, with the DaemonSet's env and its Secret mounted where
    it says: accepted as its node, refused (exit 2 at start) as another."""
    from ncclwatch import tls

    files = render(CERTS, "kubernetes")
    for node, ds in zip(NODES[:2], _daemonsets(files)):
        secret = issue_as_cert_manager(one(files, "Certificate", kubecerts.node_secret(node)),
                                       tmp_path / node, tmp_path / "ca")
        mount = tmp_path / "mounted" / node          # the kubelet's secret volume
        mount.mkdir(parents=True)
        for key, data in secret.items():
            (mount / key).write_bytes(data)
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        env = {k: v.replace(kubecerts.NODE_TLS, str(mount)) for k, v in container_env(c).items()}
        cfg = {"tls_ca": env["NCCLWATCH_TLS_CA"], "tls_cert": env["NCCLWATCH_TLS_CERT"],
               "tls_key": env["NCCLWATCH_TLS_KEY"]}
        assert tls.client_tls(cfg, node=node) is not None
        other = next(n for n in NODES if n != node)
        with pytest.raises(ConfigError, match="reports as --node"):
            tls.client_tls(cfg, node=other)
    daemon = issue_as_cert_manager(one(files, "Certificate", "ncclwatch-daemon"),
                                   tmp_path / "daemon", tmp_path / "ca")
    for key, data in daemon.items():
        (tmp_path / key).write_bytes(data)
    assert tls.server_tls({"tls_cert": str(tmp_path / "tls.crt"),
                           "tls_key": str(tmp_path / "tls.key"),
                           "tls_client_ca": str(tmp_path / "ca.crt")}) is not None


def test_node_names_become_object_names_and_labels_that_fit() -> None:
    files = render(CERTS, "kubernetes")
    for ds in _daemonsets(files):
        name = ds["metadata"]["name"]
        value = ds["metadata"]["labels"][kubecerts.NODE_LABEL]
        assert len(value) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value)
        assert len(name) <= 63 and "." not in name     # pods' names are their host names
    alike = ("a" * 50 + ".x", "a" * 50 + "-x", "a" * 31 + ".y")   # one readable part
    keys = [kubecerts.node_key(n) for n in alike]
    assert len(set(keys)) == 3 and len({k[:31] for k in keys}) == 1
