# Starts the ranks of a hvd_dcasgd batch job; sourced by one_node.sbatch and
# multi_node.sbatch, which set LAUNCHER, REPO, VENV, SCRIPT, SCRIPT_ARGS and
# the MPI environment first.
#
#   source "$REPO/slurm/start_ranks.sh" NAME_OF_THE_BATCH_SCRIPT "$@"

NAME="$1"; shift
die() { echo "$NAME: $*" >&2; exit 1; }

cd "$REPO" || die "cannot enter the repository $REPO (set HVD_DCASGD_REPO)."
PYTHON="$VENV/bin/python"
[ -x "$PYTHON" ] || die "no Python at $PYTHON: submit from the repository root or set HVD_DCASGD_VENV."
if [ $# -gt 0 ]; then
    COMMAND=("$PYTHON" "$@")
else
    COMMAND=("$PYTHON" "$SCRIPT" "${SCRIPT_ARGS[@]}")
fi
# Parameter servers: ranks 0..SERVERS-1, each holding a slice of the parameters.
SERVERS="${HVD_DCASGD_SERVERS:-1}"
[[ "$SERVERS" =~ ^[1-9][0-9]*$ ]] || die "HVD_DCASGD_SERVERS must be a whole number >= 1, not '$SERVERS'."
export HVD_DCASGD_SERVERS="$SERVERS"
[ "${SLURM_NTASKS:-0}" -gt "$SERVERS" ] || die "needs more tasks than servers ($SERVERS), so that there is a worker; got ${SLURM_NTASKS:-none}."
# Several servers on several nodes: the ranks go round-robin over the nodes
# (the servers one per node first); otherwise in blocks.
PLACEMENT=()
if [ "$SERVERS" -gt 1 ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
    case "$LAUNCHER" in srun) PLACEMENT=(--distribution=cyclic) ;; mpirun) PLACEMENT=(--map-by node) ;; esac
fi

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
# The servers' checkpoints: one folder per job, which a requeued job (same
# job id) finds again and resumes from.
export HVD_DCASGD_CHECKPOINT_DIR="${HVD_DCASGD_CHECKPOINT_DIR:-$REPO/checkpoints/${SLURM_JOB_ID:-job}}"
# Since SLURM 22.05 srun no longer inherits sbatch's --cpus-per-task.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"

# GPUs per task (sbatch --gpus-per-task=N, as N or TYPE:N). With one GPU per
# task every rank is given every GPU of its node, and its hvd.init() places
# it among them (HVD_DCASGD_GPUS=auto, the default: the servers first, its
# own at the index hvd.local_rank() returns, so that Horovod's
# torch.cuda.set_device(hvd.local_rank()) selects it; docs/GPU.md). With
# several per task each rank keeps the ones it is given (keep).
per_task="${SLURM_GPUS_PER_TASK:+${SLURM_GPUS_PER_TASK##*:}}"
if [ -n "$per_task" ] && [ "$per_task" != 1 ]; then export HVD_DCASGD_GPUS="${HVD_DCASGD_GPUS:-keep}"; fi

echo "hvd_dcasgd: $SERVERS server(s) + $((SLURM_NTASKS - SERVERS)) workers on ${SLURM_JOB_NUM_NODES:-?} node(s) ${SLURM_JOB_NODELIST:-?}, $LAUNCHER: ${COMMAND[*]}"
case "$LAUNCHER" in
    srun)
        # With sbatch --gpus-per-task, srun inherits it and binds each rank to
        # its own GPUs (SLURM's implicit --gpu-bind=per_task); with one GPU per
        # task, every rank sees the node's GPUs and takes its own (above).
        BIND=()
        if [ "$per_task" = 1 ]; then BIND=(--gpu-bind=none); fi
        LAUNCH=(srun --mpi=pmix --kill-on-bad-exit=1 "${BIND[@]}" "${PLACEMENT[@]}" "${COMMAND[@]}")
        ;;
    mpirun)
        if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then
            # mpirun starts its daemon with one srun task per node: let that
            # step have all the node's GPUs (newer SLURM versions also pass
            # the request as SLURM_TRES_PER_TASK). One per task: each rank
            # takes its own (above); several: each rank gets its share, by
            # its rank on the node.
            unset SLURM_GPUS_PER_TASK SLURM_TRES_PER_TASK
            if [ "$per_task" != 1 ]; then
                COMMAND=(bash -c 'gpus=(${CUDA_VISIBLE_DEVICES//,/ }) n='"$per_task"'; IFS=,
                    export CUDA_VISIBLE_DEVICES="${gpus[*]:OMPI_COMM_WORLD_LOCAL_RANK*n:n}"
                    exec "$@"' bind-gpus "${COMMAND[@]}")
            fi
        fi
        root=()
        if [ "$(id -u)" -eq 0 ]; then root=(--allow-run-as-root); fi
        # Told to stop directly (scancel), mpirun waits this long before it
        # signals the ranks and as long again before it kills them; the ranks,
        # signalled by SLURM themselves, need the time to save a checkpoint.
        export OMPI_MCA_odls_base_sigkill_timeout="${OMPI_MCA_odls_base_sigkill_timeout:-20}"
        LAUNCH=(mpirun "${root[@]}" -np "$SLURM_NTASKS" "${PLACEMENT[@]}" "${COMMAND[@]}")
        ;;
    *)
        die "HVD_DCASGD_LAUNCHER must be srun or mpirun, not '$LAUNCHER'."
        ;;
