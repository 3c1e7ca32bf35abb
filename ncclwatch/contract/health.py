"""What the daemon reads of an agent's own behaviour: the order of its health
lists, its histogram buckets, its Flight Recorder pacing.

The agent fills them and the daemon exports or relies on them: one home,
so that neither end imports the other (tests/repo/test_layers.py).
"""

from __future__ import annotations

#: Why a rank's work was cut or skipped (agent/caps.py), in
#: AgentHealth.rank_budget_hits order.
BUDGET_REASONS = ("environ_bytes", "env_variables", "env_text", "pyspy_output", "maps_bytes",
                  "scan_time")

#: Upper bounds (seconds) of the native-dump histogram buckets (agent/pyspy.py);
#: +Inf follows.
NATIVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: An agent asks one rank for a Flight Recorder dump at most this often,
#: whatever the daemon says (agent/frprobe.py); the evidence bundle takes a
#: dump that recent as fresh (daemon/bundle.py).
FLIGHT_RECORDER_MIN_INTERVAL = 20.0
