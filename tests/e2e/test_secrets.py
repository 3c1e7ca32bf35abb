"""No secret of a training process leaves its node: not on the wire, not in
/metrics, /api/v1/jobs, the page or the logs.

A process that looks like a rank to the agent (launcher variables set) also
carries AWS keys, HF/W&B tokens, credentials inside URLs of allowlisted
NCCL/TORCH variables and a password in a MASTER_ADDR-like URL. Everything
the agent sends goes through a recording TCP proxy in this test.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from tests.harness.monitor import Monitor, wait_healthy
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "NCCL_TOKEN_FILE_CONTENTS": "plain-secret-under-an-allowed-prefix",
    "TORCH_DISTRIBUTED_STORE_URL": "https://svc:S3cr3tPassw0rd@store.internal:2379/x",
    "NCCL_IB_QUERY": "hca=mlx5_0&password=Hunter2Hunter2&x=1",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/fr_ghp_abcdefghijklmnopqrstuvwxyz0123",
    "MASTER_ADDR": "trainer:MasterPw9876@10.0.0.7",
    # Data inside URLs and values: an Azure SAS query, a fragment, a bare random run.
    "NCCL_DEBUG_FILE": "https://acct.blob.core.windows.net/logs/nccl.%h.%p?sv=2022-11-02"
                       "&se=2026-12-31&sp=cw&sig=Xq7PzR2mK9vLw3NbT8yHc4Jd6Fg1Se5Ua0Oi%3D#Tk9frag",
    "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr/Qm9vYmFyQmF6UXV4NzEyMzQ1Njc4OTBh/trace_",
    # Issue 20: variants that passed, credential names, a key split across two variables.
    "NCCL_OPTS": "--password Sw0rdfishZ9 --lr 3",
    "TORCH_NCCL_CLIENT": "client_secret=ClientS3cretV4lue&x=1",
    "NCCL_HDR": "Authorization: bearer lowercasetokenvalue123",
    "TORCH_DISTRIBUTED_CFG": "token: YamlT0kenValue",
    "NCCL_CRED": "plain-cred-value",
    "TORCH_NCCL_PWD": "plain-pwd-value",
    "NCCL_SPLIT_A": "hf_abcdefghij",
    "NCCL_SPLIT_B": "klmnopqrstuvwxyz987654",
}
#: Where the rank hides secrets that env redaction never looked at: a directory
#: of the checkpoint it writes, the name of the function it waits in.
PATH_TOKEN = "ghp_Pathtokenabcdefghijklmnopqrst01"
FRAME_TOKEN = "hf_Frametokenabcdefghijklmnopqrst01"
#: The parts that must never appear anywhere (a value may keep its harmless rest).
NEEDLES = ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "hf_abcdefghijklmnop",
           "0123456789abcdef0123456789abcdef01234567", "plain-secret-under-an-allowed-prefix",
           "S3cr3tPassw0rd", "Hunter2Hunter2", "ghp_abcdefghijklmnop", "MasterPw9876",
           "Xq7PzR2mK9vLw3NbT8yHc4Jd6Fg1Se5Ua0Oi", "2026-12-31", "Tk9frag",
           "Qm9vYmFyQmF6UXV4NzEyMzQ1Njc4OTBh", "Sw0rdfishZ9", "ClientS3cretV4lue",
           "lowercasetokenvalue123", "YamlT0kenValue", "plain-cred-value", "plain-pwd-value",
           "hf_abcdefghij", "klmnopqrstuvwxyz987654", "Pathtokenabcdefghij",
           "Frametokenabcdefghij"]

_RANK = f"""
import os, sys, time
import torch.distributed
d = os.path.join(sys.argv[1], "{PATH_TOKEN}")
os.makedirs(d, exist_ok=True)
f = open(os.path.join(d, "ck.pt"), "wb")
f.write(b"x" * 4096); f.flush()
def {FRAME_TOKEN}():
    while True: time.sleep(0.2)
{FRAME_TOKEN}()
"""


class RecordingProxy:
    """TCP proxy agent -> daemon that keeps every byte in both directions."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.data = bytearray()
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                with self.lock:
                    self.data += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_no_secret_leaves_the_node(tmp_path) -> None:
    grpc_port, http_port = free_port(), free_port()
    daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}",
                   "--http", f"127.0.0.1:{http_port}"], name="ncclwatch-daemon")
    mon = Monitor([daemon], f"http://127.0.0.1:{http_port}")
    rank = None
    try:
        wait_healthy(mon)
        proxy = RecordingProxy(grpc_port)
        mon.procs.append(Proc([need("ncclwatch"), "agent", "--collector",
                               f"127.0.0.1:{proxy.port}", "--interval", "0.5",
                               "--log-level", "debug"], name="ncclwatch-agent"))
        rank = Proc([sys.executable, "-c", _RANK, str(tmp_path)],
                    env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                         "MASTER_PORT": "29777", **SECRETS}, name="fake-rank")
        deadline, job = time.time() + 30, None
        while time.time() < deadline:
            job = mon.job_of({rank.popen.pid})
            if job and job["ranks"][0]["state"] != "unknown" and job["env"] \
                    and "ck.pt" in str(job):
                break
            time.sleep(0.3)
        assert job, f"the agent never reported the rank:\n{mon.output()[-3000:]}"
        time.sleep(2)  # a few more rounds on the wire, job info refreshes included
        surfaces = {
            "wire": proxy.data.decode("latin-1"),
            "/metrics": mon.get("/metrics"),
            "/api/v1/jobs": mon.get("/api/v1/jobs"),
            "/api/v1/jobs?ranks=1": mon.get("/api/v1/jobs?ranks=1"),
            "/api/v1/incidents": mon.get("/api/v1/incidents"),
            "/": mon.get("/"),
        }
        assert len(proxy.data) > 1000, "nothing recorded on the wire"
        # The harmless parts do arrive: the test would notice a broken pipe.
        assert "store.internal:2379" in surfaces["/api/v1/jobs"]
        assert "mlx5_0" in surfaces["/api/v1/jobs"]
        assert "acct.blob.core.windows.net/logs/nccl.%h.%p?sv=" in surfaces["/api/v1/jobs"]
        assert "/scratch/fr/" in surfaces["/api/v1/jobs"]
        assert "ck.pt" in surfaces["/api/v1/jobs?ranks=1"]      # the path, less its token
        assert "NCCL_OPTS" in surfaces["/api/v1/jobs"] and "NCCL_CRED" not in surfaces["wire"]
    finally:
        for p in reversed(mon.procs):
            p.stop()
        if rank is not None:
            rank.stop()
    surfaces["logs"] = mon.output()
    leaks = [(needle, where) for needle in NEEDLES for where, text in surfaces.items()
             if needle in text]
    assert not leaks, f"secrets leaked: {leaks}"
