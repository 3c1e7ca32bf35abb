"""A site's values for the Kubernetes layout (``ncclwatch render``), and the names they decide.

Each value is a field of ``Site``, declared once with its flag, ``NCCLWATCH_*``
variable and TOML key (``config.option``); its parser says why a value cannot
be. ``check`` refuses values that do not go together; the functions below
``Site`` derive what the layout names from them: each daemon's URL (its
Service's in-cluster name, or the external URL people reach), the runbooks'
URL, the hosts the daemons answer. Every default gives the shipped layout.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from ncclwatch import __version__
from ncclwatch.config import boolean, option, options_of, positive_int

HTTP_PORT = 7471
KINDS = ("kubernetes", "kubernetes-sharded")

# -- the site's values ------------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](@sha256:[0-9a-f]{64})?$")


class Invalid(argparse.ArgumentTypeError, ValueError):
    """A value that cannot be (argparse shows its message for a flag; config.resolve names
    the variable or the file for the others)."""


def dns_label(v: Any) -> str:
    """A namespace's name (RFC 1123 label): lower-case letters, digits, '-'."""
    s = str(v).strip()
    if s and not _DNS_LABEL.match(s):
        raise Invalid(f"{s!r} is not a Kubernetes namespace name (a-z, 0-9, '-', <= 63)")
    return s


def label_value(v: Any) -> str:
    s = str(v).strip()
    if not _LABEL_VALUE.match(s) or len(s) > 63:
        raise Invalid(f"{s!r} is not a Kubernetes label value")
    return s


def image_ref(v: Any) -> str:
    s = str(v).strip()
    if s and not _IMAGE.match(s):
        raise Invalid(f"{s!r} is not an image reference (REGISTRY/NAME[:TAG][@sha256:...])")
    return s


