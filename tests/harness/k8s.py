"""The Kubernetes layout as the tests read and run it: the shipped folder, the
Kubernetes versions and the CRD fields every object is validated against, a
layout's objects by kind and name, and its pods' certificates and web login
made by the real ``ncclwatch certs`` and pointed at a test's folder.

What a layout's pods mount (the Secrets ``ncclwatch-daemon-tls`` and
``ncclwatch-daemon-web``, a node's certificate) is made by the real code
(``ncclwatch.certs``), and cert-manager's Secrets for the rendered Certificates
are issued the way its CA issuer issues them (``issue_as_cert_manager``), so a
daemon and an agent started from a layout's config run with real mTLS and auth.
"""

from __future__ import annotations

import atexit
import base64
import functools
import shutil
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import yaml

from ncclwatch import certs
from ncclwatch.kuberender import Site
from tests.harness.paths import ROOT
from tests.harness.release import build_wheel

#: The shipped layout (the single pair; its ``sharded/`` copy beneath).
K8S = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes with securityContext.appArmorProfile (the agent sets it), and the newest.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
#: Node names as a site lists them, one of each shape the rendering treats apart: plain,
#: dotted (no dot in an object's name), past cert-manager's 64-character commonName.
NODES = ("gpu-node-0", "gpu-node-1.cluster.example", "n" * 70)
#: A site with node certificates from cert-manager for ``NODES``.
CERTS = Site(node_certs="cert-manager", nodes=NODES)
#: Where the pods find their certificates -> the file `ncclwatch certs` wrote.
DAEMON_TLS = {"/etc/ncclwatch-tls/tls.crt": "daemon.pem",
              "/etc/ncclwatch-tls/tls.key": "daemon-key.pem",
              "/etc/ncclwatch-tls/ca.crt": "ca.pem"}
AGENT_TLS = {"/etc/ncclwatch/tls/ca.pem": "ca.pem", "/etc/ncclwatch/tls/node.pem": "{node}.pem",
             "/etc/ncclwatch/tls/node-key.pem": "{node}-key.pem"}
#: The Secret ncclwatch-daemon-web as `ncclwatch certs` writes its keys.
WEB_SECRET = "kubernetes/ncclwatch-daemon-web"
WEB_MOUNT = "/etc/ncclwatch-web/web.yml"
#: The node ``layout_pki`` makes a certificate for.
PKI_NODE = "gpu-node-7"
#: The site the e2e tests deploy: rendered by the wheel's ``ncclwatch render`` (outside
#: the checkout) and those very files started in the tests' kubelet. Every value a site
#: sets, none the default, so a value the wheel's render dropped shows.
SITE = Site(namespace="gpu-mon", image="registry.example/ncclwatch:7", release_label="kps",
            external_url="https://ncclwatch.example.com", ingress_namespace="ingress-nginx",
            node_certs="cert-manager", nodes=("gpu-node-0", "gpu-node-1"))


# kubernetes-validate has no CRD schemas: these are the fields of the Prometheus
# Operator's monitoring.coreos.com/v1 PodMonitor and PrometheusRule that the
# manifests use, typed as the operator's API reference documents them, with
# nothing else allowed (a misspelt field fails).
_STR = {"type": "string"}
_MAP = {"type": "object", "additionalProperties": _STR}
_META = {"type": "object", "required": ["name"], "additionalProperties": False,
         "properties": {"name": _STR, "namespace": _STR, "labels": _MAP, "annotations": _MAP}}
_SELECTOR = {"type": "object", "additionalProperties": False,
             "properties": {"matchLabels": _MAP, "matchExpressions": {"type": "array"}}}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep",
                        "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"]},
    "sourceLabels": {"type": "array", "items": {"type": "string",
                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": _STR, "targetLabel": _STR, "regex": _STR, "modulus": {"type": "integer"},
    "replacement": _STR}}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                          "(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
CRD_SCHEMAS = {
    "PodMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                   "additionalProperties": False, "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": _META,
        "spec": {"type": "object", "required": ["selector"], "additionalProperties": False,
                 "properties": {
            "selector": _SELECTOR, "jobLabel": _STR,
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _STR}}},
            "podMetricsEndpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": _STR, "path": _STR, "scheme": {"enum": ["http", "https"]},
                    "interval": _DURATION, "scrapeTimeout": _DURATION,
                    "honorLabels": {"type": "boolean"},
                    "tlsConfig": {"type": "object", "additionalProperties": False,
                                  "properties": {
                        "ca": {"type": "object", "additionalProperties": False, "properties": {
                            "secret": {"type": "object", "required": ["name", "key"],
                                       "additionalProperties": False,
                                       "properties": {"name": _STR, "key": _STR}}}},
                        "serverName": _STR, "insecureSkipVerify": {"type": "boolean"}}},
                    # The Operator's BasicAuth: SecretKeySelectors (name, key, optional).
                    "basicAuth": {"type": "object", "additionalProperties": False,
                                  "required": ["username", "password"], "properties": {
                        part: {"type": "object", "required": ["name", "key"],
                               "additionalProperties": False,
                               "properties": {"name": _STR, "key": _STR,
                                              "optional": {"type": "boolean"}}}
                        for part in ("username", "password")}},
                    "relabelings": {"type": "array", "items": _RELABEL},
                    "metricRelabelings": {"type": "array", "items": _RELABEL}}}}}}}},
    "PrometheusRule": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                       "additionalProperties": False, "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "properties": {
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                    "limit": {"type": "integer"}, "labels": _MAP,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": _STR, "record": _STR,
                            "expr": {"anyOf": [_STR, {"type": "integer"}]},
                            "for": _DURATION, "keep_firing_for": _DURATION,
                            "labels": _MAP, "annotations": _MAP}}}}}}}}}},
}


