#!/bin/sh
# ncclwatch's Slurm TaskProlog: the Flight Recorder and the declared
# process-group timeout for every task of every job (docs/deployment.md
# "Running under Slurm").
#
# Install on every node (`ncclwatch install slurm` copies it there from the
# wheel):  TaskProlog=/etc/slurm/ncclwatch-task-prolog.sh  in slurm.conf (or,
# for one job, `srun --task-prolog=PATH`). Slurm runs it as the job's user
# with the task's environment before each task, and sets every
# "export NAME=value" line it prints in the task. A variable the job already
# set is left as the job set it: this prints nothing for it.

# torch's NCCL default (10 min). Where the site's launchers pass another
# init_process_group(timeout=...), put that here: a value above the jobs' real
# timeout would delay every alarm.
PG_TIMEOUT_S=600
# Flight Recorder entries per rank (torch's default from 2.11).
FR_BUFFER_SIZE=2000
# Per job: the debug pipes (<stem><rank>.pipe) and dumps (<stem><rank>) of two
# jobs on one node must not meet.
FR_DIR="${TMPDIR:-/tmp}/ncclwatch-fr-${SLURM_JOB_ID:-0}"

unset_in_job() {  # NAME...: true when the job set none of them
    for name in "$@"; do
        eval "[ -z \"\${$name+x}\" ]" || return 1
    done
    return 0
}

default() {  # NAME VALUE: export it unless the job set it
    unset_in_job "$1" && echo "export $1=$2"
}

# The Flight Recorder, under both names (TORCH_NCCL_* before torch 2.7).
if unset_in_job TORCH_FR_BUFFER_SIZE TORCH_NCCL_TRACE_BUFFER_SIZE; then
    echo "export TORCH_FR_BUFFER_SIZE=$FR_BUFFER_SIZE"
    echo "export TORCH_NCCL_TRACE_BUFFER_SIZE=$FR_BUFFER_SIZE"
fi
default TORCH_NCCL_DUMP_ON_TIMEOUT 1
# The live dump ncclwatch asks for during a stall: torch makes the FIFO, the
# folder must exist.
if unset_in_job TORCH_NCCL_DEBUG_INFO_PIPE_FILE; then
    mkdir -p -m 700 "$FR_DIR" 2>/dev/null
    echo "export TORCH_NCCL_DEBUG_INFO_PIPE_FILE=$FR_DIR/pipe_rank_"
fi
if unset_in_job TORCH_FR_DUMP_TEMP_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE; then
    mkdir -p -m 700 "$FR_DIR" 2>/dev/null
    echo "export TORCH_FR_DUMP_TEMP_FILE=$FR_DIR/trace_rank_"
    echo "export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$FR_DIR/trace_rank_"
fi

# The timeout, where the job states none of the ways ncclwatch reads
# (ncclwatch/agent/timeouts.py).
if unset_in_job NCCLWATCH_PG_TIMEOUT_S NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS DEEPSPEED_TIMEOUT; then
    echo "export NCCLWATCH_PG_TIMEOUT_S=$PG_TIMEOUT_S"
fi
exit 0
