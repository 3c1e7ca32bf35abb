"""The layout the wheel renders for the tests' site (``tests/harness/k8s.py``: ``SITE``,
``render_from_wheel``: no checkout, the files ``tests/e2e/test_render_from_wheel.py``
checks) run as a kubelet would (``tests/harness/kubelet.py``), with the
Secrets cert-manager writes for its Certificates and nothing made by hand on the
node: the daemon pod from the rendered Deployment and ConfigMap, the agent pod of
this node's own DaemonSet with its node's Secret mounted (``tls.crt``,
``tls.key``, ``ca.crt``), mTLS between them, auth on for the page, the API and
/metrics, and the links the external URL. The image is this machine's root
(``host_image``): the image itself is ``tests/e2e/test_image.py``'s.
"""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path

import pytest
import yaml

from ncclwatch import kubecerts
from ncclwatch.certs import Issued, web_auth
from tests.harness.k8s import SITE, issue_as_cert_manager, one, render_from_wheel
from tests.harness.kubelet import Kubelet, Netns, config_map, host_image
from tests.harness.paths import ARTIFACTS, ROOT
from tests.harness.tools import need_system

pytestmark = pytest.mark.e2e

NODE, OTHER = SITE.nodes
EXTERNAL = SITE.external_url


def _checkout_visible(pod: dict) -> dict:
    """The pod spec with this checkout (and its venv) bound in over the pod's own
    mounts: a clone under /tmp is hidden by the pods' /tmp emptyDir ("/usr/bin/env:
    .../.venv/bin/ncclwatch: No such file"). The image stands in for the real one,
    which carries its venv; the test is about the certificates, the login and the
    node identity."""
    paths = [str(ROOT.resolve())]   # make test's venv is ROOT/.venv
    pod.setdefault("volumes", []).extend(
        {"name": f"checkout-{i}", "hostPath": {"path": p}} for i, p in enumerate(paths))
    for c in pod.get("containers", []):
        c.setdefault("volumeMounts", []).extend(
            {"name": f"checkout-{i}", "mountPath": p, "readOnly": True}
            for i, p in enumerate(paths))
    return pod


def _pod_of(files: dict[str, str], node: str) -> dict:
    """The pod template of the agent DaemonSet pinned to ``node``."""
    for d in yaml.safe_load_all(files["agent-daemonset.yaml"]):
        if d and d["kind"] == "DaemonSet":
            terms = d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            if terms[0]["matchFields"][0]["values"] == [node]:
                return d["spec"]["template"]["spec"]
    raise KeyError(node)


def test_the_rendered_layout_runs_with_cert_managers_secrets(tmp_path: Path) -> None:
    need_system("ip", "iproute2")
    files = render_from_wheel(SITE, "kubernetes", tmp_path / "layout")
    # The Secrets, as cert-manager's CA issuer writes them for the rendered Certificates.
    ca = tmp_path / "ca"
    secrets = {"ncclwatch-daemon-tls": issue_as_cert_manager(
        one(files, "Certificate", "ncclwatch-daemon"), tmp_path / "daemon", ca)}
    for node in (NODE, OTHER):
        name = kubecerts.node_secret(node)
        secrets[name] = issue_as_cert_manager(one(files, "Certificate", name),
                                              tmp_path / node, ca)
    (tmp_path / "web").mkdir()
    web_auth(tmp_path / "web", Issued(tmp_path / "daemon" / "tls.pem",
                                      tmp_path / "daemon" / "tls-key.pem"))
    web = tmp_path / "web" / "kubernetes" / "ncclwatch-daemon-web"
    secrets["ncclwatch-daemon-web"] = {f.name: f.read_bytes() for f in web.iterdir()}
    login = f"{(web / 'username').read_text()}:{(web / 'password').read_text()}"
    (tmp_path / "ca.crt").write_bytes(secrets["ncclwatch-daemon-tls"]["ca.crt"])
    pod_logs = tmp_path / "var-log-pods"
    pod_logs.mkdir()
    daemon_docs = [d for d in yaml.safe_load_all(files["daemon.yaml"]) if d]
    daemon_pod = next(d for d in daemon_docs if d["kind"] == "Deployment"
                      and d["metadata"]["name"] == "ncclwatch-daemon-a")["spec"]["template"]["spec"]
    pods = []
    with host_image(tmp_path / "image", ROOT / ".venv") as image, \
            Netns(f"ncw-rnd-{uuid.uuid4().hex[:8]}") as net:
        kubelet = Kubelet(
            image, tmp_path / "pods", net, NODE,
            hosts={"ncclwatch-daemon-a": "127.0.0.1", "ncclwatch-daemon-b": "127.0.0.2"},
            host_paths={"/var/log/pods": str(pod_logs)},
            config_maps={"ncclwatch-daemon": config_map(daemon_docs, "ncclwatch-daemon")},
            secrets=secrets)
        start = functools.partial(kubelet.start, namespace=SITE.namespace)
        try:
            daemon = start(_checkout_visible(daemon_pod), "ncclwatch-daemon-a-0")
            pods.append(daemon)
            deadline = time.time() + 90
            while not daemon.probe("readinessProbe", net):
                assert daemon.proc.alive() and time.time() < deadline, daemon.proc.output()
                time.sleep(0.5)
            agent = start(_checkout_visible(_pod_of(files, NODE)),
                                  f"ncclwatch-agent-{uuid.uuid4().hex[:5]}")
            pods.append(agent)
            # Auth on: nobody reads the API or /metrics without the Secret's password.
            api, ca_file = "https://localhost:7471/api/v1/jobs", str(tmp_path / "ca.crt")
            assert net.fetch(api, cafile=ca_file)[0] == 401
            assert net.fetch(api, cafile=ca_file, login="ncclwatch:guess")[0] == 401
            # The agent is its node: mTLS with the node's Secret, as the node's name.
            want, metrics = f'ncclwatch_agent_up{{node="{NODE}"}} 1.0', ""
            deadline = time.time() + 90
            while want not in metrics and time.time() < deadline:
                assert agent.proc.alive(), agent.proc.output()[-3000:]
                status, metrics = net.fetch("https://localhost:7471/metrics", cafile=ca_file,
                                            login=login)
                assert status == 200, (status, metrics[:500])
                time.sleep(1)
            assert want in metrics, f"{daemon.proc.output()[-3000:]}\n{agent.proc.output()[-3000:]}"
            assert f'url="{EXTERNAL}"' in metrics and f'runbook_base="{EXTERNAL}/runbooks/"' \
                in metrics
            assert agent.probe("livenessProbe", net)
            # Another node's DaemonSet (its Secret) on this node: the agent will not start.
            stray = start(_checkout_visible(_pod_of(files, OTHER)), "ncclwatch-agent-stray")
            pods.append(stray)
            deadline = time.time() + 60
            while stray.proc.alive() and time.time() < deadline:
                time.sleep(0.5)
            assert not stray.proc.alive()
            assert f"is for '{OTHER}', but this agent reports as --node '{NODE}'" \
                in stray.proc.output()
            assert daemon.proc.alive() and agent.proc.alive()
        finally:
            for pod in reversed(pods):
                pod.proc.stop()
                ARTIFACTS.mkdir(exist_ok=True)
                (ARTIFACTS / f"rendered-{pod.name}.log").write_text(pod.proc.output())
