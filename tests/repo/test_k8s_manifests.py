"""deploy/kubernetes: every manifest against the Kubernetes schemas (kubernetes-validate,
offline), the Prometheus Operator objects against the fields of their CRDs, the
generated copies of the rules and dashboards, and the security context the
deployment docs describe (docs/_incoming/i19-deploy.md)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy import generate
from ncclwatch import kuberender
from ncclwatch.cli import AGENT_OPTIONS, DAEMON_OPTIONS, build_parser
from ncclwatch.config import load_file, resolve
from tests.harness.k8s import (AGENT_TLS, CRD_SCHEMAS, DAEMON_TLS, K8S, VERSIONS, WEB_MOUNT,
                               WEB_SECRET, agent_tls_env, core, https_context, https_get,
                               layout_pki, localize, scrape_metrics, web_login)
from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

UNIT = ROOT / "systemd" / "ncclwatch-agent.service"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def objects() -> list[tuple[str, dict]]:
    return [(f.name, d) for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in docs(f.name)]


def one(kind: str, name: str) -> dict:
    found = [d for _, d in objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


# -- schemas ----------------------------------------------------------------------

def test_kustomization_lists_every_manifest() -> None:
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(k["resources"]) == sorted(on_disk)
    assert k["namespace"] == one("Namespace", "ncclwatch")["metadata"]["name"]
    assert [i["name"] for i in k["images"]] == ["ncclwatch"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_core_manifest_validates_strictly(version: str) -> None:
    checked = 0
    for name, obj in objects():
        if core(obj):
            kubernetes_validate.validate(obj, version, strict=True)  # raises with the path
            checked += 1
    assert checked >= 12, checked


def test_validation_catches_a_broken_manifest() -> None:
    """The check above can fail: an unknown field and a wrong type are errors."""
    ds = copy.deepcopy(one("DaemonSet", "ncclwatch-agent"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilitiez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)
    ds = copy.deepcopy(one("DaemonSet", "ncclwatch-agent"))
    ds["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_operator_objects_match_their_crd_fields() -> None:
    crds = [(n, o) for n, o in objects() if not core(o)]
    assert sorted(o["kind"] for _, o in crds) == ["PodMonitor", "PrometheusRule"]
    for _, obj in crds:
        jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
    bad = copy.deepcopy(one("PodMonitor", "ncclwatch-daemon"))
    bad["spec"]["podMetricsEndpoints"][0]["honor_labels"] = True  # the Prometheus spelling
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CRD_SCHEMAS["PodMonitor"])


# -- generated copies ---------------------------------------------------------------

def test_generated_files_are_current() -> None:
    assert generate.stale() == [], "run `python -m deploy.generate` and commit"


def test_generation_notices_a_changed_source(tmp_path: Path) -> None:
    outputs = kuberender.generated()
    for name in outputs:
        (tmp_path / name).parent.mkdir(exist_ok=True)  # sharded/
        (tmp_path / name).write_text((K8S / name).read_text().replace("ncclwatch", "nclwatch", 1))
    assert sorted(generate.stale(tmp_path)) == sorted(outputs)
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.stale(tmp_path) == []


def test_prometheus_rule_holds_exactly_the_shipped_rules() -> None:
    rule = one("PrometheusRule", "ncclwatch")
    shipped = [g for src in generate.RULE_SOURCES for g in yaml.safe_load(
        src.read_text().replace(generate.RUNBOOK_FALLBACK, generate.SERVICE_RUNBOOKS))["groups"]]
    assert rule["spec"]["groups"] == shipped
    # Every link absolute, and in the cluster: no daemon seen in a week sends people to
    # either daemon's Service (one of its allowed hosts), never to a path on nobody's host.
    links = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"]
             for r in g["rules"] if "alert" in r]
    assert links and all(f"{{{{ else }}}}{generate.SERVICE_RUNBOOKS}{{{{ end }}}}" in u
                         for u in links), links
    assert "file://" not in json.dumps(rule) and "docs/runbooks" not in json.dumps(rule)
    host = generate.SERVICE_RUNBOOKS.split("//")[1].split(":")[0]
    assert host in kuberender.allowed_hosts(kuberender.Site(), []).split(",")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert {"NCCLWatchDaemonDown", "NCCLWatchDaemonReplicaDown"} <= set(alerts)
    assert len(alerts) == len(set(alerts)) >= 10


def test_dashboards_are_configmaps_for_the_sidecar() -> None:
    maps = docs("grafana-dashboards.yaml")
    files = sorted((ROOT / "dashboards" / "grafana").glob("*.json"))
    assert len(maps) == len(files) >= 2
    for cm, path in zip(maps, files):
        assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {path.name: path.read_text()}
        assert json.loads(cm["data"][path.name])["uid"] == path.stem
        # One ConfigMap must fit the API's 1 MiB and kubectl apply's 256 KiB annotation.
        assert len(yaml.safe_dump(cm)) < 256 * 1024


# -- the agent DaemonSet --------------------------------------------------------------

def _unit(key: str) -> str:
    m = re.search(rf"^{key}=(.*)$", UNIT.read_text(), re.M)
    assert m, key
    return m.group(1).strip()


def test_agent_daemonset_security_context() -> None:
    ds = one("DaemonSet", "ncclwatch-agent")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    # The systemd unit's three capabilities, nothing else.
    unit_caps = {cap.removeprefix("CAP_") for cap in _unit("CapabilityBoundingSet").split()}
    assert sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"]) == {"drop", "add"}
    assert set(sc["capabilities"]["add"]) == unit_caps == {"SYS_PTRACE", "DAC_READ_SEARCH",
                                                                   "SETUID"}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsUser"] == 0  # root: other users' ranks (the unit has no User= either)
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # The runtime's AppArmor profile allows ptrace only of peers under that same profile.
    assert sc["appArmorProfile"] == {"type": "Unconfined"}
    # Read-only host mounts, exactly those the agent reads.
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert sorted(host.values()) == ["/etc/ncclwatch/tls", "/sys/fs/cgroup", "/var/log/pods"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for name, path in host.items():
        assert mounts[name]["readOnly"] is True and mounts[name]["mountPath"] == path
    writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"] and "emptyDir" in next(v for v in pod["volumes"]
                                                        if v["name"] == "tmp")


def test_agent_runs_on_gpu_nodes_within_the_units_limits() -> None:
    pod = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in pod["tolerations"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert _unit("MemoryMax") == "512M" and limits["memory"] == "512Mi"
    assert _unit("CPUQuota") == "50%" and limits["cpu"] == "500m"


def test_agent_env_is_real_config_and_reaches_both_daemons() -> None:
    c = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    assert args.command == "agent"
    known = {o.env for o in AGENT_OPTIONS}
    ours = {e["name"]: e for e in c["env"] if e["name"].startswith("NCCLWATCH_")}
    assert set(ours) <= known, set(ours) - known
    assert ours["NCCLWATCH_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    env = {k: e["value"] for k, e in ours.items() if "value" in e}
    cfg = resolve(AGENT_OPTIONS, args, {}, env=env)
    services = {s["metadata"]["name"]: s for _, s in objects() if s["kind"] == "Service"}
    targets = cfg["collector"].split(",")
    assert len(targets) == 2
    for target in targets:
        host, port = target.rsplit(":", 1)
        ports = {p["name"]: p["port"] for p in services[host]["spec"]["ports"]}
        assert ports["grpc"] == int(port)


# -- the daemon pair -------------------------------------------------------------------

def _pods_selected(selector: dict) -> list[str]:
    return [d["metadata"]["name"] for _, d in objects() if d["kind"] == "Deployment"
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]


@pytest.mark.parametrize("letter", "ab")
def test_each_daemon_links_through_its_own_service(letter: str) -> None:
    """The daemon's external URL (alerts' and status's links) is its own Service."""
    (c,) = one("Deployment", f"ncclwatch-daemon-{letter}")["spec"]["template"]["spec"][
        "containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    svc = one("Service", f"ncclwatch-daemon-{letter}")
    http = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
    assert env["NCCLWATCH_EXTERNAL_URL"] == f"https://{svc['metadata']['name']}.ncclwatch.svc:{http}"


def test_daemon_is_a_pair_that_differs_only_in_its_letter() -> None:
    a, b = one("Deployment", "ncclwatch-daemon-a"), one("Deployment", "ncclwatch-daemon-b")
    assert json.loads(json.dumps(a).replace("ncclwatch-daemon-a", "ncclwatch-daemon-b")
                      .replace('"ncclwatch.io/replica": "a"', '"ncclwatch.io/replica": "b"')) == b
    for letter in "ab":
        svc = one("Service", f"ncclwatch-daemon-{letter}")
        assert _pods_selected(svc["spec"]["selector"]) == [f"ncclwatch-daemon-{letter}"]
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 7470, "http": 7471}
    both = one("Service", "ncclwatch-daemon")["spec"]["selector"]
    assert _pods_selected(both) == ["ncclwatch-daemon-a", "ncclwatch-daemon-b"]
    pdb = one("PodDisruptionBudget", "ncclwatch-daemon")["spec"]
    assert pdb["maxUnavailable"] == 1 and len(_pods_selected(pdb["selector"]["matchLabels"])) == 2


