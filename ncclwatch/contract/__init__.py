"""The contract between agent and daemon: what a report may hold, each rule once.

Neither the agent's nor the daemon's: both import it (tests/repo/test_layers.py).
``limits`` holds the wire limits, ``bounds`` the settings that scale them,
``checks`` the pure checks of a report's parts, each fault named by the part
it costs and the reason it is counted under. The agent applies them to what
it is about to send; the daemon applies the same functions on receipt.
"""
