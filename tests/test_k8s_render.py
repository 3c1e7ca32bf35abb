"""`ncclwatch render kubernetes`: the layout with a site's values, from the shipped files.

Every default renders deploy/kubernetes (and sharded/) byte for byte; a site's
values reach every object they name (namespace, image, release label, links,
the NetworkPolicy's peers); every rendered object validates strictly (the
Kubernetes schemas offline, the Prometheus Operator's and cert-manager's CRD
fields); with an external URL no link points at a name only the cluster
resolves, which a real daemon started from the rendered config shows; node
certificates from cert-manager name their node, reach only its agent, and
the real TLS checks of agent and daemon accept them for that node only.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ncclwatch import __version__, kubecerts
from ncclwatch.cli import AGENT_OPTIONS, build_parser, main
from ncclwatch.config import ConfigError, resolve
from ncclwatch.kuberender import Site, SiteError, render
from tests.conftest import Proc, free_port, need
from tests.test_k8s_manifests import (CRD_SCHEMAS, K8S, VERSIONS, _get, core,  # noqa: F401
                                      k8s_pki, localize, web_login)

SITE = Site(namespace="gpu-mon", image="registry.example:5000/ml/ncclwatch:7.1",
            release_label="kps", external_url="https://ncclwatch.example.com",
            ingress_namespace="ingress-nginx", prometheus_namespace="observability")
NODES = ("gpu-node-0", "gpu-node-1.cluster.example", "n" * 70)
CERTS = Site(node_certs="cert-manager", nodes=NODES)


def objects(files: dict[str, str]) -> list[dict]:
    return [d for name, text in files.items() if name != "kustomization.yaml"
            for d in yaml.safe_load_all(text) if d]


def one(files: dict[str, str], kind: str, name: str) -> dict:
    found = [d for d in objects(files) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# -- the defaults are the shipped files ----------------------------------------------------

def test_every_default_renders_the_shipped_layout_byte_for_byte() -> None:
    single = render(Site(), "kubernetes")
    assert single == {f.name: f.read_text() for f in K8S.glob("*.yaml")}
    sharded = render(Site(), "kubernetes-sharded")
    assert sharded == {f.name: f.read_text() for f in (K8S / "sharded").glob("*.yaml")}


def test_a_file_the_values_leave_alone_is_copied_as_shipped() -> None:
    files = render(Site(release_label="kps"), "kubernetes")
    for name in ("daemon.yaml", "agent-daemonset.yaml", "namespace.yaml", "kustomization.yaml"):
        assert files[name] == (K8S / name).read_text(), name     # comments and all
    assert files["podmonitor.yaml"].startswith("# RENDERED by `ncclwatch render kubernetes`")


# -- the values, from flags, the environment and a file -----------------------------------

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


def test_render_never_writes_through_a_symlink(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "daemon.yaml").symlink_to(tmp_path / "elsewhere")
    assert main(["render", "kubernetes", "--out", str(out)]) == 1
    assert "is a symlink" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


# -- every rendered object validates ------------------------------------------------------

VARIANTS = {
    "site": (SITE, "kubernetes"),
    "service-monitor": (Site(service_monitor=True, release_label="kps"), "kubernetes"),
    "cert-manager": (CERTS, "kubernetes"),
    "cert-manager-issuer": (Site(node_certs="cert-manager", nodes=NODES[:1], issuer="corp",
                                 issuer_kind="ClusterIssuer"), "kubernetes"),
    "sharded-site": (Site(namespace="gpu-mon", external_url="https://nw-{shard}.example.com",
                          node_certs="cert-manager", nodes=NODES, shard_count=3,
                          service_monitor=True, ingress_namespace="ingress-nginx"),
                     "kubernetes-sharded"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_validates_strictly(variant: str) -> None:
    site, kind = VARIANTS[variant]
    files = render(site, kind)
    k = yaml.safe_load(files["kustomization.yaml"])
    assert sorted(k["resources"]) == sorted(n for n in files if n != "kustomization.yaml")
    assert k["namespace"] == site.namespace
    checked = 0
    for obj in objects(files):
        if core(obj) and obj["apiVersion"] != "cert-manager.io/v1":
            for version in VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
        else:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        checked += 1
    assert checked >= 16, checked


def test_the_cert_manager_fields_catch_a_misspelt_or_impossible_field() -> None:
    files = render(CERTS, "kubernetes")
    cert = one(files, "Certificate", kubecerts.node_secret(NODES[0]))
    jsonschema.validate(cert, CRD_SCHEMAS["Certificate"])
    for change in ({"dnsName": ["x"]}, {"usages": ["client-auth"]},
                   {"commonName": "c" * 65}, {"duration": "1y"},
                   {"privateKey": {"algorithm": "ECDSA", "rotation": "Always"}}):
        bad = json.loads(json.dumps(cert))
        bad["spec"].update(change)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, CRD_SCHEMAS["Certificate"])
    issuer = one(files, "Issuer", kubecerts.CA)
    bad = json.loads(json.dumps(issuer))
    bad["spec"]["selfSigned"] = {}                                  # two kinds of issuer
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CRD_SCHEMAS["Issuer"])


# -- the namespace and the image ------------------------------------------------------------

def test_every_in_cluster_name_follows_the_namespace() -> None:
    site = Site(namespace="gpu-mon")
    files = render(site, "kubernetes")
    text = "".join(files.values())
    assert ".ncclwatch.svc" not in text and ".ncclwatch:" not in text
    assert one(files, "Namespace", "gpu-mon")
    for x in "ab":
        (c,) = one(files, "Deployment", f"ncclwatch-daemon-{x}")["spec"]["template"]["spec"][
            "containers"]
        assert env_of(c)["NCCLWATCH_EXTERNAL_URL"] == f"https://ncclwatch-daemon-{x}.gpu-mon.svc:7471"
    toml = one(files, "ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"]
    assert "ncclwatch-daemon-a.gpu-mon.svc" in re.search(r'^allowed_hosts = "(.*)"$', toml,
                                                        re.M).group(1).split(",")
    assert "https://ncclwatch-daemon.gpu-mon.svc:7471/runbooks/" in files["prometheusrule.yaml"]


@pytest.mark.parametrize("image,entry", [
    ("registry.example:5000/ml/ncclwatch:7.1", {"newName": "registry.example:5000/ml/ncclwatch",
                                                "newTag": "7.1"}),
    ("registry.example:5000/ncclwatch", {"newName": "registry.example:5000/ncclwatch",
                                         "newTag": __version__}),
    ("r.example/ncclwatch@sha256:" + "a" * 64, {"newName": "r.example/ncclwatch",
                                                "digest": "sha256:" + "a" * 64}),
])
def test_the_image_is_set_where_kustomize_sets_it(image: str, entry: dict) -> None:
    k = yaml.safe_load(render(Site(image=image), "kubernetes")["kustomization.yaml"])
    assert k["images"] == [{"name": "ncclwatch", **entry}]
    # every container runs the image that entry rewrites
    images = {c["image"].split(":")[0] for o in objects(render(Site(), "kubernetes"))
              if o["kind"] in ("Deployment", "DaemonSet")
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {"ncclwatch"}


# -- links that open ------------------------------------------------------------------------

URL = re.compile(r"https?://[^\s\"'`<>)\]},]+")
#: Names only the cluster's DNS resolves: a Service, in any namespace.
SERVICES = re.compile(r"^ncclwatch-daemon(-\d*[ab])?$")


def internal_links(files: dict[str, str]) -> list[str]:
    """Every URL of the layout whose host is a cluster-internal name."""
    out = []
    for name, text in files.items():
        for url in URL.findall(text):
            host = urlsplit(url.replace("{shard}", "0")).hostname or ""
            if host.endswith((".svc", ".cluster.local")) or SERVICES.match(host):
                out.append(f"{name}: {url}")
    return out


def test_the_shipped_links_are_the_services_in_cluster_names() -> None:
    """The check below can fail: as shipped, the links are the Services'."""
    links = internal_links(render(Site(), "kubernetes"))
    assert any("prometheusrule.yaml: https://ncclwatch-daemon.ncclwatch.svc:7471" in u
               for u in links), links
    assert any(u.startswith("daemon.yaml:") for u in links), links