@pytest.mark.parametrize("letter", "ab")
def test_daemon_meets_the_restricted_pod_security_standard(letter: str) -> None:
    pod = one("Deployment", f"ncclwatch-daemon-{letter}")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Containerfile").read_text(), re.M)
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) \
        == (int(user.group(1)), int(user.group(2)))  # the image's own user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert not any(k in pod for k in ("hostPID", "hostNetwork", "hostIPC"))
    assert not any("hostPath" in v for v in pod["volumes"])
    assert pod["automountServiceAccountToken"] is False
    assert "memory" in c["resources"]["limits"]


# -- certificates as the layout mounts them ----------------------------------------

@pytest.fixture(scope="module")
def k8s_pki(tmp_path_factory) -> Path:
    """A CA, a daemon certificate and one for node gpu-node-7, by the real CLI."""
    return layout_pki(tmp_path_factory.mktemp("k8s-pki"))


def _daemon_config(tmp_path: Path, grpc: int, http: int, pki: Path) -> Path:
    cm = one("ConfigMap", "ncclwatch-daemon")
    toml = localize(cm["data"]["daemon.toml"], cm, pki, tmp_path)
    path = tmp_path / "daemon.toml"
    path.write_text(toml.replace("0.0.0.0:7470", f"127.0.0.1:{grpc}")
                    .replace("0.0.0.0:7471", f"127.0.0.1:{http}"))
    return path


