"""Write the Kubernetes files a checkout commits (a thin shim over ncclwatch.kuberender).

    python -m deploy.generate [--check] [--out DIR]

writes deploy/kubernetes's rendered files with every default: the
PrometheusRule (exactly the groups of ``dashboards/prometheus/alerts.yaml`` and
``rules.yaml``), the Grafana dashboards' ConfigMaps, the NetworkPolicy, and the
whole ``sharded/`` layout, as ``ncclwatch render`` renders them from the
sources (``ncclwatch/kuberender.py``). The sources stay the one place the
rules, dashboards and hand-written manifests are edited: after changing them,
run this again and commit. ``--check`` writes nothing and exits 1 when a
committed file is stale (tests/repo/test_k8s_manifests.py runs the same comparison).

A site's copy (namespace, image, ``release`` label, external URL, ingress
namespace, node certificates from cert-manager) is ``ncclwatch render
kubernetes --out DIR ...``, which needs no checkout; ``--layout DIR
[--release NAME] [--service-monitor]`` here is the same for those two values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ncclwatch import kuberender
from ncclwatch.kuberender import (  # noqa: F401 - the names tests and scripts read here
    MONITORING_KINDS, RULE_SOURCES as _RULES, RUNBOOK_FALLBACK, SHARD_LABEL, Site, render)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "deploy" / "kubernetes"
RULE_SOURCES = tuple(ROOT / r for r in _RULES)
#: The shipped defaults (flags of `ncclwatch render` change them for a site).
PROMETHEUS_NAMESPACE = Site().prometheus_namespace
SHARD_COUNT = Site().shard_count
SERVICE_RUNBOOKS = kuberender.runbooks_url(Site())


def stale(out: Path = OUT) -> list[str]:
    """Names of generated files whose committed text differs from a fresh render."""
    return kuberender.stale(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.generate",
                                description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--layout", type=Path, metavar="DIR",
                   help="write a copy of deploy/kubernetes with the options below to DIR "
                        "(ncclwatch render kubernetes takes every site value)")
    p.add_argument("--release", metavar="NAME",
                   help="label the monitor and the rules release=NAME (kube-prometheus-stack)")
    p.add_argument("--service-monitor", action="store_true",
                   help="a ServiceMonitor of the daemons' Services instead of the PodMonitor")
    args = p.parse_args(argv)
    if (args.release or args.service_monitor) and not args.layout:
        p.error("--release and --service-monitor need --layout DIR")
    if args.layout:
        site = Site(release_label=args.release or "", service_monitor=args.service_monitor)
        args.layout.mkdir(parents=True, exist_ok=True)
        for name, text in render(site, "kubernetes").items():
            (args.layout / name).write_text(text)
            print(f"wrote {args.layout / name}")
        return 0
    if args.check:
        bad = stale(args.out)
        for name in bad:
            print(f"stale: {args.out / name} (run python -m deploy.generate)", file=sys.stderr)
        return 1 if bad else 0
    for name, text in kuberender.generated().items():
        (args.out / name).parent.mkdir(exist_ok=True)
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
