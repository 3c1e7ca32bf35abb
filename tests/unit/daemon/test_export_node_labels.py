"""The per-node budget and fault metrics label a node identity escaped.

A node identity is a client certificate's name (mTLS) or, without TLS, the
report's node: either may hold a terminal escape, a bidi override or a
newline. Every other label is escaped once at ingest (sanitize.neutralise);
the identity keys the budgets and the faults (nodebudget.identity_of) and is
escaped the same way, so /metrics and a terminal that shows it never see the
raw characters. Driven through the daemon's core as the gRPC service does.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ncclwatch.contract.bounds import Bounds
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import build, capture, encode
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState
from ncclwatch.sanitize import escape
from tests.harness.reports import report, sample

CERT = "node-a\x1b[2J\u202eevil\nfake 1"
PLAIN = "node-b\x1b]0;title\x07\u202e\nx"
FAMILIES = ("ncclwatch_daemon_node_held_bytes", "ncclwatch_daemon_node_jobs",
            "ncclwatch_daemon_node_agent_ids", "ncclwatch_daemon_node_faults_total")


def test_node_identities_are_labels_escaped_by_the_one_escaper() -> None:
    d = Daemon(DaemonConfig(bounds=Bounds(max_agents_per_node=1)))
    d.ingest(report([sample("job-a", 0, 1, RankState.COMPUTE)], node=CERT), 10.0,
             cert_names=frozenset({CERT}))
    d.ingest(report([sample("job-b", 0, 1, RankState.COMPUTE)], node=PLAIN,
                    agent="agent-b"), 10.0)
    for node, names in ((CERT, frozenset({CERT})), (PLAIN, None)):   # a second agent id
        try:
            d.ingest(report([], node=node, agent="another"), 11.0, cert_names=names)
        except ReportError:
            pass
    text = encode(build(capture(d, now=12.0))).decode()
    for raw in ("\x1b", "\u202e", "\x07"):
        assert raw not in text
    shown = {escape(CERT), escape(PLAIN)}
    assert shown == {"node-a\\x1b[2J\\u202eevil\\x0afake 1", "node-b\\x1b]0;title\\x07\\u202e\\x0ax"}
    seen: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "node" in s.labels:
                seen.setdefault(s.name, set()).add(s.labels["node"])
    for name in FAMILIES:
        assert seen.get(name) and seen[name] <= shown | {"node-a", "node-b"}, (name, seen)
    assert seen["ncclwatch_daemon_node_held_bytes"] == shown
    assert seen["ncclwatch_daemon_node_faults_total"] == shown
