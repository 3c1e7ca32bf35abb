"""The scenario matrix's rows: real torch jobs and the verdict ncclwatch must reach
(``make scenarios`` runs them: tests/scenarios/test_matrix.py).

Data, one row per scenario: how to launch the job (ncclwatch.demo.job
arguments), what to do to it, and the expected verdict: the first stall kind,
its culprit ranks, the diagnosed root cause, and whether it is at risk of
the watchdog. Healthy rows expect no alarm at all. Times are short (gloo on
CPU, 2-4 ranks, process-group timeouts of 90 s) so the matrix fits in CI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PG_TIMEOUT = 90


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]                # ncclwatch.demo.job arguments
    world: int = 4
    #: A row of tests/harness/launchers.py LAUNCHERS: torchrun, "launch"
    #: (ncclwatch.demo.launch, which like ranks on other nodes leaves the other
    #: ranks waiting when one dies), a shell loop, DeepSpeed's launcher, ...
    launcher: str = "torchrun"
    #: The job source the API must name the job by (``/api/v1/jobs`` ``source``);
    #: None: the launcher's own (LAUNCHERS[launcher].job_source), if any.
    job_source: str | None = None
    #: Expected first stall kind; None for a healthy run.
    kind: str | None = None
    culprits: tuple[int, ...] = ()
    root_cause: str | None = None
    #: Expected at_risk of the stall (healthy runs: never at risk; None: not judged).
    at_risk: bool | None = False
    unknown: tuple[int, ...] = ()        # rank_lost: the ranks that must be listed
    #: Kinds that may follow the first one (e.g. rank_lost after an OOM).
    then: tuple[str, ...] = ()
    #: The marker phase that starts the clock for the detection delay.
    start: str = "ready"
    #: SIGKILL this rank once ``start`` is seen (rank_lost).
    kill_rank: int | None = None
    #: The save must be flagged as overrunning within ``forecast_within`` s of
    #: ``start``, with at least half the budget left.
    forecast_overrun: bool = False
    forecast_within: float = 30.0
    #: The job's process-group timeout (--pg-timeout and NCCLWATCH_PG_TIMEOUT_S).
    pg_timeout: float = PG_TIMEOUT
    #: Give up on the verdict after this long (from the first ready marker).
    limit: float = 100.0
    #: A workload under tests/workloads run instead of ncclwatch.demo.job (``args``
    #: are its arguments), writing to a throttlefs mount paced at these bytes/s.
    script: str | None = None
    write_rate: float | None = None
    read_rate: float | None = None
    #: The culprits' state, and the most seconds from ``start`` to the verdict.
    state: str | None = None
    detect_within: float | None = None
    #: How the waiting ranks' waiting must be established (issue 18:
    #: python_frame, native_frame, flight_recorder, stillness): seen before the
    #: verdict settles, and at first detection only it or provisional stillness;
    #: and the ops that must be named; empty: not judged.
    evidence: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    #: Evidence that must follow (confirm) the first, before the job ends.
    confirmed_by: str | None = None
    #: The framework whose fix the stall must give (issue 22: diagnosis.framework.id),
    #: with the advice for now; None: not judged.
    framework: str | None = None
    #: Extra environment of the job's ranks; "{ckpt}" in a value: its checkpoint dir.
    env: tuple[tuple[str, str], ...] = ()
    #: No rank of the job may be paused while it runs (ptrace-stopped: a native
    #: dump; bench/pausewatch.py watches every row's ranks, this row must show none).
    no_pause: bool = False
    #: The detection delay aimed at (printed in the table beside it, not asserted:
    #: ``detect_within`` is the wide bound that is).
    goal: float | None = None

    @property
    def root_causes(self) -> tuple[str | None, ...]:
        """Acceptable root causes ("a|b": either, e.g. when a size forecast may or may
        not exist yet on a first save)."""
        return tuple(self.root_cause.split("|")) if self.root_cause else (None,)

    @property
    def healthy(self) -> bool:
        """No alarm expected: nothing at risk (a stall within budget may show)."""
        return self.kind is None or self.at_risk is False

    @property
    def cores(self) -> float:
        """About how many cores the row's ranks keep busy once started: what the
        matrix admits rows by (test_matrix.py), so rows that spin never starve
        each other while rows that wait share the machine. Every rank of a
        GPU-shaped job spins as a device would; a busy thread burns its share in
        every rank; a late rank computing burns one; a framework's job imports
        and steps for most of its short life; the rest wait (gloo, slow storage)."""
        for arg, cores in CORES_BY_ARG:
            if arg in self.args or arg == self.script:
                return cores(self)
        return 0.25 * self.world


def _after(args: tuple[str, ...], flag: str) -> float:
    return float(args[args.index(flag) + 1])


#: (argument or workload script, the row's cores), first match wins.
CORES_BY_ARG: tuple[tuple[str, Callable[[Scenario], float]], ...] = (
    ("gpu_shaped.py", lambda s: 0.5 * s.world),   # at nice 10: it yields to the rest
    ("--busy-thread", lambda s: s.world * _after(s.args, "--busy-thread") + 0.25 * s.world),
    ("compute", lambda s: 1.0 + 0.25 * s.world),
    *((script, lambda s: 0.5 * s.world) for script in (
        "fw_lightning.py", "fw_hf_trainer.py", "fw_accelerate.py", "fw_deepspeed.py",
        "fw_torch.py")),
)


def job_args(scenario: str, *extra: str, seconds: float = 45) -> tuple[str, ...]:
    """``ncclwatch.demo.job`` arguments: ``scenario``, a save of ``seconds``, the
    matrix's timeout."""
    return ("--scenario", scenario, "--save-seconds", str(seconds),
            "--pg-timeout", str(PG_TIMEOUT), *extra)