_POD_ENDPOINT = CRD_SCHEMAS["PodMonitor"]["properties"]["spec"]["properties"][
    "podMetricsEndpoints"]
CRD_SCHEMAS["ServiceMonitor"] = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False, "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": _META,
        "spec": {"type": "object", "required": ["selector", "endpoints"],
                 "additionalProperties": False, "properties": {
            "selector": _SELECTOR, "jobLabel": _STR,
            "namespaceSelector": CRD_SCHEMAS["PodMonitor"]["properties"]["spec"]["properties"][
                "namespaceSelector"],
            "endpoints": _POD_ENDPOINT}}}}

# cert-manager's cert-manager.io/v1 Certificate and Issuer (`ncclwatch render
# --node-certs cert-manager`): the fields the rendered objects use, typed and
# enumerated as cert-manager's CRDs (deploy/crds/cert-manager.io_certificates.yaml,
# _issuers.yaml) declare them, with nothing else allowed (the API server's strict
# field validation refuses an unknown field), and what its webhook checks beyond
# the CRD: a commonName of 64 characters at most, one name at least, one kind of
# issuer per Issuer.
_GO_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"}
_DNS_SUBDOMAIN = {"type": "string", "maxLength": 253,
                  "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_STRS = {"type": "array", "items": _STR}
KEY_USAGES = ["signing", "digital signature", "content commitment", "key encipherment",
              "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
              "decipher only", "any", "server auth", "client auth", "code signing",
              "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
              "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]
_CM_META = {**_META, "properties": {**_META["properties"], "name": _DNS_SUBDOMAIN}}
CRD_SCHEMAS["Certificate"] = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False, "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Certificate"},
        "metadata": _CM_META,
        "spec": {"type": "object", "required": ["issuerRef", "secretName"],
                 "additionalProperties": False,
                 "anyOf": [{"required": [k]} for k in ("commonName", "dnsNames", "uris",
                                                       "ipAddresses", "emailAddresses")],
                 "properties": {
            "secretName": _DNS_SUBDOMAIN,
            "secretTemplate": {"type": "object", "additionalProperties": False,
                               "properties": {"labels": _MAP, "annotations": _MAP}},
            "commonName": {"type": "string", "maxLength": 64},
            "dnsNames": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "ipAddresses": _STRS, "uris": _STRS, "emailAddresses": _STRS,
            "isCA": {"type": "boolean"},
            "usages": {"type": "array", "items": {"enum": KEY_USAGES}},
            "duration": _GO_DURATION, "renewBefore": _GO_DURATION,
            "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "encoding": {"enum": ["PKCS1", "PKCS8"]},
                "rotationPolicy": {"enum": ["Never", "Always"]},
                "size": {"type": "integer"}}},
            "issuerRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                          "properties": {"name": _STR, "kind": _STR, "group": _STR}}}}}}
_CRL = {"crlDistributionPoints": _STRS}
CRD_SCHEMAS["Issuer"] = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False, "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Issuer"},
        "metadata": _CM_META,
        "spec": {"type": "object", "additionalProperties": False, "minProperties": 1,
                 "maxProperties": 1, "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False, "properties": _CRL},
            "ca": {"type": "object", "required": ["secretName"], "additionalProperties": False,
                   "properties": {"secretName": _DNS_SUBDOMAIN, "ocspServers": _STRS,
                                  "issuingCertificateURLs": _STRS, **_CRL}},
            "acme": {"type": "object"}, "vault": {"type": "object"},
            "venafi": {"type": "object"}}}}}


def core(obj: dict) -> bool:
    """A Kubernetes object kubernetes-validate knows (not a CRD's)."""
    return not obj["apiVersion"].startswith("monitoring.coreos.com/")


def objects(files: dict[str, str]) -> list[dict]:
    """The objects of a layout's files (name -> text, as ``render`` returns them)."""
    return [d for name, text in files.items() if name != "kustomization.yaml"
            for d in yaml.safe_load_all(text) if d]


