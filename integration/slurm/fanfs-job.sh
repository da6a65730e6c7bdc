#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --exclusive --time=04:00:00
#SBATCH --job-name=fanfs
# Run COMMAND on every node of a Slurm job, with a fanfs pack mounted on each node for the
# job's whole life (docs/cluster.md, "Slurm"; integration/test_slurm.py runs this file):
#
#   sbatch --nodes=16 fanfs-job.sh python train.py --data /tmp/$USER/imagenet/train
#
# COMMAND runs as one task per node (`srun --ntasks-per-node=1 COMMAND`). PACK, MNT and
# CACHE can be set in the environment sbatch is called from (sbatch passes it on).
set -uo pipefail
PACK=${PACK:-/lustre/$USER/imagenet.fan}
MNT=${MNT:-/tmp/$USER/imagenet}         # node-local path, the same on every node
CACHE=${CACHE:-/local/ssd/$USER/fanfs}  # node-local SSD (or /dev/shm)

srun --ntasks-per-node=1 mkdir -p "$MNT" || exit 1

# The mount step: one fanfs daemon per node, each an MPI rank (--mpi=pmix), in the
# foreground until it is unmounted. It runs in the background of this script, so it lasts
# as long as the job: a daemon started by a short step dies when that step ends (or, where
# Slurm tracks processes by their tree, escapes the job and outlives it). --no-kill: one
# failed node does not end the step, the other daemons keep serving.
srun --overlap --no-kill --mpi=pmix --ntasks-per-node=1 \
    fanfs mount "$PACK" "$MNT" --cache-dir "$CACHE" &
MOUNTS=$!

# Every step that runs beside another says --overlap (Slurm >= 20.11): a step without it
# holds its CPUs and, where memory is scheduled, all the job's memory on its nodes, and a
# second step without it waits for them.
unmount() {
    # Not `kill $MOUNTS`: srun answers SIGTERM by killing its tasks with SIGKILL, which
    # leaves every node a dead mount ("Transport endpoint is not connected").
    srun --overlap --ntasks-per-node=1 fanfs umount "$MNT"
    wait $MOUNTS
}

# Wait until the mount answers on every node; give up at once if the mount step ended.
deadline=$((SECONDS + 1800))
until srun --overlap --ntasks-per-node=1 fanfs wait "$MNT" --timeout 5 2>/dev/null; do
    if ! kill -0 $MOUNTS 2>/dev/null || ((SECONDS >= deadline)); then
        echo "fanfs-job: the mounts did not come up; each node logs to $CACHE/fanfs.log" >&2
        exit 1   # the job ends: Slurm sends SIGTERM to any daemon still running
    fi
done

srun --overlap --ntasks-per-node=1 "$@"   # unmodified: reads $MNT like any directory
rc=$?
unmount
exit $rc
