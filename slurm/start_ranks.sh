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
[ "${SLURM_NTASKS:-0}" -ge 2 ] || die "needs at least 2 tasks (a server and a worker), got ${SLURM_NTASKS:-none}."

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
# Since SLURM 22.05 srun no longer inherits sbatch's --cpus-per-task.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"

echo "hvd_dcasgd: 1 server + $((SLURM_NTASKS - 1)) workers on ${SLURM_JOB_NUM_NODES:-?} node(s) ${SLURM_JOB_NODELIST:-?}, $LAUNCHER: ${COMMAND[*]}"
case "$LAUNCHER" in
    srun)
        # With sbatch --gpus-per-task, srun inherits it and binds each rank to
        # its own GPUs (SLURM's implicit --gpu-bind=per_task).
        exec srun --mpi=pmix --kill-on-bad-exit=1 "${COMMAND[@]}"
        ;;
    mpirun)
        if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then
            # mpirun starts its daemon with one srun task per node: let that
            # step have all the node's GPUs (newer SLURM versions also pass
            # the request as SLURM_TRES_PER_TASK), then give each rank its
            # share, by its rank on the node.
            per_task="${SLURM_GPUS_PER_TASK##*:}"
            unset SLURM_GPUS_PER_TASK SLURM_TRES_PER_TASK
            COMMAND=(bash -c 'gpus=(${CUDA_VISIBLE_DEVICES//,/ }) n='"$per_task"'; IFS=,
                export CUDA_VISIBLE_DEVICES="${gpus[*]:OMPI_COMM_WORLD_LOCAL_RANK*n:n}"
                exec "$@"' bind-gpus "${COMMAND[@]}")
        fi
        root=()
        if [ "$(id -u)" -eq 0 ]; then root=(--allow-run-as-root); fi
        exec mpirun "${root[@]}" -np "$SLURM_NTASKS" "${COMMAND[@]}"
        ;;
    *)
        die "HVD_DCASGD_LAUNCHER must be srun or mpirun, not '$LAUNCHER'."
        ;;
esac