@pytest.mark.parametrize("kind,url", [
    ("kubernetes", "https://ncclwatch.example.com"),
    ("kubernetes-sharded", "https://ncclwatch-{shard}.example.com:8443"),
])
def test_with_an_external_url_no_link_is_cluster_internal(kind: str, url: str) -> None:
    site = Site(external_url=url, namespace="gpu-mon")
    files = render(site, kind)
    assert internal_links(files) == []
    rule = one(files, "PrometheusRule", "ncclwatch")
    links = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"]
             for r in g["rules"] if "alert" in r]
    fallback = url.replace("{shard}", "0") + "/runbooks/"
    assert links and all(f"{{{{ else }}}}{fallback}{{{{ end }}}}" in u for u in links)
    toml = one(files, "ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"]
    hosts = re.search(r'^allowed_hosts = "(.*)"$', toml, re.M).group(1).split(",")
    deployments = [o for o in objects(files) if o["kind"] == "Deployment"]
    for d in deployments:
        (c,) = d["spec"]["template"]["spec"]["containers"]
        env = env_of(c)
        want = url.replace("{shard}", env.get("NCCLWATCH_SHARD", "0"))
        assert env["NCCLWATCH_EXTERNAL_URL"] == want
        assert urlsplit(want).hostname in hosts            # the daemons answer that Host
    if kind == "kubernetes-sharded":
        assert len(deployments) == 4
        shards = re.search(r"^shards = \[\n(.*?)\n\]", toml, re.M | re.S).group(1)
        assert json.loads(f"[{shards.rstrip(',')}]") == [
            [url.replace("{shard}", str(k))] for k in range(2)]