def test_daemon_config_ports_and_probes_match_a_real_daemon(tmp_path: Path, k8s_pki) -> None:
    """The ConfigMap loads with the real config loader, its ports are the
    container's, and the probes' path answers 200 over HTTPS on a real daemon."""
    dep = one("Deployment", "ncclwatch-daemon-a")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(c["args"])
    assert args.command == "daemon" and args.config == "/etc/ncclwatch/daemon.toml"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/ncclwatch" and mount["readOnly"] is True
    toml = one("ConfigMap", "ncclwatch-daemon")["data"]["daemon.toml"]
    (tmp_path / "as-shipped.toml").write_text(toml)
    cfg = resolve(DAEMON_OPTIONS, args, load_file(str(tmp_path / "as-shipped.toml"), None), env={})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert cfg["grpc"] == f"0.0.0.0:{ports['grpc']}" and cfg["http"] == f"0.0.0.0:{ports['http']}"
    probes = [c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]]
    assert all(p["port"] == "http" and p["scheme"] == "HTTPS" for p in probes)
    grpc, http = free_port(), free_port()
    config = _daemon_config(tmp_path, grpc, http, k8s_pki)
    daemon = Proc([need("ncclwatch"), "daemon", "--config", str(config)],
                  name="ncclwatch-daemon-k8s")
    try:
        deadline, status = time.time() + 30, None
        while status is None and time.time() < deadline and daemon.alive():
            try:
                with urllib.request.urlopen(f"https://localhost:{http}{probes[0]['path']}",
                                            timeout=5, context=https_context(k8s_pki)) as r:
                    status = r.status
            except OSError:
                time.sleep(0.2)
        assert status == 200, daemon.output()[-2000:]
        # Everything else asks for the Secret's password: the page, the API, /metrics.
        for path in ("/", "/api/v1/jobs", "/metrics"):
            assert https_get(http, path, k8s_pki, None)[0] == 401, path
            assert https_get(http, path, k8s_pki, "ncclwatch:not-the-password")[0] == 401, path
        assert https_get(http, "/api/v1/jobs", k8s_pki, web_login(k8s_pki))[0] == 200
    finally:
        daemon.stop()


