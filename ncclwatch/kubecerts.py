"""Node identity from cert-manager, for ``ncclwatch render kubernetes --node-certs cert-manager``.

An agent proves its node with a client certificate that names it (CN and DNS
name = the Kubernetes node name); the agent refuses another node's, and the
daemon refuses a report for any node the certificate does not name
(``tls.peer_names``). So the certificate must be issued *for the node*, and
its key must reach that node only.

Why not cert-manager's csi-driver (``csi.cert-manager.io`` volumes): the names
it puts in a certificate are templated from the pod alone (the variables
``POD_NAME``, ``POD_NAMESPACE``, ``POD_UID`` and ``SERVICE_ACCOUNT_NAME``, and
no other: its ``requestgen.expand``), never from the node the pod runs on, and a
DaemonSet's pod template is the same on every node. A certificate naming the
pod would let any agent pod report as any node.

What is rendered instead, from a list of the GPU nodes:

- a ``Certificate`` per node (``ncclwatch-node-<node>``: commonName and
  dnsNames the node's name, ``client auth``, ECDSA P-256, a new key at every
  renewal) whose Secret holds ``tls.crt``, ``tls.key`` and ``ca.crt``;
- a ``DaemonSet`` per node, the shipped one pinned to its node by name (a
  required nodeAffinity on ``metadata.name``, as the DaemonSet controller pins
  its own pods) and mounting that node's Secret where the node's
  ``/etc/ncclwatch/tls`` was. A kubelet may read only the Secrets of pods bound
  to its node (the Node authorizer), so a node's key never reaches another;
- the daemons' certificate (Secret ``ncclwatch-daemon-tls``, every Service
  name the agents, people and Prometheus use), from the same issuer, whose
  ``ca.crt`` the daemons trust for the agents;
- without ``--issuer``, a private CA: a self-signed Issuer makes the CA
  certificate ``ncclwatch-ca`` and an Issuer ``ncclwatch-ca`` signs with it.

The agents and daemons read their certificates when they start: cert-manager
renews a Secret ``RENEW_BEFORE`` ahead of its end and the kubelet updates the
mounted files, and a pod takes the new ones when it restarts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

GROUP = "cert-manager.io"
API = f"{GROUP}/v1"
CA = "ncclwatch-ca"
SELF_SIGNED = "ncclwatch-selfsigned"
DAEMON_SECRET = "ncclwatch-daemon-tls"
#: The label that tells one node's agent DaemonSet (and its pods) from another's.
NODE_LABEL = "ncclwatch.io/node"
#: Where the agent finds a node's Secret (the shipped DaemonSet's node-tls mount).
NODE_TLS = "/etc/ncclwatch/tls"
#: A year, as `ncclwatch certs` makes them; renewed a month ahead.
DURATION = "8760h"
RENEW_BEFORE = "720h"
#: cert-manager refuses a commonName longer than this (X.509's upper bound).
MAX_COMMON_NAME = 64
KEY = {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
HEADER = """\
# RENDERED by `ncclwatch render` (--node-certs cert-manager): the certificates,
# issued by cert-manager (https://cert-manager.io; its CRDs and controller must be
# installed). One per GPU node, named for the node: the agent on that node (its own
# DaemonSet in agent-daemonset.yaml) mounts it and reports as that node, and the
# daemons refuse it for any other. A node added to the cluster needs a render with
# it in --nodes. Pods read their certificate when they start: cert-manager renews
# each {renew} before it ends; restart the pods within that time
# (kubectl rollout restart) to take the new one.
"""


def node_key(node: str) -> str:
    """A node's name as part of object names and as a label value: as it is when it
    fits (no dots, 40 characters at most), else a readable part and a hash."""
    short = node.replace(".", "-")
    if short == node and len(node) <= 40:
        return node
    return short[:31].rstrip("-") + "-" + hashlib.sha256(node.encode()).hexdigest()[:8]


def node_secret(node: str) -> str:
    return f"ncclwatch-node-{node_key(node)}"


@dataclass(frozen=True)
class Issuance:
    """Who signs, and the labels every object gets."""
    labels: Mapping[str, str]
    issuer: str = ""               # "": the private CA rendered here
    issuer_kind: str = "Issuer"

    def ref(self) -> dict[str, str]:
        if self.issuer:
            return {"name": self.issuer, "kind": self.issuer_kind, "group": GROUP}
        return {"name": CA, "kind": "Issuer", "group": GROUP}

    def meta(self, name: str, component: str) -> dict[str, Any]:
        return {"name": name, "labels": {**self.labels, "app.kubernetes.io/component": component}}


def private_ca(how: Issuance) -> list[dict]:
    """A self-signed Issuer, the CA certificate it makes, and an Issuer of that CA."""
    return [
        {"apiVersion": API, "kind": "Issuer", "metadata": how.meta(SELF_SIGNED, "pki"),
         "spec": {"selfSigned": {}}},
        {"apiVersion": API, "kind": "Certificate", "metadata": how.meta(CA, "pki"),
         "spec": {"isCA": True, "commonName": "ncclwatch CA", "secretName": CA,
                  "duration": "87600h", "privateKey": dict(KEY),
                  "issuerRef": {"name": SELF_SIGNED, "kind": "Issuer", "group": GROUP}}},
        {"apiVersion": API, "kind": "Issuer", "metadata": how.meta(CA, "pki"),
         "spec": {"ca": {"secretName": CA}}},
    ]


def _certificate(how: Issuance, name: str, component: str, common_name: str,
                 dns_names: Sequence[str], usage: str, secret: str = "") -> dict:
    spec: dict[str, Any] = {"secretName": secret or name,
                            "secretTemplate": {"labels": {
                                **how.labels, "app.kubernetes.io/component": component}}}
    if len(common_name) <= MAX_COMMON_NAME:
        spec["commonName"] = common_name
    spec.update({"dnsNames": list(dns_names), "usages": ["digital signature", usage],
                 "duration": DURATION, "renewBefore": RENEW_BEFORE, "privateKey": dict(KEY),
                 "issuerRef": how.ref()})
    return {"apiVersion": API, "kind": "Certificate", "metadata": how.meta(name, component),
            "spec": spec}


def daemon_certificate(how: Issuance, hosts: Sequence[str]) -> dict:
    """The daemons' server certificate: every name in their ``allowed_hosts``."""
    return _certificate(how, "ncclwatch-daemon", "daemon", "ncclwatch-daemon", hosts,
                        "server auth", secret=DAEMON_SECRET)