esac

# Run the ranks, and pass a stop on to them: SLURM's advance signal (USR1, to
# this script), or TERM/INT (a plain scancel, the time limit, a requeue or
# preemption by SLURM: SIGTERM to this script and to every rank at once),
# reaches srun or mpirun as USR1, which both send on to every rank at once.
# The ranks stop after their current step, the server saves a checkpoint, and
# the job exits with status 75 (preempted), and requeues itself -- unless
# this script got a SIGTERM or SIGINT before the job's time limit: a
# cancelled job stays cancelled (submit it again to resume), and a job that
# SLURM requeues (scontrol requeue, preemption) is requeued by SLURM.  The
# advance signal (to this script, or to the ranks only without "B:") and
# the time limit's own SIGTERM requeue it.
ranks="" stopping="" cancelled="" limit_at="" requeued=""
# Where the stop was asked, to find the checkpoints written since.
ASKED="$HVD_DCASGD_CHECKPOINT_DIR/.stop-asked"
# The time limit, read now (a cancel moves the job's end time to its own).
END_TIME=""
# How long SLURM waits after the time limit's SIGTERM before it kills what is
# left of the job, this script included.
KILL_WAIT=30
if [ -n "${SLURM_JOB_ID:-}" ]; then
    end="$(timeout 10 squeue --noheader --jobs="$SLURM_JOB_ID" --format=%e 2>/dev/null || true)"
    if [[ "$end" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]+$ ]]; then END_TIME="$(date -d "$end" +%s)"; fi
    wait_s="$(timeout 10 scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\) sec.*/\1/p' || true)"
    if [[ "$wait_s" =~ ^[0-9]+$ ]]; then KILL_WAIT="$wait_s"; fi
fi
stop() {
    case "$1" in
        TERM|INT) if [ -z "$END_TIME" ] || [ "$(date +%s)" -lt "$((END_TIME - 2))" ]; then cancelled=1
                  elif [ -z "$limit_at" ]; then limit_at="$(date +%s)"; fi ;;
    esac
    if [ -z "$stopping" ]; then mkdir -p "$HVD_DCASGD_CHECKPOINT_DIR" && touch "$ASKED" || true; fi
    stopping=1
    [ -z "$ranks" ] || kill -USR1 "$ranks" 2>/dev/null || true
}
# Every server has written a checkpoint since the stop was asked.
saved_since_stop() {
    [ -f "$ASKED" ] && [ "$(find "$HVD_DCASGD_CHECKPOINT_DIR" -name 'checkpoint-*.pt' -newer "$ASKED" | wc -l)" -ge "$SERVERS" ]
}
requeue() {
    requeued=1
    echo "$NAME: the job was stopped and saved a checkpoint in $HVD_DCASGD_CHECKPOINT_DIR; requeueing job $SLURM_JOB_ID, which resumes from it$1."
    scontrol requeue "$SLURM_JOB_ID" || echo "$NAME: scontrol requeue $SLURM_JOB_ID failed: submit the job again with HVD_DCASGD_CHECKPOINT_DIR=$HVD_DCASGD_CHECKPOINT_DIR to resume." >&2
}
trap 'stop USR1' USR1
trap 'stop TERM' TERM
trap 'stop INT' INT
"${LAUNCH[@]}" &
ranks=$!
[ -z "$stopping" ] || stop AGAIN  # told to stop while starting them
# Wait for the ranks, a second at a time (a signal ends the wait at once).
# SLURM kills this script KILL_WAIT seconds after the time limit's SIGTERM,
# whether or not the ranks have exited: ranks slow to exit (a loaded node,
# srun ending the step) must not cost the requeue, so 10 s before that, a
# job whose servers have all saved since the stop is requeued while its
# ranks are still on their way out.
while kill -0 "$ranks" 2>/dev/null; do
    if [ -n "$limit_at" ] && [ -z "$requeued" ] && [ -n "${SLURM_JOB_ID:-}" ] \
        && [ "$(date +%s)" -ge "$((limit_at + KILL_WAIT - 10))" ] && saved_since_stop; then
        requeue " (its ranks are still exiting, and SLURM ends this script ${KILL_WAIT} s after the time limit)"
    fi
    sleep 1 &
    wait $! 2>/dev/null || true
done
status=0
wait "$ranks" || status=$?
# srun --kill-on-bad-exit ends the step as soon as one rank exits with 75:
# on several nodes the ranks of another node may still be on their way out,
# and are then killed (srun's status is theirs).  A job told to stop whose
# servers all wrote a checkpoint since is preempted all the same.
if [ -n "$stopping" ] && [ "$status" -ne 0 ] && [ "$status" -ne 75 ] && saved_since_stop; then
    echo "$NAME: $LAUNCHER ended with status $status after the stop, and every server wrote a checkpoint since: preempted (75)."
    status=75
fi
rm -f "$ASKED"
if [ "$status" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ -z "$requeued" ]; then
    if [ -z "$cancelled" ]; then
        requeue ""
    else
        echo "$NAME: the job was stopped before its time limit (cancelled, or requeued by SLURM) and saved a checkpoint in $HVD_DCASGD_CHECKPOINT_DIR; a requeued job, or the job submitted again with HVD_DCASGD_CHECKPOINT_DIR=$HVD_DCASGD_CHECKPOINT_DIR, resumes from it."
    fi
fi
exit "$status"
