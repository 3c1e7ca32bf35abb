"""`ncclwatch render kubernetes`: the layout with a site's values, from the shipped files.

Every default renders deploy/kubernetes (and sharded/) byte for byte; a site's
values reach every object they name (namespace, image, release label, links,
the NetworkPolicy's peers); every rendered object validates strictly (the
Kubernetes schemas offline, the Prometheus Operator's and cert-manager's CRD
fields); with an external URL no link points at a name only the cluster
resolves, which a real daemon started from the rendered config shows. The
values themselves: tests/unit/test_kubesite.py; the node certificates:
tests/unit/test_kubecerts.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ncclwatch import __version__, kubecerts
from ncclwatch.cli import main
from ncclwatch.kuberender import Site, render
from tests.harness.k8s import (CERTS, CRD_SCHEMAS, K8S, NODES, VERSIONS, container_env, core,
                               https_get, layout_pki, localize, objects, one, web_login)
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

SITE = Site(namespace="gpu-mon", image="registry.example:5000/ml/ncclwatch:7.1",
            release_label="kps", external_url="https://ncclwatch.example.com",
            ingress_namespace="ingress-nginx", prometheus_namespace="observability")


@pytest.fixture(scope="module")
def k8s_pki(tmp_path_factory) -> Path:
    """A CA, a daemon certificate and one for node gpu-node-7, by the real CLI."""
    return layout_pki(tmp_path_factory.mktemp("k8s-pki"))


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


# -- writing the layout -----------------------------------------------------------------

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
        assert container_env(c)["NCCLWATCH_EXTERNAL_URL"] == \
            f"https://ncclwatch-daemon-{x}.gpu-mon.svc:7471"
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
        env = container_env(c)
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
                  env=container_env(c), name="rendered-daemon")
    try:
        deadline, metrics = time.time() + 30, ""
        while "ncclwatch_daemon_info" not in metrics and time.time() < deadline:
            assert daemon.alive(), daemon.output()[-2000:]
            try:
                metrics = https_get(http, "/metrics", k8s_pki, web_login(k8s_pki))[1]
            except OSError:
                time.sleep(0.3)
        info = next(line for line in metrics.splitlines()
                    if line.startswith("ncclwatch_daemon_info{"))
        assert 'url="https://ncclwatch.example.com"' in info, info
        assert 'runbook_base="https://ncclwatch.example.com/runbooks/"' in info, info
        status, page = https_get(http, "/", k8s_pki, web_login(k8s_pki))
        assert status == 200 and ".svc" not in page and "cluster.local" not in page
        assert https_get(http, "/", k8s_pki, None)[0] == 401           # auth stays on
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
