"""Grafana dashboards for ncclwatch, generated from Python (grafana-foundation-sdk).

``python -m dashboards.generate`` writes ``dashboards/grafana/*.json``;
``python -m dashboards.lint dashboards/grafana/*.json`` checks them against
the rules of grafana's dashboard-linter; ``dashboards.queries.panel_queries``
lists every panel query with the variables filled in, for end-to-end tests
against a real Prometheus.
"""
