"""The verdict rules: one module per failure class, tried in this order, first match wins.

Each rule reads the Facts (facts.py) and returns a LogFinding or None. The order
matters: an OOM in a save explains the timeouts after it, a desync explains a
hang, a network error explains lost peers unless a rank crashed first, and a
stall (someone waited for someone) is the catch-all of the failures; the fallback
names a class from a crash, a kill or the watchdog's frames when nothing else did. Add a
class by adding a module and a row here.
"""

from __future__ import annotations

from ncclwatch.diagnose.finding import LogFinding, Rule
from ncclwatch.diagnose.rules.crash import rule_crash
from ncclwatch.diagnose.rules.desync import rule_desync
from ncclwatch.diagnose.rules.fallback import rule_fallback
from ncclwatch.diagnose.rules.gather_oom import rule_gather_oom
from ncclwatch.diagnose.rules.network import rule_network
from ncclwatch.diagnose.rules.stall import rule_stall

RULES: tuple[tuple[str, Rule], ...] = (
    ("gather_oom", rule_gather_oom),
    ("desync", rule_desync),
    ("network_error", rule_network),
    ("rank_crash", rule_crash),
    ("stall", rule_stall),
    ("fallback", rule_fallback),
)

__all__ = ["LogFinding", "RULES", "Rule"]
