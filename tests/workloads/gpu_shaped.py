"""A gloo job whose ranks look, from the CPU, the way GPU training ranks look (issue 26).

    torchrun --nproc-per-node 3 tests/workloads/gpu_shaped.py --ckpt-dir DIR \\
        --step-seconds 8 --batch read --seconds 75

What a rank of a big GPU job shows /proc, rebuilt on CPU:

- While "the device works" the main thread spins, as in cudaStreamSynchronize:
  a calibrated count of SHA-256 rounds over a buffer (the GIL released), so no
  read/write syscalls and no voluntary context switches. Steps are that fixed
  work, not wall time: a paused rank makes the step (and every rank) late.
- Ranks meet at a barrier in shared memory (a /dev/shm file every rank maps),
  spinning, as NCCL ranks meet inside kernels: no gloo collective per step.
- A helper thread per rank spins a fraction of a core (NCCL's own threads).
- Each step starts with a batch (``--batch``): ``read`` is a burst of 20
  preads of 4 KiB (a DataLoader batch arriving); ``shm`` copies it from shared
  memory, ``mmap`` from a mapped file (no syscalls); ``none``.
- ``--load-seconds S``: before training every rank reads "its weights" for S
  seconds (1 MiB preads of torch's own library, a real file on disk): progress
  every round, then none at all with ``--batch shm``/``mmap``/``none``.
- Rank 0 alone prints a line per step, writes a metrics file ``--metrics-hz``
  times a second (2: a thread, as loggers do) and every ``--eval-every`` steps
  evaluates (more device work and a batch) while the others wait at the barrier.
  Twice a second sits at the agent's still bound (2 progress events a second):
  rank 0 then flips between still and moving, as in the benchmarks' shapes.
- ``--save-after N``: after step N rank 0 torch.saves ``--model-mb`` to
  ``--ckpt-dir`` (a throttled mount makes it slow) while the others wait
  NCCL-shaped: ``all_reduce(async_op=True)`` then ``work.wait()`` (C++).

Rank 0 decides when to stop (``--seconds`` of training, or ``--steps``) and
says so in shared memory, so every rank leaves after the same step. Markers
as ncclwatch.demo.job prints them (tests/harness/jobs.py MARKER), train_end with
the rank's read/write syscalls and main-thread voluntary switches over
training (/proc/self), and the switches outside the batches (quiet_switches:
while the device works and the rank waits at the barrier); rank 0's step
lines read ``[rank 0] step I done t=T seconds=S work=W`` (T: time.time() as
the step's barrier passed; W: units of device work rank 0 has done so far).
"""

from __future__ import annotations

import datetime
import hashlib
import mmap
import os
import resource
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist

from fwcommon import RANK, WORLD, args, marker

from ncclwatch.demo.job import busy_thread

#: One unit of device work: SHA-256 over this many bytes (the GIL released
#: throughout; a few ms). Big, so the main thread takes the GIL rarely: each
#: take may find the helper thread holding it, and that wait is a voluntary
#: switch (with 256 KiB, about one a second on a loaded machine).
UNIT_BYTES = 4 << 20
#: What a rank waiting at the barrier hashes between two looks at the others
#: (the same, for the same reason: a few ms late to a barrier, of seconds-long steps).
POLL_BYTES = UNIT_BYTES
#: A batch: this many reads of this many bytes.
BATCH_READS, READ_BYTES = 20, 4096
#: The helper thread's duty cycle: spin part of each period, sleep the rest.
HELPER_PERIOD = 0.1
HELPER_BYTES = 8 << 20

a = args(__doc__.split("\n")[0],
         step_seconds=(float, 8.0), step_work=(int, 0), seconds=(float, 60.0),
         steps=(int, 0), batch=(str, "read"), eval_every=(int, 0), eval_seconds=(float, 4.0),
         helper_spin=(float, 0.3), save_after=(int, 0), nice=(int, 0),
         load_seconds=(float, 0.0), metrics_hz=(float, 2.0))
assert a.batch in ("read", "shm", "mmap", "none"), a.batch
if a.nice:
    os.nice(a.nice)

_UNIT = bytes(UNIT_BYTES)
_POLL = _UNIT if POLL_BYTES == UNIT_BYTES else bytes(POLL_BYTES)


def say(line: str) -> None:
    """Rank 0's log: one write per line (ranks share torchrun's stdout)."""
    sys.stdout.write(f"[rank {RANK}] {line}\n")
    sys.stdout.flush()