def node_certificate(how: Issuance, node: str) -> dict:
    """A node's client certificate: its name, as the daemon checks it."""
    return _certificate(how, node_secret(node), "agent", node, [node], "client auth")


def certificates(how: Issuance, nodes: Sequence[str], daemon_hosts: Sequence[str]) -> list[dict]:
    """certificates.yaml's objects: the private CA (without an issuer of the site's),
    the daemons' certificate, one per node."""
    docs = [] if how.issuer else private_ca(how)
    docs.append(daemon_certificate(how, daemon_hosts))
    return docs + [node_certificate(how, n) for n in nodes]


def _pinned(ds: dict, node: str) -> dict:
    """The shipped agent DaemonSet as ``node``'s own, mounting its certificate."""
    out = json.loads(json.dumps(ds))
    key = node_key(node)
    out["metadata"]["name"] = f"{ds['metadata']['name']}-{key}"
    for labels in (out["metadata"]["labels"], out["spec"]["selector"]["matchLabels"],
                   out["spec"]["template"]["metadata"]["labels"]):
        labels[NODE_LABEL] = key
    pod = out["spec"]["template"]["spec"]
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    mounts = {m["name"]: m for c in pod["containers"] for m in c.get("volumeMounts", [])}
    if mounts.get("node-tls", {}).get("mountPath") != NODE_TLS:
        raise ValueError(f"the agent DaemonSet mounts no node-tls volume at {NODE_TLS}")
    pod["volumes"] = [v if v["name"] != "node-tls" else
                      {"name": "node-tls", "secret": {"secretName": node_secret(node),
                                                      "defaultMode": 0o400}}
                      for v in pod["volumes"]]
    files = {"NCCLWATCH_TLS_CA": "ca.crt", "NCCLWATCH_TLS_CERT": "tls.crt",
             "NCCLWATCH_TLS_KEY": "tls.key"}
    for c in pod["containers"]:
        for e in c.get("env", []):
            if e["name"] in files:
                e["value"] = f"{NODE_TLS}/{files[e['name']]}"
    return out


def per_node_agents(docs: list[dict], nodes: Sequence[str]) -> list[dict]:
    """agent-daemonset.yaml with one DaemonSet per node in place of the one."""
    keys = [node_key(n) for n in nodes]
    if len(set(keys)) != len(keys):   # two names that read alike once shortened
        raise ValueError("two node names give one object name; rename or list them apart")
    out: list[dict] = []
    for d in docs:
        if d["kind"] == "DaemonSet":
            out += [_pinned(d, n) for n in nodes]
        else:
            out.append(json.loads(json.dumps(d)))
    return out