def test_a_daemon_from_the_rendered_layout_links_to_the_external_url(tmp_path: Path,
                                                                     k8s_pki) -> None:
    """The rendered ConfigMap and Deployment env, run for real: ncclwatch_daemon_info
    (every alert's daemon_url and runbook_url) and the page name the external URL,
    and the daemon answers requests for the external host."""
    files = render(SITE, "kubernetes")
    cm = one(files, "ConfigMap", "ncclwatch-daemon")
    (c,) = one(files, "Deployment", "ncclwatch-daemon-a")["spec"]["template"]["spec"][
        "containers"]
    grpc, http = free_port(), free_port()
    config = tmp_path / "daemon.toml"
    config.write_text(localize(cm["data"]["daemon.toml"], cm, k8s_pki, tmp_path)
                      .replace("0.0.0.0:7470", f"127.0.0.1:{grpc}")
                      .replace("0.0.0.0:7471", f"127.0.0.1:{http}"))
    daemon = Proc([need("ncclwatch"), *c["args"][:1], "--config", str(config)],
                  env=env_of(c), name="rendered-daemon")
    try:
        deadline, metrics = time.time() + 30, ""
        while "ncclwatch_daemon_info" not in metrics and time.time() < deadline:
            assert daemon.alive(), daemon.output()[-2000:]
            try:
                metrics = _get(http, "/metrics", k8s_pki, web_login(k8s_pki))[1]
            except OSError:
                time.sleep(0.3)
        info = next(line for line in metrics.splitlines()
                    if line.startswith("ncclwatch_daemon_info{"))
        assert 'url="https://ncclwatch.example.com"' in info, info
        assert 'runbook_base="https://ncclwatch.example.com/runbooks/"' in info, info
        status, page = _get(http, "/", k8s_pki, web_login(k8s_pki))
        assert status == 200 and ".svc" not in page and "cluster.local" not in page
        assert _get(http, "/", k8s_pki, None)[0] == 401           # auth stays on
        for host, want in (("ncclwatch.example.com", 200), ("evil.example", 403)):
            assert _host(http, host, k8s_pki) == want, host
    finally:
        daemon.stop()