def device_work(units: int) -> None:
    """``units`` rounds of spinning: the GIL released, no syscalls, no sleeps."""
    for _ in range(units):
        hashlib.sha256(_UNIT).digest()


def helper(fraction: float) -> None:
    """Spin ``fraction`` of a core for the life of the rank (NCCL's threads): the
    demo's busy thread, on buffers large enough that its GIL hand-offs make no
    voluntary switches of the main thread."""
    busy_thread(fraction, period=HELPER_PERIOD, buf_bytes=HELPER_BYTES)


class SharedBarrier:
    """Ranks meet in a /dev/shm file: slot r holds the last step rank r reached.

    Slot WORLD is rank 0's stop step (the last step every rank runs). Each rank
    writes only its own slot; a waiting rank spins (hashing, the GIL released)
    between looks, as a GPU rank's kernel spins on its peers' flags.
    """

    NEVER = 2**62

    def __init__(self, path: str, create: bool) -> None:
        size = 8 * (WORLD + 1) + DATA_BYTES
        if create:
            with open(path, "wb") as f:
                f.write(bytes(8 * (WORLD + 1)) + os.urandom(DATA_BYTES))
        self._fd = os.open(path, os.O_RDWR)
        self._mm = mmap.mmap(self._fd, size)
        self.slots = memoryview(self._mm)[: 8 * (WORLD + 1)].cast("q")
        #: The shared dataset (``--batch shm``).
        self.data = memoryview(self._mm)[8 * (WORLD + 1):]
        if create:
            for r in range(WORLD):
                self.slots[r] = -1
            self.slots[WORLD] = self.NEVER

    def arrive_and_wait(self, step: int) -> None:
        self.slots[RANK] = step
        while any(self.slots[r] < step for r in range(WORLD)):
            hashlib.sha256(_POLL).digest()

    def stop_at(self, step: int) -> None:
        self.slots[WORLD] = step

    @property
    def stop_step(self) -> int:
        return self.slots[WORLD]


#: The dataset every batch comes from: 16 batches' worth, cycled.
DATA_BYTES = 16 * BATCH_READS * READ_BYTES


