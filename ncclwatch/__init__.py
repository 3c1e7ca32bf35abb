"""ncclwatch: see the rank that will trip the NCCL watchdog before it fires."""

__version__ = "0.2.0"
