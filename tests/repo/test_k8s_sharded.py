"""deploy/kubernetes/sharded: the layout for shards of daemon pairs, as applied.

Every object against the Kubernetes schemas (offline) and the PodMonitor
against its CRD's fields; the four daemons, each Service selecting exactly
its own; the shard map the daemons load and the agents' collectors naming
the same Services in the same order; and the agent run for real with the
DaemonSet's environment against four real daemons started from the ConfigMap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy import generate
from ncclwatch import kuberender
from ncclwatch.cli import AGENT_OPTIONS, DAEMON_OPTIONS, _shard_map, build_parser
from ncclwatch.config import load_file, resolve
from ncclwatch.shard import shard_list
from tests.harness.k8s import (CRD_SCHEMAS, K8S, VERSIONS, agent_tls_env, core, layout_pki,
                               localize, scrape_metrics)
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

SHARDED = K8S / "sharded"
N = generate.SHARD_COUNT


def objects() -> list[dict]:
    return [d for f in sorted(SHARDED.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]


def one(kind: str, name: str) -> dict:
    found = [d for d in objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _selected(selector: dict) -> list[str]:
    return [d["metadata"]["name"] for d in objects() if d["kind"] == "Deployment"
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]


def _daemons() -> list[str]:
    return [f"ncclwatch-daemon-{k}{x}" for k in range(N) for x in "ab"]


def test_the_sharded_layout_is_generated_and_complete() -> None:
    assert not [n for n in generate.stale() if n.startswith("sharded/")]
    k = yaml.safe_load((SHARDED / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(
        f.name for f in SHARDED.glob("*.yaml") if f.name != "kustomization.yaml")
    assert k["namespace"] == one("Namespace", "ncclwatch")["metadata"]["name"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(version: str) -> None:
    checked = 0
    for obj in objects():
        if core(obj):
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
        else:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
    assert checked >= 16, checked


def test_each_daemon_has_its_own_service_and_pairs_differ_only_in_shard_and_letter() -> None:
    deps = sorted(d["metadata"]["name"] for d in objects() if d["kind"] == "Deployment")
    assert deps == _daemons()
    ref = json.dumps(one("Deployment", "ncclwatch-daemon-0a"))
    for k in range(N):
        for x in "ab":
            name = f"ncclwatch-daemon-{k}{x}"
            dep = json.dumps(one("Deployment", name))
            assert dep == (ref.replace("ncclwatch-daemon-0a", name)
                           .replace('"ncclwatch.io/replica": "a"', f'"ncclwatch.io/replica": "{x}"')
                           .replace('"ncclwatch.io/shard": "0"', f'"ncclwatch.io/shard": "{k}"')
                           .replace('"NCCLWATCH_SHARD", "value": "0"',
                                    f'"NCCLWATCH_SHARD", "value": "{k}"'))
            svc = one("Service", name)
            assert _selected(svc["spec"]["selector"]) == [name]  # never another shard's
    assert sorted(_selected(one("Service", "ncclwatch-daemon")["spec"]["selector"])) == _daemons()


def _daemon_cfg(name: str, toml: Path) -> dict:
    c = one("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    cfg = resolve(DAEMON_OPTIONS, args, load_file(str(toml), None), env=env)
    cfg["web"] = None
    return cfg


def test_daemons_and_agents_name_the_same_shards_in_the_same_order(tmp_path: Path) -> None:
    toml = tmp_path / "daemon.toml"
    toml.write_text(one("ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"])
    services = {s["metadata"]["name"]: {p["name"]: p["port"] for p in s["spec"]["ports"]}
                for s in objects() if s["kind"] == "Service"}
    c = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    collector = shard_list(resolve(AGENT_OPTIONS, build_parser().parse_args(c["args"]), {},
                                   env=env)["collector"])
    assert len(collector) == N
    for k in range(N):
        for x, target in zip("ab", collector[k]):
            host, port = target.rsplit(":", 1)
            assert host == f"ncclwatch-daemon-{k}{x}" and services[host]["grpc"] == int(port)
        for x in "ab":
            shards = _shard_map(_daemon_cfg(f"ncclwatch-daemon-{k}{x}", toml))
            assert shards.index == k and len(shards.urls) == N
            for j, group in enumerate(shards.urls):
                for y, url in zip("ab", group):
                    host, port = url.removeprefix("https://").rsplit(":", 1)
                    assert host.split(".")[0] == f"ncclwatch-daemon-{j}{y}"
                    assert services[host.split(".")[0]]["http"] == int(port)


def test_network_policy_covers_every_shards_daemons() -> None:
    np = one("NetworkPolicy", "ncclwatch-daemon")["spec"]
    assert sorted(_selected(np["podSelector"]["matchLabels"])) == _daemons()
    assert {r["ports"][0]["port"] for r in np["ingress"]} == {"grpc", "http"}


def test_every_daemon_answers_its_services_names() -> None:
    """The shard map's URLs (https) name hosts the daemons' allowlist serves."""
    toml = one("ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"]
    daemons = [f"ncclwatch-daemon-{k}{x}" for k in range(N) for x in "ab"]
    allowed = kuberender.allowed_hosts(kuberender.Site(), daemons, N)
    hosts = set(allowed.split(","))
    assert f'allowed_hosts = "{allowed}"' in toml
    for group in kuberender.shard_urls(kuberender.Site(), N):
        for url in group:
            assert url.startswith("https://") and url.split("//")[1].rsplit(":", 1)[0] in hosts


def test_every_daemon_links_through_its_own_service() -> None:
    """Each daemon's external URL is its own Service, the URL the shard map names."""
    shard_urls = kuberender.shard_urls(kuberender.Site(), N)
    urls = [u for group in shard_urls for u in group]
    for k in range(N):
        for x in "ab":
            (c,) = one("Deployment", f"ncclwatch-daemon-{k}{x}")["spec"]["template"]["spec"][
                "containers"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["NCCLWATCH_EXTERNAL_URL"] == shard_urls[k]["ab".index(x)]
            assert env["NCCLWATCH_EXTERNAL_URL"] in urls and env["NCCLWATCH_SHARD"] == str(k)


def test_podmonitor_labels_every_daemon_with_its_shard() -> None:
    pm = one("PodMonitor", "ncclwatch-daemon")["spec"]
    assert sorted(_selected(pm["selector"]["matchLabels"])) == _daemons()
    (ep,) = pm["podMetricsEndpoints"]
    relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
    (source,) = relabel["shard"]["sourceLabels"]
    assert source == "__meta_kubernetes_pod_label_" + generate.SHARD_LABEL.replace(
        ".", "_").replace("/", "_")
    assert "replica" in relabel and relabel["job"]["replacement"] == "ncclwatch"


@pytest.fixture(scope="module")
def k8s_pki(tmp_path_factory) -> Path:
    """A CA, a daemon certificate and one for node gpu-node-7, by the real CLI."""
    return layout_pki(tmp_path_factory.mktemp("k8s-pki"))


def test_agent_with_the_daemonsets_env_reports_to_every_shard(tmp_path: Path, k8s_pki) -> None:
    """Four real daemons from the ConfigMap and their Deployments' env, the
    Services' names pointed at loopback; one real agent with the DaemonSet's
    env: every daemon of every shard hears the node."""
    c = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    env["NCCLWATCH_NODE"] = "gpu-node-7"
    env = agent_tls_env(env, k8s_pki, "gpu-node-7")
    env["NCCLWATCH_ALIVE_FILE"] = str(tmp_path / "alive")   # the pod's /tmp/alive
    cm = one("ConfigMap", "ncclwatch-daemon")
    toml = localize(cm["data"]["daemon.toml"], cm, k8s_pki, tmp_path)
    procs, http = [], {}
    try:
        for name in _daemons():
            grpc, http[name] = free_port(), free_port()
            path = tmp_path / f"{name}.toml"
            path.write_text(toml.replace("0.0.0.0:7470", f"127.0.0.1:{grpc}")
                            .replace("0.0.0.0:7471", f"127.0.0.1:{http[name]}"))
            dep = one("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
            procs.append(Proc([need("ncclwatch"), "daemon", "--config", str(path)],
                              env={e["name"]: e["value"] for e in dep.get("env", [])},
                              name=name))
            env["NCCLWATCH_COLLECTOR"] = env["NCCLWATCH_COLLECTOR"].replace(
                f"{name}:7470", f"127.0.0.1:{grpc}")
        agent = Proc([need("ncclwatch"), *c["args"]], env=env, name="agent")
        procs.append(agent)
        want = 'ncclwatch_agent_up{node="gpu-node-7"} 1.0'
        deadline = time.time() + 60
        while time.time() < deadline and not all(want in scrape_metrics(p, k8s_pki)
                                                 for p in http.values()):
            assert agent.alive(), agent.output()[-2000:]
            time.sleep(0.5)
        for name, port in http.items():
            assert want in scrape_metrics(port, k8s_pki), (name, agent.output()[-2000:])
    finally:
        for proc in procs:
            proc.stop()
