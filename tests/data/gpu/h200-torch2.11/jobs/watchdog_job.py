
import os, sys, time, datetime, torch, torch.distributed as dist
def mark(s): print("PROBE", s, "pid=%d" % os.getpid(), "t=%.3f" % time.time(), flush=True)
def cycles_for(seconds):
    torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda._sleep(200_000_000); torch.cuda.synchronize()
    rate = 200_000_000 / (time.perf_counter() - t0)
    print("PROBE cycles_per_second=%.0f" % rate, flush=True)
    return int(rate * seconds)

dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=12),
                        device_id=torch.device("cuda:0"))
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
n = cycles_for(75)
torch.cuda._sleep(n)
dist.all_reduce(t)
mark("stuck")
v = t.sum().item()
mark("unexpected_done")
