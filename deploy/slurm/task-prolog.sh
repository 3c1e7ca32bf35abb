#!/bin/sh
# ncclwatch's Slurm TaskProlog: the Flight Recorder and its live-dump pipe for
# every task of every job
# (docs/deploy-slurm.md#2-the-flight-recorder-for-every-job-taskprolog).
#
# Install on every node (`ncclwatch install slurm` copies it there from the
# wheel):  TaskProlog=/etc/slurm/ncclwatch-task-prolog.sh  in slurm.conf (or,
# for one job, `srun --task-prolog=PATH`). Slurm runs it as the job's user
# with the task's environment before each task, and sets every
# "export NAME=value" line it prints in the task. A variable the job already
# set is left as the job set it: this prints nothing for it.
#
# No timeout is exported: a guessed one would become policy; the daemon says
# when it assumes one.
#
# Slurm takes one TaskProlog. A site that had its own moves it to
# SITE_TASK_PROLOG (edit the line below to put it elsewhere; the job's
# environment cannot name it, so a job never picks what runs here): when that
# file is executable it runs first, its output is passed through unchanged,
# and a variable it exports or unsets is never given ncclwatch's default.

SITE_TASK_PROLOG=/etc/slurm/task-prolog.site
# Flight Recorder entries per rank (torch's default from 2.11).
FR_BUFFER_SIZE=2000
# Per job: the debug pipes (<stem><rank>.pipe) and dumps (<stem><rank>) of two
# jobs on one node must not meet. Used only when it is the job user's own (see
# fr_dir); otherwise each task gets a fresh one beside it.
FR_DIR="${TMPDIR:-/tmp}/ncclwatch-fr-${SLURM_JOB_ID:-0}"

# The site's prolog first; the names its export/unset lines decide.
SITE_NAMES=" "
if [ -f "$SITE_TASK_PROLOG" ] && [ -x "$SITE_TASK_PROLOG" ]; then
    site_out=$("$SITE_TASK_PROLOG")
    if [ -n "$site_out" ]; then
        printf '%s\n' "$site_out"
        SITE_NAMES=" $(printf '%s\n' "$site_out" | sed -n \
            's/^[[:space:]]*\(export\|unset\)[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\).*/\2/p' \
            | tr '\n' ' ')"
    fi
fi

unset_in_job() {  # NAME...: true when neither the job nor the site's prolog set any
    for name in "$@"; do
        case "$SITE_NAMES" in *" $name "*) return 1 ;; esac
        eval "[ -z \"\${$name+x}\" ]" || return 1
    done
    return 0
}

default() {  # NAME VALUE: export it unless the job set it
    unset_in_job "$1" && echo "export $1=$2"
}

fr_dir() {  # the folder for pipes and dumps: FR_DIR when it is ours, else a new one
    # Anyone can make FR_DIR first in a shared /tmp: a folder of another user,
    # one others can write, or a symlink would let them read the dumps or point
    # torch's writes at the job user's files. Used only when it is a real
    # folder (not a link) this user owns, mode 700; otherwise mktemp -d makes a
    # fresh owner-only one for this task. Nothing printed: no safe folder.
    mkdir -m 700 "$FR_DIR" 2>/dev/null
    if [ -d "$FR_DIR" ] && [ ! -L "$FR_DIR" ]; then
        set -- $(ls -ldn "$FR_DIR")
        if [ "$3" = "$(id -u)" ]; then
            case $1 in drwx------|drwx------.) echo "$FR_DIR"; return 0 ;; esac
        fi
    fi
    mktemp -d "$FR_DIR.XXXXXXXX" 2>/dev/null
}

# The Flight Recorder, under both names (TORCH_NCCL_* before torch 2.7).
if unset_in_job TORCH_FR_BUFFER_SIZE TORCH_NCCL_TRACE_BUFFER_SIZE; then
    echo "export TORCH_FR_BUFFER_SIZE=$FR_BUFFER_SIZE"
    echo "export TORCH_NCCL_TRACE_BUFFER_SIZE=$FR_BUFFER_SIZE"
fi
default TORCH_NCCL_DUMP_ON_TIMEOUT 1
# The live dump ncclwatch asks for during a stall: torch makes the FIFO, the
# folder must exist.
if unset_in_job TORCH_NCCL_DEBUG_INFO_PIPE_FILE ||
        unset_in_job TORCH_FR_DUMP_TEMP_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE; then
    dir=$(fr_dir)
    if [ -n "$dir" ] && unset_in_job TORCH_NCCL_DEBUG_INFO_PIPE_FILE; then
        echo "export TORCH_NCCL_DEBUG_INFO_PIPE_FILE=$dir/pipe_rank_"
    fi
    if [ -n "$dir" ] && unset_in_job TORCH_FR_DUMP_TEMP_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE; then
        echo "export TORCH_FR_DUMP_TEMP_FILE=$dir/trace_rank_"
        echo "export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$dir/trace_rank_"
    fi
fi

exit 0