def test_podmonitor_scrapes_both_daemons_as_the_rules_expect() -> None:
    pm = one("PodMonitor", "ncclwatch-daemon")["spec"]
    assert _pods_selected(pm["selector"]["matchLabels"]) == ["ncclwatch-daemon-a",
                                                            "ncclwatch-daemon-b"]
    (ep,) = pm["podMetricsEndpoints"]
    assert ep["port"] == "http" and ep["path"] == "/metrics" and "honorLabels" not in ep
    relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
    # The shipped alerts name the scrape job "ncclwatch" and tell replicas apart by `replica`.
    alerts = generate.RULE_SOURCES[0].read_text()
    assert f'up{{job="{relabel["job"]["replacement"]}"' in alerts and "replica" in alerts
    (source,) = relabel["replica"]["sourceLabels"]
    pod_label = source.removeprefix("__meta_kubernetes_pod_label_")
    dep = one("Deployment", "ncclwatch-daemon-a")["spec"]["template"]["metadata"]["labels"]
    sanitized = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in dep.items()}
    assert sanitized[pod_label] == "a"


def test_agent_with_the_daemonsets_env_reports_to_both_daemons(tmp_path: Path,
                                                              k8s_pki) -> None:
    """The pod's environment, with the Services' names pointed at loopback and
    spec.nodeName filled in as the kubelet does, run for real: one agent, the
    two daemons of the pair (each from the ConfigMap's config), both see it."""
    c = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    assert env["NCCLWATCH_NODE"] == ""  # from the downward API
    env["NCCLWATCH_NODE"] = "gpu-node-7"
    env = agent_tls_env(env, k8s_pki, "gpu-node-7")
    alive = env["NCCLWATCH_ALIVE_FILE"] = str(tmp_path / "alive")   # the pod's /tmp/alive
    daemons, http = [], {}
    try:
        for target in env["NCCLWATCH_COLLECTOR"].split(","):
            host, port = target.rsplit(":", 1)
            grpc, http[host] = free_port(), free_port()
            sub = tmp_path / host
            sub.mkdir()
            daemons.append(Proc([need("ncclwatch"), "daemon", "--config",
                                 str(_daemon_config(sub, grpc, http[host], k8s_pki))],
                                name=host))
            env["NCCLWATCH_COLLECTOR"] = env["NCCLWATCH_COLLECTOR"].replace(
                target, f"127.0.0.1:{grpc}")
        agent = Proc([need("ncclwatch"), *c["args"]], env=env, name="agent")
        daemons.append(agent)
        want = 'ncclwatch_agent_up{node="gpu-node-7"} 1.0'
        deadline = time.time() + 60
        while time.time() < deadline and not all(want in scrape_metrics(p, k8s_pki)
                                                 for p in http.values()):
            assert agent.alive(), agent.output()[-2000:]
            time.sleep(0.5)
        for host, port in http.items():
            assert want in scrape_metrics(port, k8s_pki), (host, agent.output()[-2000:])
        # The liveness probe, as the kubelet runs it in the pod: the agent goes round.
        probe = [sys.executable if a == "python" else alive if a == "/tmp/alive" else a
                 for a in c["livenessProbe"]["exec"]["command"]]
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    finally:
        for proc in daemons:
            proc.stop()


# -- safe as shipped: mTLS, HTTPS, a NetworkPolicy -----------------------------------