def _first_ckpt(model_mb: int, rate: int = 512 * 1024, timeout: int = 60) -> tuple[str, ...]:
    """slow-save of a first checkpoint (no previous file) at ``rate`` bytes/s."""
    return ("--scenario", "slow-save", "--model-mb", str(model_mb), "--write-rate", str(rate),
            "--pg-timeout", str(timeout), "--no-previous-checkpoint")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("save-rank0-barrier", job_args("slow-save", "--model-mb", "16", seconds=150),
             kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
             at_risk=True, start="save_start", forecast_overrun=True),
    Scenario("save-rank0-broadcast", job_args("slow-save", "--model-mb", "8", "--wait-op",
                                          "broadcast_object_list", seconds=150),
             kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
             at_risk=True, start="save_start", world=3),
    Scenario("save-rank2-broadcast", job_args("slow-save", "--model-mb", "8", "--saver", "2",
                                          "--wait-op", "broadcast", seconds=150),
             kind="checkpoint_gather", culprits=(2,), root_cause="save_overruns_watchdog",
             at_risk=True, start="save_start", world=3),
    Scenario("restore-rank0", job_args("slow-load", "--model-mb", "8", seconds=40),
             kind="checkpoint_restore", culprits=(0,), root_cause="slow_restore",
             at_risk=None, start="load_start", world=3),
    Scenario("fsdp1-late-rank", job_args("fsdp1-late", "--model-mb", "4", "--late-rank", "2",
                                     "--late-activity", "sleep", seconds=50),
             kind="collective_hang", culprits=(2,), root_cause="late_for_state_dict_gather",
             at_risk=True, start="busy_start", world=3),
    Scenario("fsdp2-late-rank", job_args("fsdp2-late", "--model-mb", "4", "--late-rank", "1",
                                     "--late-activity", "compute", seconds=50),
             kind="collective_hang", culprits=(1,), root_cause="late_for_state_dict_gather",
             at_risk=True, start="busy_start", world=3),
    Scenario("hang-compute", job_args("park", "--op", "all_reduce", "--late-rank", "1",
                                  "--late-activity", "compute", seconds=50),
             kind="collective_hang", culprits=(1,), root_cause="rank_computing",
             at_risk=True, start="busy_start", world=3),
    Scenario("hang-sleep", job_args("park", "--op", "barrier", "--late-activity", "sleep",
                                seconds=50),
             kind="collective_hang", culprits=(0,), root_cause="rank_idle",
             at_risk=True, start="busy_start", world=2),
    Scenario("desync", job_args("desync", "--op", "all_reduce", "--other-op", "broadcast",
                            seconds=60),
             kind="desync", culprits=(2,), root_cause="collective_order_mismatch",
             at_risk=True, start="wait_start", world=3),
    # SIGKILL with the rank's sockets kept open, as when its node dies: on gloo
    # a clean kill closes them and the peers fail fast instead of hanging.
    Scenario("rank-killed", job_args("park", "--op", "barrier", "--late-rank", "1",
                                 "--late-activity", "sleep", "--keep-sockets", seconds=60),
             kind="rank_lost", culprits=(), root_cause="rank_exited", at_risk=True,
             unknown=(1,), start="busy_start", kill_rank=1, launcher="launch", world=3),
    Scenario("gather-oom", job_args("gather-oom", "--model-mb", "32", seconds=60),
             kind="checkpoint_gather", culprits=(0,), root_cause="gather_out_of_memory",
             at_risk=True, then=("rank_lost",), start="gather_start", launcher="launch",
             world=2),
    # -- healthy: no alarm --------------------------------------------------------
    Scenario("healthy-training", job_args("train", seconds=25), world=3, no_pause=True),
    Scenario("healthy-save-in-budget", job_args("slow-save", "--model-mb", "16", seconds=15),
             kind="checkpoint_gather", culprits=(0,), root_cause="save_within_budget",
             at_risk=False, start="save_start", world=3),
    Scenario("healthy-dataloader-pause", job_args("dataloader", seconds=20), world=2,
             no_pause=True),
    # -- checkpoint size (issue 13) ----------------------------------------------------
    # First checkpoints: no earlier file beside them, so the size comes from the
    # torch.save header the agent reads as the file is written. 64 MiB at
    # 0.5 MiB/s (128 s) against a 60 s timeout must be called within 15 s; 20
    # MiB (40 s) runs past half the budget and must never be called at risk.
    Scenario("first-ckpt-overrun", _first_ckpt(64), kind="checkpoint_gather", culprits=(0,),
             root_cause="save_overruns_watchdog", at_risk=True, start="save_start",
             forecast_overrun=True, forecast_within=15.0, pg_timeout=60, world=2),
    # 16 MiB at 512 KiB/s: 32 s against a 120 s budget. With 20 MiB against 60 s
    # (a 1.5x margin) the save outlived the watchdog once in a fresh-clone run under
    # a CPU hog (the FUSE throttle is a Python process): the row is about a forecast
    # that says "in time", so its save must be in time on a loaded machine too.
    Scenario("first-ckpt-in-budget", _first_ckpt(16, timeout=120), kind="checkpoint_gather",
             culprits=(0,), root_cause="save_within_budget", at_risk=False,
             start="save_start", pg_timeout=120, world=2, limit=150.0),
    # -- frameworks (issue 12) ------------------------------------------------------
    # Each framework's own save path writes to a throttlefs mount (a FUSE
    # passthrough paced to write_rate); the saver must be named well before the
    # watchdog (asserted: 30 s; the goal, 10 s, is printed in the table) after
    # the save's start (marked from the framework's own callbacks/hooks). 6 MiB at
    # 60 kB/s takes ~105 s: past the 90 s budget, so a save whose size the agent reads
    # from its header is forecast to overrun (save_overruns_watchdog); one whose size
    # is not known yet is a slow_save.
    *(Scenario(name, args, world=world, script=script, write_rate=wr, read_rate=rr,
               kind=kind, culprits=(0,), state=state, root_cause=cause, at_risk=None,
               start=start, detect_within=30.0, limit=70.0, framework=fw)
      for name, script, args, world, wr, rr, kind, state, cause, start, fw in (
          ("fw-lightning-modelcheckpoint", "fw_lightning.py", ("--model-mb", "6"), 3,
           60_000, None, "checkpoint_gather", "saving", "slow_save|save_overruns_watchdog",
           "save_start", "lightning"),
          ("fw-pytorch-lightning", "fw_lightning.py",
           ("--model-mb", "6", "--pkg", "pytorch_lightning"), 2, 60_000, None,
           "checkpoint_gather", "saving", "slow_save|save_overruns_watchdog", "save_start",
           "lightning"),
          ("fw-hf-trainer", "fw_hf_trainer.py", ("--model-mb", "6", "--max-steps", "2"), 2,
           60_000, None, "checkpoint_gather", "saving", "slow_save|save_overruns_watchdog",
           "save_start", "transformers"),
          # accelerate's save_state has every rank write its RNG state to the same slow
          # directory first (~14 KB behind rank 0's writes on the shared mount): the
          # stall begins when the others start waiting, so the clock starts there.
          ("fw-accelerate-save-state", "fw_accelerate.py",
           ("--model-mb", "6", "--mode", "save_state"), 2, 60_000, None,
           "checkpoint_gather", "saving", "slow_save|save_overruns_watchdog", "wait_begin",
           "accelerate"),
          ("fw-deepspeed-16bit", "fw_deepspeed.py", ("--model-mb", "8", "--mode", "16bit"),
           2, 60_000, None, "checkpoint_gather", "saving",
           "slow_save|save_overruns_watchdog", "save_start", "deepspeed"),
          ("fw-dcp-async-save", "fw_torch.py", ("--model-mb", "6", "--mode", "dcp-async"), 2,
           60_000, None, "checkpoint_gather", "saving", "slow_save|save_overruns_watchdog",
           "save_start", "torch_dcp"),
          ("fw-fsdp1-full-load", "fw_torch.py", ("--model-mb", "6", "--mode", "fsdp1-load"),
           2, None, 150_000, "checkpoint_restore", "loading", "slow_restore", "load_start",
           "torch_fsdp1"),
      )),
    # -- busy waiters / adaptive thresholds (issue 13) ------------------------------
    # Every rank burns 60% of a core in a thread (NCCL ranks spin in
    # cudaStreamSynchronize): nobody is CPU-quiet.
    Scenario("busy-save-rank0-barrier", job_args("slow-save", "--model-mb", "16",
                                             "--busy-thread", "0.6", seconds=150),
             kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
             at_risk=True, start="save_start", world=2, detect_within=30.0),
    # A plain torch.save onto slow storage (a FUSE mount at 60 kB/s): the saver
    # is CPU-quiet, blocked in a write syscall.
    Scenario("quiet-saver-fuse-write", job_args("fast-save", "--model-mb", "8",
                                            "--no-previous-checkpoint"),
             kind="checkpoint_gather", culprits=(0,), root_cause=None, at_risk=None,
             start="save_start", world=2, detect_within=30.0, write_rate=60_000),
    # Rank 0 evaluates 20 s every 25 steps while the others wait in a barrier: learned
    # as the job's normal, silent, and nobody paused (no native dump).
    Scenario("healthy-long-eval-waits", job_args("train", "--eval-every", "25",
                                             "--eval-seconds", "20", seconds=70),
             world=3, limit=160.0, no_pause=True),
    # Steps for 25 s, then rank 1 stops joining the step's all_reduce.
    Scenario("fast-steps-hang", job_args("train", "--hang-after", "25", "--late-rank", "1",
                                     "--late-activity", "sleep", seconds=300),
             kind="collective_hang", culprits=(1,), root_cause="rank_idle", at_risk=True,
             start="busy_start", world=3, detect_within=30.0),
    # A late rank found by what its peers do: ~20 normal 1 s steps, then rank 1 computes
    # in a loop and never joins the step's all_reduce its peers wait in; and FSDP2, a few
    # steps, then rank 1 sleeps while the others gather the full state dict. Both against
    # the job's learned step time, not the 30 s ceiling: asserted 15 s from busy_start.
    Scenario("late-compute-after-steps",
             job_args("train", "--step-seconds", "1.0", "--hang-after", "20", "--late-rank", "1",
                  "--late-activity", "compute", seconds=300),
             kind="collective_hang", culprits=(1,), root_cause="rank_computing", at_risk=True,
             start="busy_start", world=3, detect_within=15.0, goal=10.0),
    Scenario("fsdp2-late-sleep-after-steps",
             job_args("fsdp2-late", "--model-mb", "4", "--steps", "200", "--late-rank", "1",
                  "--late-activity", "sleep", seconds=50),
             kind="collective_hang", culprits=(1,), root_cause="late_for_state_dict_gather",
             at_risk=True, start="busy_start", world=3, detect_within=15.0, goal=10.0),
    # The same hang NCCL-shaped: the others wait the step's all_reduce in work.wait()
    # (no c10d frame on the stack) with a thread spinning in every rank. Native frames
    # say they wait; the hang threshold (learned, at most 30 s) applies as above.
    Scenario("nccl-shaped-hang", job_args("train", "--hang-after", "25", "--late-rank", "1",
                                      "--late-activity", "sleep", "--busy-thread", "0.6",
                                      "--wait-op", "async-wait", seconds=300),
             kind="collective_hang", culprits=(1,), root_cause="rank_idle", at_risk=True,
             start="busy_start", world=3, detect_within=60.0, evidence=("native_frame",),
             ops=("wait",)),
    # -- NCCL-shaped waits (issue 18) ---------------------------------------------------
    # On NCCL a collective returns once queued and the rank blocks later, in C++:
    # work.wait(), a future's wait, DDP's backward. Nothing on the Python stack
    # says so (it reads compute), and every rank spins a thread like NCCL's busy
    # wait. The waiters' native frames must name the wait. The goal is 10 s from
    # the save's start (7-8 s measured here, printed in the table); the assert
    # keeps a wide margin: 30 s, a third of the 90 s watchdog.
    *(Scenario(name, job_args("slow-save", "--model-mb", "16", "--busy-thread", "0.6",
                          "--wait-op", wait_op, seconds=150),
               kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
               at_risk=True, start="save_start", world=3, detect_within=30.0, state="saving",
               evidence=("native_frame",), ops=ops)
      for name, wait_op, ops in (
          ("nccl-shaped-async-wait", "async-wait", ("wait",)),
          ("nccl-shaped-future-wait", "future-wait", ("wait",)),
          ("nccl-shaped-ddp-backward", "ddp-backward", ("all_reduce",)),
      )),
    # FSDP2 (fully_shard, async unshard as on NCCL): the waiters run into the next
    # forward, whose unshard waits on rank 0's all_gather.
    Scenario("nccl-shaped-fsdp2-unshard",
             ("--scenario", "fsdp2-save", "--model-mb", "16", "--busy-thread", "0.6",
              "--wait-op", "fsdp2-forward", "--save-seconds", "150",
              "--pg-timeout", str(PG_TIMEOUT)),
             kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
             at_risk=True, start="save_start", world=3, detect_within=30.0, state="saving",
             evidence=("native_frame",), ops=("all_gather",)),
    # Lightning: a callback saves on rank 0 only (is_global_zero) onto slow storage
    # while the other ranks run ahead into the next step. Lightning 2.x broadcasts
    # a SIGTERM flag at every step (_TrainingEpochLoop._broadcast_sigterm_tensor):
    # on gloo the waiters block there, in a c10d frame (on NCCL that broadcast is
    # queued and the wait moves to the device).
    Scenario("nccl-shaped-lightning-rank0-save", ("--model-mb", "6", "--rank0-save", "1",
                                                  "--save-every", "2", "--max-steps", "4"),
             script="fw_lightning.py", world=3,
             kind="checkpoint_gather", culprits=(0,), root_cause=None, at_risk=None,
             start="save_start", detect_within=30.0, state="saving", limit=70.0,
             evidence=("python_frame",), ops=("broadcast",)),
    # -- GPU-shaped (issue 26) -------------------------------------------------------
    # tests/workloads/gpu_shaped.py: ranks that look from the CPU like GPU ranks. While
    # "the device works" the main thread spins (no read/write syscalls, no voluntary
    # switches); ranks meet at a barrier in shared memory, not in a gloo collective; a
    # helper thread spins in every rank; rank 0 alone logs each step, writes a metrics
    # file four times a second and (8s-reads) evaluates every 3 steps. Healthy: no alarm
    # and no rank ever paused (no native dump). Ranks at nice 10: their spinning must
    # not starve the row beside them on this 2-core CI machine. Four times, not twice:
    # twice a second is the agent's still bound, and a job whose every rank reads as
    # still (ranks 1-2 make no syscall at all with shm/mmap batches) is the halted
    # shape, where the daemon lets each rank be paused once (daemon/detect/shape.py);
    # a CI run under load paused rank 2 of the load-12s row so. These rows are about
    # healthy ranks beside a rank visibly at work.
    *(Scenario(name, ("--step-seconds", step, "--batch", batch, "--seconds", secs,
                      "--nice", "10", "--metrics-hz", "4", *extra),
               script="gpu_shaped.py", world=3, no_pause=True, limit=limit)
      for name, step, batch, secs, extra, limit in (
          ("gpu-shaped-healthy-8s-reads", "8", "read", "70",
           ("--eval-every", "3", "--eval-seconds", "4"), 120.0),
          ("gpu-shaped-healthy-8s-mmap", "8", "mmap", "45", (), 90.0),
          ("gpu-shaped-healthy-2s-shm", "2", "shm", "40", (), 80.0),
          # Weights first (12 s of reads: progress every round), then batches
          # already on the device: no syscall on ranks 1-2 from then on, steps
          # of 5, 12 and 30 s. The agent once took that start-up for steps and
          # paused the first long step (stillness.py).
          ("gpu-shaped-healthy-load-5s", "5", "shm", "40", ("--load-seconds", "12"), 90.0),
          ("gpu-shaped-healthy-load-12s", "12", "shm", "50", ("--load-seconds", "12"), 100.0),
          ("gpu-shaped-healthy-load-30s", "30", "shm", "75", ("--load-seconds", "12"), 130.0),
      )),
    # The same job, 8 s steps, then rank 0 torch.saves 8 MiB to storage paced at 60 kB/s
    # (~140 s: past the 90 s watchdog) while the others wait NCCL-shaped: async
    # all_reduce, then work.wait() in C++. Goal: found within 15 s of the save's start
    # (printed); asserted: 60 s, before the watchdog.
    Scenario("gpu-shaped-save-stall", ("--step-seconds", "8", "--batch", "read",
                                       "--save-after", "3", "--seconds", "300",
                                       "--model-mb", "8", "--nice", "10"),
             script="gpu_shaped.py", world=3, write_rate=60_000,
             kind="checkpoint_gather", culprits=(0,), state="saving", root_cause=None,
             at_risk=None, start="save_start", detect_within=60.0, goal=15.0, limit=170.0),
    # -- launchers ------------------------------------------------------------------
    # One row per launcher of tests/harness/launchers.py, each a real process tree:
    # the job is found under the launcher's job source (asserted from the API's job
    # view) and the stall named. A shell loop passes each rank its rank and a
    # tcp:// or file:// rendezvous on the command line and nothing in the
    # environment: rank 1 saves, and must be named within 30 s (goal 10 s).
    *(Scenario(f"launcher-{launcher}", job_args("slow-save", "--model-mb", "8", "--saver", "1",
                                            seconds=150),
               world=world, launcher=launcher, kind="checkpoint_gather", culprits=(1,),
               state="saving", root_cause="slow_save|save_overruns_watchdog", at_risk=None,
               start="save_start", detect_within=30.0, goal=10.0, limit=70.0)
      for launcher, world in (
          ("shell-tcp", 3), ("shell-file", 3), ("deepspeed", 2), ("torch-launch", 2),
          ("torchx-local", 2), ("kubeflow-pytorchjob", 2), ("skypilot", 2),
      )),
    # torch.distributed.launch --use-env: a healthy run to its end, no alarm.
    Scenario("launcher-torch-launch-use-env", job_args("train", seconds=20), world=2,
             launcher="torch-launch-use-env", no_pause=True),
)