def one(files: dict[str, str], kind: str, name: str) -> dict:
    """The one object of ``kind`` named ``name`` among a layout's files."""
    found = [d for d in objects(files) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def container_env(container: dict) -> dict[str, str]:
    """A container's env by name (a ``valueFrom`` one as "")."""
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# -- certificates as the layout mounts them ----------------------------------------

def layout_pki(out: Path) -> Path:
    """A CA, a daemon certificate and one for node ``PKI_NODE`` in ``out``, with the
    Secrets' files, by the real ``ncclwatch certs`` code."""
    certs.make(out, ["localhost", "ncclwatch-daemon"], [PKI_NODE])
    return out


def localize(toml: str, cm: dict, pki: Path, folder: Path) -> str:
    """The ConfigMap's daemon.toml with the pods' paths pointed at ``pki``
    (the Secrets' files, as `ncclwatch certs` wrote them) and ``folder``."""
    assert "web.yml" not in cm["data"], "web.yml holds password hashes: a Secret, not this"
    web = (pki / WEB_SECRET / "web.yml").read_text()
    for mounted, name in DAEMON_TLS.items():
        toml, web = toml.replace(mounted, str(pki / name)), web.replace(mounted, str(pki / name))
    (folder / "web.yml").write_text(web)
    assert WEB_MOUNT in toml
    return toml.replace(WEB_MOUNT, str(folder / "web.yml"))


def web_login(pki: Path) -> str:
    """user:password of the Secret, as the PodMonitor hands them to Prometheus."""
    return ((pki / WEB_SECRET / "username").read_text() + ":"
            + (pki / WEB_SECRET / "password").read_text())


def agent_tls_env(env: dict[str, str], pki: Path, node: str) -> dict[str, str]:
    """The DaemonSet's env with its mounted certificate paths pointed at ``node``'s in ``pki``."""
    return {k: str(pki / AGENT_TLS[v].format(node=node)) if v in AGENT_TLS else v
            for k, v in env.items()}


def issue_as_cert_manager(cert: dict, out: Path, ca_dir: Path) -> dict[str, bytes]:
    """The Secret a cert-manager CA issuer writes for ``cert``: tls.crt (the names and
    usage the Certificate asks for), tls.key, ca.crt; by the real `ncclwatch certs` code."""
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


# -- the layout as the wheel renders it, no checkout ----------------------------------

def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{argv}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@functools.cache
def wheel_prefix() -> tuple[Path, Path]:
    """This checkout's wheel, built as a release is (``python -m build --wheel
    --no-isolation``, from a copy: setuptools leaves build/ and *.egg-info behind) and
    installed without dependencies into a prefix of its own; once a session (about
    10 s). Returns (the prefix, its site-packages)."""
    tmp = Path(tempfile.mkdtemp(prefix="ncclwatch-wheel-"))
    atexit.register(shutil.rmtree, tmp, True)
    wheel = build_wheel(tmp)
    prefix = tmp / "prefix"
    # --ignore-installed: never touch this venv's own (editable) install of ncclwatch,
    # which pip would otherwise uninstall before installing the wheel in the prefix.
    _run([sys.executable, "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps",
          "--no-index", "--prefix", str(prefix), str(wheel)])
    site_packages = sysconfig.get_path("purelib", vars={"base": str(prefix),
                                                        "platbase": str(prefix)})
    return prefix, Path(site_packages)


def render_from_wheel(site: Site, kind: str, out: Path) -> dict[str, str]:
    """``ncclwatch render KIND --out OUT`` with ``site``'s flags, run from the wheel's
    prefix with ``python -S`` in an empty folder outside the checkout (no site: the
    venv's editable install of the checkout is not on the path, only its dependencies'
    folder): the files it wrote, name -> text. Fails unless ncclwatch came from the prefix."""
    prefix, site_packages = wheel_prefix()
    deps = sysconfig.get_path("purelib")          # this venv's: yaml and the rest
    work = Path(tempfile.mkdtemp(prefix="ncclwatch-elsewhere-"))
    try:
        code = ("import sys; sys.path[:0] = sys.argv[1:3]; import ncclwatch; "
                "print(ncclwatch.__file__, file=sys.stderr); from ncclwatch.cli import main; "
                "sys.exit(main(sys.argv[3:]))")
        run = _run([sys.executable, "-S", "-c", code, str(site_packages), deps, "render", kind,
                    "--out", str(out), *site.flags()], cwd=work, env={"PATH": "/usr/bin:/bin"})
    finally:
        work.rmdir()
    assert run.stderr.splitlines()[0].startswith(str(prefix)), run.stderr   # not the checkout
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


# -- a daemon of the layout over HTTPS ----------------------------------------------

def https_context(pki: Path) -> ssl.SSLContext:
    """A client context that trusts ``pki``'s CA."""
    return ssl.create_default_context(cafile=str(pki / "ca.pem"))


def https_get(port: int, path: str, pki: Path, login: str | None) -> tuple[int, str]:
    """(status, body) of GET ``path`` from a daemon on localhost:``port``, as ``login``."""
    req = urllib.request.Request(f"https://localhost:{port}{path}")
    if login:
        req.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5, context=https_context(pki)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def scrape_metrics(port: int, pki: Path) -> str:
    """/metrics as the PodMonitor scrapes it: the Secret's user and password ("" while
    the daemon does not answer)."""
    try:
        return https_get(port, "/metrics", pki, web_login(pki))[1]
    except OSError:
        return ""