def test_the_shipped_daemon_config_serves_nothing_in_plain_text(tmp_path: Path,
                                                                k8s_pki) -> None:
    """As shipped (0.0.0.0, no --insecure) the daemon's config turns on mTLS
    for gRPC and HTTPS, so the real CLI's checks let it start; the pods mount
    the files it names (the Secret), and the agents carry their node's."""
    from ncclwatch.cli import _refuse_plaintext, _security

    cm = one("ConfigMap", "ncclwatch-daemon")
    toml = cm["data"]["daemon.toml"]
    web = yaml.safe_load((k8s_pki / WEB_SECRET / "web.yml").read_text())
    assert web["tls_server_config"]["cert_file"] in DAEMON_TLS
    assert list(web["basic_auth_users"]) == [(k8s_pki / WEB_SECRET / "username").read_text()]
    (tmp_path / "daemon.toml").write_text(localize(toml, cm, k8s_pki, tmp_path))
    args = build_parser().parse_args(["daemon", "--config", str(tmp_path / "daemon.toml")])
    cfg = resolve(DAEMON_OPTIONS, args, load_file(args.config, None), env={})
    assert cfg["grpc"].startswith("0.0.0.0:") and not cfg["insecure"]
    _security("daemon", cfg)
    _refuse_plaintext(cfg)  # raises ConfigError on plaintext beyond loopback
    assert cfg["server_tls"] is not None and cfg["web"].ssl_context is not None
    assert cfg["web"].auth is not None
    # Without the users the same layout would not start (TLS alone is not enough).
    (tmp_path / "tls-only.yml").write_text(yaml.safe_dump(
        {"tls_server_config": {k: v.replace("/etc/ncclwatch-tls/", f"{k8s_pki}/")
                               .replace("tls.crt", "daemon.pem").replace("tls.key", "daemon-key.pem")
                               for k, v in web["tls_server_config"].items()}}))
    from ncclwatch.config import ConfigError
    from ncclwatch.daemon import webconfig

    with pytest.raises(ConfigError, match="without authentication"):
        _refuse_plaintext({**cfg, "web": webconfig.load(str(tmp_path / "tls-only.yml"))})
    for letter in "ab":
        pod = one("Deployment", f"ncclwatch-daemon-{letter}")["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        secret = next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]
        assert secret["secretName"] == "ncclwatch-daemon-tls"
        assert mounts["tls"]["mountPath"] == "/etc/ncclwatch-tls" and mounts["tls"]["readOnly"]
        # web.yml from the Secret, and only it: the plain password stays with Prometheus.
        web_vol = next(v for v in pod["volumes"] if v["name"] == "web")["secret"]
        assert web_vol["secretName"] == "ncclwatch-daemon-web"
        assert web_vol["items"] == [{"key": "web.yml", "path": "web.yml"}]
        assert mounts["web"]["mountPath"] + "/web.yml" == WEB_MOUNT and mounts["web"]["readOnly"]
        assert not any("configMap" in v and "web" in v["name"] for v in pod["volumes"])
        assert "--insecure" not in c["args"]
        assert "NCCLWATCH_INSECURE" not in {e["name"] for e in c.get("env", [])}
    ds = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in ds["containers"][0]["env"]}
    assert {env[k] for k in ("NCCLWATCH_TLS_CA", "NCCLWATCH_TLS_CERT",
                             "NCCLWATCH_TLS_KEY")} == set(AGENT_TLS)
    node_tls = next(v for v in ds["volumes"] if v["name"] == "node-tls")["hostPath"]
    assert node_tls == {"path": "/etc/ncclwatch/tls", "type": "Directory"}


def test_a_node_certificate_is_the_agents_identity(k8s_pki, capsys) -> None:
    """The agent with the DaemonSet's env and gpu-node-7's certificate refuses
    to report as another node (exit 2), before it connects anywhere."""
    from ncclwatch.cli import main

    c = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]["containers"][0]
    env = agent_tls_env({e["name"]: e.get("value", "") for e in c["env"]}, k8s_pki,
                        "gpu-node-7")
    import os
    old = dict(os.environ)
    try:
        os.environ.update({**env, "NCCLWATCH_NODE": "gpu-node-8"})
        assert main(c["args"]) == 2
        assert "is for 'gpu-node-7', but this agent reports as --node 'gpu-node-8'" \
            in capsys.readouterr().err
    finally:
        os.environ.clear()
        os.environ.update(old)