def external(v: Any) -> str:
    """An http(s) URL of a host people reach ({shard} stands for a shard's number)."""
    s = str(v).strip().rstrip("/")
    if not s:
        return s
    parts = urlsplit(s.replace("{shard}", "0"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"{s!r} is not an http:// or https:// URL")
    if parts.path or parts.query or parts.fragment or parts.username:
        raise Invalid(f"{s!r}: give the scheme, host and port only: the daemon serves "
                         "its page at / (a path prefix would break its links)")
    return s


def node_names(v: Any) -> tuple[str, ...]:
    """Kubernetes node names: a list, or 'a,b,c'; 'node/NAME' as `kubectl get -o name`
    prints it is NAME."""
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for item in items:
        name = str(item).strip().removeprefix("node/")
        if not name:
            continue
        if not _DNS_NAME.match(name):
            raise Invalid(f"{name!r} is not a Kubernetes node name")
        out.append(name)
    return tuple(dict.fromkeys(out))


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = str(v).strip()
        if s not in allowed:
            raise Invalid(f"{s!r}: one of {', '.join(allowed)}")
        return s
    parse.__name__ = "one of " + "|".join(allowed)
    return parse


@dataclass(frozen=True)
class Site:
    """A site's values for the layout; every default gives the shipped files."""
    namespace: str = option("ncclwatch", "namespace of the daemons and agents", dns_label, "NS")
    image: str = option("", "the image the pods run, REGISTRY/NAME[:TAG] (the tag defaults to "
                        f"this release; empty: ncclwatch:{__version__} as shipped)", image_ref,
                        "IMAGE")
    release_label: str = option(
        "", "label the PodMonitor (or ServiceMonitor) and the PrometheusRule release=NAME, as "
        "a Prometheus that selects by label wants (kube-prometheus-stack: its Helm release)",
        label_value, "NAME")
    service_monitor: bool = option(
        False, "scrape the daemons' own Services with a ServiceMonitor instead of the pods with "
        "the PodMonitor (the same job, replica label, TLS and interval)", boolean)
    external_url: str = option(
        "", "URL people reach the daemons at (an Ingress; like Prometheus's --web.external-url): "
        "every link in alerts, pages and runbooks uses it instead of the Services' in-cluster "
        "names; kubernetes-sharded: one per shard, '{shard}' standing for its number",
        external, "URL")
    ingress_namespace: str = option(
        "", "namespace of the ingress controller: its pods may reach the daemons' HTTP port "
        "(NetworkPolicy, by the namespace's kubernetes.io/metadata.name label)", dns_label, "NS")
    prometheus_namespace: str = option(
        "monitoring", "namespace of the Prometheus that scrapes the daemons (NetworkPolicy)",
        dns_label, "NS")
    shard_count: int = option(2, "kubernetes-sharded: shards of daemon pairs", positive_int, "N")
    node_certs: str = option(
        "host", "where each agent's node certificate comes from: host (the node's "
        "/etc/ncclwatch/tls, put there by your provisioning) or cert-manager (a Certificate "
        "per node of --nodes, mounted by that node's own agent DaemonSet)",
        choice("host", "cert-manager"), "FROM")
    nodes: tuple = option((), "--node-certs cert-manager: the GPU nodes, comma-separated "
                          "(node/NAME as `kubectl get nodes -o name` prints it is NAME)",
                          node_names, "NODE[,NODE]")
    nodes_file: str = option("", "--node-certs cert-manager: a file of node names, one a line "
                             "(`kubectl get nodes -l nvidia.com/gpu.present=true -o name`)",
                             metavar="FILE")
    issuer: str = option(
        "", "--node-certs cert-manager: the cert-manager issuer of every certificate (its CA in "
        "the Secrets' ca.crt, as a CA or Vault issuer puts it); empty: a private CA rendered "
        "here (a self-signed Issuer that makes the CA ncclwatch-ca, and an Issuer of it)",
        metavar="NAME")
    issuer_kind: str = option("Issuer", "kind of --issuer: Issuer (in the namespace) or "
                              "ClusterIssuer", choice("Issuer", "ClusterIssuer"), "KIND")

    def flags(self) -> list[str]:
        """The command-line flags that give these values (the defaults left out)."""
        out: list[str] = []
        for o in options_of(Site):
            value = getattr(self, o.name)
            if value == o.default:
                continue
            if o.type is boolean:
                out.append(o.flag)
            else:
                out += [o.flag, ",".join(value) if isinstance(value, tuple) else str(value)]
        return out


SITE_OPTIONS = options_of(Site)


class SiteError(ValueError):
    """Values that do not go together (the message names the options)."""


def all_nodes(site: Site) -> tuple[str, ...]:
    listed = list(site.nodes)
    if site.nodes_file:
        try:
            text = Path(site.nodes_file).read_text()
        except OSError as e:
            raise SiteError(f"--nodes-file {site.nodes_file}: {e.strerror}") from None
        try:
            listed += node_names([ln.split("#")[0] for ln in text.splitlines()])
        except ValueError as e:
            raise SiteError(f"--nodes-file {site.nodes_file}: {e}") from None
    return tuple(dict.fromkeys(listed))


def check(site: Site, kind: str) -> None:
    """SiteError where the values do not go together for ``kind``."""
    sharded = kind == "kubernetes-sharded"
    if "{shard}" in site.external_url and not sharded:
        raise SiteError("--external-url: '{shard}' is for kubernetes-sharded")
    if sharded and site.external_url and site.shard_count > 1 \
            and "{shard}" not in site.external_url:
        raise SiteError("--external-url: each shard's daemons are reached at their own URL "
                        "(a job's page is on its shard): put '{shard}' in it, e.g. "
                        "https://ncclwatch-{shard}.example.com")
    if site.shard_count != 2 and not sharded:
        raise SiteError("--shard-count is for kubernetes-sharded")
    nodes = all_nodes(site)
    if site.node_certs == "cert-manager" and not nodes:
        raise SiteError("--node-certs cert-manager needs the nodes: --nodes or --nodes-file")
    if site.node_certs != "cert-manager" and (nodes or site.issuer
                                              or site.issuer_kind != "Issuer"):
        raise SiteError("--nodes, --nodes-file and --issuer go with --node-certs cert-manager")
    if site.issuer_kind == "ClusterIssuer" and not site.issuer:
        raise SiteError("--issuer-kind ClusterIssuer names an issuer: give --issuer")


# -- names the site's values decide ---------------------------------------------------

def service_url(name: str, namespace: str) -> str:
    return f"https://{name}.{namespace}.svc:{HTTP_PORT}"


def shard_daemon(k: int, letter: str) -> str:
    return f"ncclwatch-daemon-{k}{letter}"


def daemon_url(site: Site, name: str, shard: int | None = None) -> str:
    """Where people reach one daemon: the external URL (its shard's), else its Service."""
    if site.external_url:
        return site.external_url.replace("{shard}", str(shard or 0))
    return service_url(name, site.namespace)


def runbooks_url(site: Site) -> str:
    """The rules' runbook link with no daemon seen in a week: through any daemon."""
    return daemon_url(site, "ncclwatch-daemon") + "/runbooks/"


def external_hosts(site: Site, shards: int = 1) -> list[str]:
    if not site.external_url:
        return []
    return list(dict.fromkeys(urlsplit(site.external_url.replace("{shard}", str(k))).hostname
                              for k in range(shards)))


def allowed_hosts(site: Site, daemons: Sequence[str], shards: int = 1) -> str:
    """The daemons' ``allowed_hosts``: localhost, the Services' names, the external host."""
    ns = site.namespace
    names = ["localhost", "ncclwatch-daemon", f"ncclwatch-daemon.{ns}",
             f"ncclwatch-daemon.{ns}.svc"]
    for d in daemons:
        names += [d, f"{d}.{ns}.svc"]
    return ",".join(names + external_hosts(site, shards))
