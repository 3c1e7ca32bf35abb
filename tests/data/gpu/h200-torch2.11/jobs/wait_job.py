
import os, sys, time, datetime, torch, torch.distributed as dist
def mark(s): print("PROBE", s, "pid=%d" % os.getpid(), "t=%.3f" % time.time(), flush=True)
def cycles_for(seconds):
    torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda._sleep(200_000_000); torch.cuda.synchronize()
    rate = 200_000_000 / (time.perf_counter() - t0)
    print("PROBE cycles_per_second=%.0f" % rate, flush=True)
    return int(rate * seconds)

x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")   # 2 GiB held
n = cycles_for(14)
torch.cuda._sleep(n); mark("sync_wait")
torch.cuda.synchronize(); mark("sync_done")
y = torch.ones(4, device="cuda"); torch.cuda._sleep(n); z = (y * 2).sum()
mark("item_wait")
v = z.item(); mark("item_done")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    torch.cuda._sleep(n)
ev = torch.cuda.Event(); ev.record(s)
mark("event_wait"); ev.synchronize(); mark("event_done")
