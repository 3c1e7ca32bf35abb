
import os, sys, time, datetime, torch, torch.distributed as dist
def mark(s): print("PROBE", s, "pid=%d" % os.getpid(), "t=%.3f" % time.time(), flush=True)
def cycles_for(seconds):
    torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda._sleep(200_000_000); torch.cuda.synchronize()
    rate = 200_000_000 / (time.perf_counter() - t0)
    print("PROBE cycles_per_second=%.0f" % rate, flush=True)
    return int(rate * seconds)

dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120),
                        device_id=torch.device("cuda:0"))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t); dist.broadcast(t, 0); dist.barrier()
out = [torch.empty_like(t)]; dist.all_gather(out, t)
sub = dist.new_group([0], group_desc="probe_subgroup")
dist.all_reduce(t, group=sub)
torch.cuda.synchronize()
mark("ready")
for i in range(60):
    dist.all_reduce(t); torch.cuda.synchronize(); time.sleep(0.5)
mark("done")
dist.destroy_process_group()