def _selects(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_network_policy_lets_only_agents_reach_grpc_and_prometheus_http() -> None:
    np = one("NetworkPolicy", "ncclwatch-daemon")["spec"]
    assert np["policyTypes"] == ["Ingress"]  # everything not listed is refused
    assert _pods_selected(np["podSelector"]["matchLabels"]) == ["ncclwatch-daemon-a",
                                                               "ncclwatch-daemon-b"]
    agent = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["metadata"]["labels"]
    rules = {}
    for rule in np["ingress"]:
        (port,) = rule["ports"]
        assert port["protocol"] == "TCP"
        rules[port["port"]] = rule["from"]
    assert set(rules) == {"grpc", "http"}
    (grpc_from,) = rules["grpc"]
    assert set(grpc_from) == {"podSelector"} and _selects(grpc_from["podSelector"], agent)
    (http_from,) = rules["http"]
    assert _selects(http_from["podSelector"], {"app.kubernetes.io/name": "prometheus"})
    assert not _selects(http_from["podSelector"], agent)
    # One peer with both selectors (namespace AND pod): only Prometheus's namespace, by
    # the name label the API server sets, which a tenant cannot put on its namespace.
    assert set(http_from) == {"namespaceSelector", "podSelector"}
    assert http_from["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": generate.PROMETHEUS_NAMESPACE}}
    assert generate.PROMETHEUS_NAMESPACE == "monitoring"
    for ns in ("ncclwatch", "tenant-a", ""):      # a tenant's `prometheus` pod is not let in
        assert not _selects(http_from["namespaceSelector"], {"kubernetes.io/metadata.name": ns})
    # the named ports are the daemon containers'
    c = one("Deployment", "ncclwatch-daemon-a")["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"] for p in c["ports"]} == {"grpc", "http"}


def test_the_prometheus_namespace_is_one_value_of_the_generator(tmp_path: Path) -> None:
    """Change PROMETHEUS_NAMESPACE, regenerate: both layouts' policies follow."""
    text = kuberender.network_policy(kuberender.Site(prometheus_namespace="observability"))
    [np] = [d for d in yaml.safe_load_all(text) if d]
    (_, http_rule) = np["spec"]["ingress"]
    assert http_rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"}
    assert "monitoring" not in text.replace("monitoring.coreos", "")
    assert kuberender.generated()["networkpolicy.yaml"] == (K8S / "networkpolicy.yaml").read_text()
    assert (K8S / "sharded" / "networkpolicy.yaml").read_text().endswith(
        (K8S / "networkpolicy.yaml").read_text())


def test_podmonitor_logs_in_with_the_secret_the_daemons_check() -> None:
    """Prometheus's credentials are Secret refs to the Secret whose web.yml the
    daemons mount; the agents get none (they speak gRPC with mTLS)."""
    (ep,) = one("PodMonitor", "ncclwatch-daemon")["spec"]["podMetricsEndpoints"]
    assert ep["basicAuth"] == {"username": {"name": "ncclwatch-daemon-web", "key": "username"},
                               "password": {"name": "ncclwatch-daemon-web", "key": "password"}}
    from ncclwatch import certs

    assert certs.WEB_SECRET == "ncclwatch-daemon-web"
    ds = one("DaemonSet", "ncclwatch-agent")["spec"]["template"]["spec"]
    assert "ncclwatch-daemon-web" not in json.dumps(ds)
    assert "basic" not in json.dumps(ds).lower()


