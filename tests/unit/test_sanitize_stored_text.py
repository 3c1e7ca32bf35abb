"""What a certificate holder sends straight to the daemon (no agent's gate):
control and bidi characters in a job id, a path, an environment value, a
Slurm job name and a frame name reach neither the page, nor the API, nor
/metrics raw; each is shown escaped, by the one escaper, as it was stored."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

from ncclwatch import sanitize
from ncclwatch.model import RankState
from ncclwatch.stacks import stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, SAVE, checkpoint_job, frames, stack_pb

RLO, LRE, LSEP, NUL, ESC = "\u202e", "\u202a", "\u2028", "\x00", "\x1b"
HOSTILE = f"{RLO}{LRE}{LSEP}{NUL}{ESC}[2J"
#: Any character the escaper escapes (C0, DEL, C1, separators, bidi, BOM).
RAW = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e"
                 "\u2066-\u2069\ufeff]")
SHOWN = r"\u202e\u202a\u2028\x00\x1b[2J"

JOB = f"job{HOSTILE}x"
PATH = f"/ckpt/{HOSTILE}/step_100.pt"
ENV = f"NCCL_SOCKET_IFNAME=eth0{HOSTILE}"
FRAME = f"save{HOSTILE}"


def _hostile_report() -> pb.ReportRequest:
    save = frames((FRAME, "/job/storage.py"), *((f.name, f.filename) for f in SAVE[1:]))
    req = checkpoint_job(JOB, timeout=90)
    del req.report.stacks[:]
    req.report.stacks.extend([stack_pb(save), stack_pb(BARRIER)])
    s = req.report.samples[0]
    assert s.state == RankState.SAVING.to_proto()
    s.stack_id = stack_id(save)
    s.process.files_writing.add(path=PATH, size_bytes=1 << 30)
    for s in req.report.samples:        # every rank states the job's facts alike
        s.job.env["NCCL_SOCKET_IFNAME"] = ENV
        s.job.env[f"NCCL_{RLO}X"] = "1"
        s.job.scheduler_job.CopyFrom(pb.SchedulerJob(scheduler="slurm", job_id="7",
                                                     job_name=f"train{HOSTILE}", source="env"))
    return req


def test_neutralise_escapes_every_string_in_place() -> None:
    req = _hostile_report()
    assert sanitize.neutralise(req.report) > 0
    text = str(req.report)          # text_format escapes nothing of what is left
    assert not RAW.search("".join(_strings(req.report)))
    assert req.report.samples[0].identity.job_id == "job" + SHOWN + "x"
    assert req.report.samples[0].process.files_writing[0].path == f"/ckpt/{SHOWN}/step_100.pt"
    assert req.report.stacks[0].frames[0].name == "save" + SHOWN
    assert "NCCL_\\u202eX" in req.report.samples[1].job.env
    assert text
    assert sanitize.neutralise(req.report) == 0     # once is enough: escaped text is clean


def _strings(msg) -> list[str]:
    out = []
    for fd, v in msg.ListFields():
        if fd.type == fd.TYPE_STRING:
            out += list(v) if fd.is_repeated else [v]
        elif fd.type == fd.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                out += [x for kv in v.items() for x in kv if isinstance(x, str)]
            else:
                for m in (v if fd.is_repeated else [v]):
                    out += _strings(m)
    return out


def test_a_hostile_report_over_grpc_shows_escaped_on_the_page_api_and_metrics() -> None:
    async def go():
        async with Harness() as h:
            resps = await h.send(_hostile_report())
            assert [r.ack_seq for r in resps] == [1]
            h.daemon.tick()
            base = f"http://127.0.0.1:{h.server.http_port}"

            def get(path):
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.read().decode()

            return await asyncio.gather(
                asyncio.to_thread(get, "/"), asyncio.to_thread(get, "/api/v1/jobs"),
                asyncio.to_thread(get, "/metrics"), asyncio.to_thread(
                    get, "/api/v1/jobs?ranks=1"))
    page, api, metrics, detail = asyncio.run(go())
    for out in (page, api, metrics, detail):
        assert not RAW.search(out)
    decoded = json.dumps(json.loads(api) | {"d": json.loads(detail)}, ensure_ascii=False)
    assert not RAW.search(decoded)              # not even behind a JSON \\u escape
    job_id = "job" + SHOWN + "x"
    assert [j["job"] for j in json.loads(api)["jobs"]] == [job_id]
    assert job_id.replace("\\", "\\\\") in metrics   # a label value, escaped visibly
    assert "\\u202e" in page
    for shown in (f"/ckpt/{SHOWN}/step_100.pt", "save" + SHOWN, "eth0" + SHOWN,
                  "train" + SHOWN):
        assert json.dumps(shown)[1:-1] in detail or json.dumps(shown)[1:-1] in api, shown