class Batches:
    """Where a step's batch comes from (--batch)."""

    def __init__(self, mode: str, shared: SharedBarrier) -> None:
        self.mode, self.shared, self.n = mode, shared, 0
        self.fd, self.mm = None, None
        if mode in ("read", "mmap"):  # a local file, removed once open (nothing left over)
            fd, path = tempfile.mkstemp(prefix="ncclwatch-gpu-shaped-data-")
            os.write(fd, os.urandom(DATA_BYTES))
            os.close(fd)
            self.fd = os.open(path, os.O_RDONLY)
            os.unlink(path)
        if mode == "mmap":
            self.mm = mmap.mmap(self.fd, DATA_BYTES, prot=mmap.PROT_READ)

    def next(self) -> int:
        """One batch; returns a byte of it (the work depends on the data)."""
        size = BATCH_READS * READ_BYTES
        base = (self.n % (DATA_BYTES // size)) * size
        self.n += 1
        if self.mode == "read":
            parts = [os.pread(self.fd, READ_BYTES, base + i * READ_BYTES)
                     for i in range(BATCH_READS)]
            return parts[-1][0]
        if self.mode == "shm":
            return bytes(self.shared.data[base: base + size])[-1]
        if self.mode == "mmap":
            return self.mm[base: base + size][-1]
        return 0


def metrics_writer(path: str, state: dict, hz: float) -> None:
    """Rank 0's metrics file, rewritten ``hz`` times a second (a logger's
    thread), as loggers do it: a new file renamed over the old, so that the
    process ending between the open and the write (the thread is a daemon)
    leaves a whole file."""
    def run() -> None:
        while True:
            with open(path + ".tmp", "w") as f:
                f.write(f'{{"step": {state["step"]}, "t": {time.time():.3f}}}\n')
            os.replace(path + ".tmp", path)
            time.sleep(1.0 / hz)

    threading.Thread(target=run, name="metrics", daemon=True).start()


def progress() -> tuple[int, int, int]:
    """What the kernel counts of this rank: read and write syscalls (all threads),
    and the main thread's voluntary context switches."""
    with open("/proc/self/io") as f:
        io = dict(line.split(":", 1) for line in f if ":" in line)
    with open("/proc/self/status") as f:
        st = dict(line.split(":", 1) for line in f if ":" in line)
    return int(io["syscr"]), int(io["syscw"]), int(st["voluntary_ctxt_switches"])


def switches() -> int:
    """The main thread's voluntary switches so far (getrusage: no read/write syscall)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def load_weights(seconds: float) -> None:
    """Read a large file in 1 MiB preads for ``seconds``, as a rank loading its
    weights does (from the page cache after the first pass)."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    path = max((os.path.join(lib, n) for n in os.listdir(lib)), key=os.path.getsize)
    fd, n = os.open(path, os.O_RDONLY), 0
    size, end = os.fstat(fd).st_size, time.time() + seconds
    try:
        while time.time() < end:
            if not os.pread(fd, 1 << 20, (n << 20) % max(size - (1 << 20), 1)):
                n = 0
            n += 1
    finally:
        os.close(fd)
    marker("load_end", reads=n)


def calibrate(seconds: float) -> int:
    """Units of device work per step: every rank measures its rate with the others
    spinning beside it; the slowest rate sets the work, the same on every rank."""
    device_work(2)  # warm
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        device_work(1)
        n += 1
    rate = torch.tensor([n / (time.perf_counter() - t0)])
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    return max(1, round(float(rate) * seconds))


def save_while_others_wait(step: int) -> None:
    """Rank 0 writes a checkpoint; the others wait NCCL-shaped (work.wait() in C++)."""
    t = torch.zeros(1024)
    if RANK == 0:
        torch.manual_seed(0)
        dim = max(16, int((a.model_mb * 2**20 / 4) ** 0.5))
        state = {"weight": torch.randn(dim, dim), "step": torch.tensor(step)}
        path = os.path.join(a.ckpt_dir, f"ckpt-step{step}.pt")
        say(f"checkpoint: torch.save start path={path}")
        marker("save_start", path=path)
        t0 = time.time()
        torch.save(state, path)
        marker("save_end", seconds=f"{time.time() - t0:.3f}")
        dist.all_reduce(t)
    else:
        marker("wait_start", op="all_reduce")
        work = dist.all_reduce(t, async_op=True)
        work.wait()


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    if a.helper_spin > 0:
        helper(min(a.helper_spin, 1.0))
    # Rank 0 makes the shared file in /dev/shm; the others map it once it exists.
    where = [None]
    if RANK == 0:
        shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, where[0] = tempfile.mkstemp(prefix="ncclwatch-gpu-shaped-", dir=shm_dir)
        os.close(fd)
        shared = SharedBarrier(where[0], create=True)
    dist.broadcast_object_list(where, src=0)
    if RANK != 0:
        shared = SharedBarrier(where[0], create=False)
    batches = Batches(a.batch, shared)
    marker("ready", world=WORLD, batch=a.batch)
    if a.load_seconds > 0:
        load_weights(a.load_seconds)
    units = a.step_work or calibrate(a.step_seconds)
    dist.barrier()
    if RANK == 0:
        os.unlink(where[0])  # every rank has it mapped
    eval_units = max(1, round(units * a.eval_seconds / max(a.step_seconds, 1e-3)))
    state = {"step": 0}
    if RANK == 0:
        metrics_writer(os.path.join(a.ckpt_dir, "metrics.json"), state, a.metrics_hz)
    marker("train_start", units=units, batch=a.batch)
    before, t_start = progress(), time.time()
    end = time.time() + a.seconds
    step, last, work, quiet = 0, time.time(), 0, 0
    while True:
        batches.next()
        evaluating = RANK == 0 and a.eval_every and step and step % a.eval_every == 0
        if evaluating:
            say(f"eval at step {step}")
            batches.next()
        q0 = switches()  # from here to the barrier: the device works, the rank waits
        device_work(units)
        work += units
        if evaluating:
            device_work(eval_units)
            work += eval_units
        if RANK == 0 and ((a.steps and step + 1 >= a.steps)
                          or (not a.steps and time.time() >= end)):
            shared.stop_at(step)  # before arriving: the others see it once they pass
        shared.arrive_and_wait(step)
        quiet += switches() - q0
        now = time.time()
        if RANK == 0:
            state["step"] = step
            say(f"step {step} done t={now:.6f} seconds={now - last:.3f} work={work}")
        last = now
        if a.save_after and step + 1 == a.save_after:
            save_while_others_wait(step)
            last = time.time()
        if step >= shared.stop_step:
            break
        step += 1
    after = progress()
    # The kernel's counts over training (the markers' own writes excluded).
    marker("train_end", steps=step + 1, seconds=f"{time.time() - t_start:.1f}",
           reads=after[0] - before[0], writes=after[1] - before[1],
           voluntary_switches=after[2] - before[2], quiet_switches=quiet)
    dist.barrier()
    dist.destroy_process_group()
    marker("done")


main()
sys.exit(0)