def _host(port: int, host: str, pki: Path) -> int:
    """GET /api/v1/jobs as a proxy would send it: the external Host header."""
    import base64
    import http.client
    import ssl

    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    conn.request("GET", "/api/v1/jobs", headers={
        "Host": host, "Authorization": "Basic " + base64.b64encode(
            web_login(pki).encode()).decode()})
    try:
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_network_policy_admits_the_ingress_namespace_when_asked() -> None:
    def rules(site: Site) -> list[dict]:
        return one(render(site, "kubernetes"), "NetworkPolicy", "ncclwatch-daemon")["spec"][
            "ingress"]

    shipped = rules(Site())
    assert len(shipped) == 2                         # agents, Prometheus; no one else
    asked = rules(Site(ingress_namespace="ingress-nginx"))
    assert asked[:2] == shipped
    assert asked[2] == {"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "ingress-nginx"}}}],
        "ports": [{"protocol": "TCP", "port": "http"}]}   # the page, never gRPC
    prom = rules(Site(prometheus_namespace="observability"))[1]["from"][0]
    assert prom["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"}
    assert prom["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


# -- node certificates from cert-manager ----------------------------------------------------

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
        env = env_of(c)
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
                             env={k: v for k, v in env_of(c).items() if v})["collector"]
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
    files = render(VARIANTS["cert-manager-issuer"][0], "kubernetes")
    assert not [o for o in objects(files) if o["kind"] == "Issuer"]
    assert {json.dumps(o["spec"]["issuerRef"]) for o in objects(files)
            if o["kind"] == "Certificate"} == {json.dumps(
                {"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"})}


def issue_as_cert_manager(cert: dict, out: Path, ca_dir: Path) -> dict[str, bytes]:
    """The Secret a cert-manager CA issuer writes for ``cert``: tls.crt (the names and
    usage the Certificate asks for), tls.key, ca.crt; by the real `ncclwatch certs` code."""
    from ncclwatch import certs

    spec = cert["spec"]
    ca_dir.mkdir(exist_ok=True)
    ca, ca_key, _ = certs.load_or_make_ca(ca_dir)
    usages = set(spec["usages"]) - {"digital signature"}
    assert usages in ({"client auth"}, {"server auth"}), usages
    out.mkdir(parents=True, exist_ok=True)
    issued = certs.issue(out, "tls", spec.get("commonName", spec["dnsNames"][0]),
                         spec["dnsNames"], "server auth" in usages, ca, ca_key)
    return {"tls.crt": issued.cert.read_bytes(), "tls.key": issued.key.read_bytes(),
            "ca.crt": (ca_dir / "ca.pem").read_bytes()}


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
        env = {k: v.replace(kubecerts.NODE_TLS, str(mount)) for k, v in env_of(c).items()}
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


def test_the_nodes_can_come_from_kubectl(tmp_path: Path) -> None:
    listing = tmp_path / "nodes"
    listing.write_text("node/gpu-node-0\nnode/gpu-node-1   # rack 2\n\n")
    files = render(Site(node_certs="cert-manager", nodes_file=str(listing),
                        nodes=("gpu-node-0", "gpu-node-9")), "kubernetes")
    assert [d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchFields"][0]["values"] for d in _daemonsets(files)] == [
        ["gpu-node-0"], ["gpu-node-9"], ["gpu-node-1"]]
    listing.write_text("node/GPU 1\n")
    with pytest.raises(SiteError, match="not a Kubernetes node name"):
        render(Site(node_certs="cert-manager", nodes_file=str(listing)), "kubernetes")
    os.unlink(listing)
    with pytest.raises(SiteError, match="--nodes-file"):
        render(Site(node_certs="cert-manager", nodes_file=str(listing)), "kubernetes")