def test_certs_writes_the_web_secret_the_layout_mounts(k8s_pki) -> None:
    """`ncclwatch certs` writes the Secret's keys: web.yml with the pods' paths and
    a bcrypt hash of the password, username and password without a newline."""
    import bcrypt

    d = k8s_pki / WEB_SECRET
    assert sorted(p.name for p in d.iterdir()) == ["password", "username", "web.yml"]
    user, password = (d / "username").read_text(), (d / "password").read_text()
    assert user == "ncclwatch" and "\n" not in password and len(password) >= 32
    web = yaml.safe_load((d / "web.yml").read_text())
    assert bcrypt.checkpw(password.encode(), web["basic_auth_users"][user].encode())
    assert set(web["tls_server_config"].values()) == {"/etc/ncclwatch-tls/tls.crt",
                                                       "/etc/ncclwatch-tls/tls.key"}
    assert all(p.stat().st_mode & 0o077 == 0 for p in d.iterdir())
    # the local web.yml: the same user, this folder's certificate
    local = yaml.safe_load((k8s_pki / "web.yml").read_text())
    assert local["basic_auth_users"] == web["basic_auth_users"]
    assert local["tls_server_config"]["cert_file"] == str((k8s_pki / "daemon.pem").resolve())
    assert (k8s_pki / "web-password").read_text() == password


def test_podmonitor_scrapes_https_against_the_daemons_ca() -> None:
    (ep,) = one("PodMonitor", "ncclwatch-daemon")["spec"]["podMetricsEndpoints"]
    assert ep["scheme"] == "https" and "insecureSkipVerify" not in ep["tlsConfig"]
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": "ncclwatch-daemon-tls", "key": "ca.crt"}
    hosts = re.search(r'^allowed_hosts = "(.*)"$', one("ConfigMap", "ncclwatch-daemon")[
        "data"]["daemon.toml"], re.M).group(1).split(",")
    assert ep["tlsConfig"]["serverName"] in hosts


# -- the layout for a Prometheus that selects by label ----------------------------------

@pytest.mark.parametrize("service_monitor", [False, True])
def test_a_release_layout_is_labelled_for_kube_prometheus_stack(tmp_path: Path,
                                                                  service_monitor: bool) -> None:
    out = tmp_path / "layout"
    argv = ["--layout", str(out), "--release", "kps"] + (["--service-monitor"] * service_monitor)
    assert generate.main(argv) == 0
    k = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(f.name for f in out.glob("*.yaml")
                                            if f.name != "kustomization.yaml")
    objs = [d for f in sorted(out.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]
    monitors = [o for o in objs if o["kind"] in generate.MONITORING_KINDS]
    assert sorted(o["kind"] for o in monitors) == sorted(
        ["ServiceMonitor" if service_monitor else "PodMonitor", "PrometheusRule"])
    for o in monitors:
        jsonschema.validate(o, CRD_SCHEMAS[o["kind"]])
        assert o["metadata"]["labels"]["release"] == "kps"
    # everything else is the shipped objects, unchanged
    assert [o for o in objs if core(o)] == [o for _, o in objects() if core(o)]
    if service_monitor:
        (sm,) = [o for o in monitors if o["kind"] == "ServiceMonitor"]
        (pm,) = [o for _, o in objects() if o["kind"] == "PodMonitor"]
        sel = sm["spec"]["selector"]
        services = [o for _, o in objects() if o["kind"] == "Service"
                    and sel["matchLabels"].items() <= o["metadata"]["labels"].items()
                    and all(e["key"] in o["metadata"]["labels"] for e in sel["matchExpressions"])]
        # each daemon once, through its own Service; not again through the shared one
        assert sorted(s["metadata"]["name"] for s in services) == [
            "ncclwatch-daemon-a", "ncclwatch-daemon-b"]
        (ep,) = sm["spec"]["endpoints"]
        (pep,) = pm["spec"]["podMetricsEndpoints"]
        same = ("port", "path", "interval", "scheme", "tlsConfig", "basicAuth")
        assert {k: ep[k] for k in same} == {k: pep[k] for k in same}
        relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
        assert relabel["job"]["replacement"] == "ncclwatch"
        assert relabel["replica"]["sourceLabels"] == [
            "__meta_kubernetes_service_label_ncclwatch_io_replica"]


def test_layout_options_need_a_layout_folder() -> None:
    with pytest.raises(SystemExit) as e:
        generate.main(["--release", "kps"])
    assert e.value.code == 2

