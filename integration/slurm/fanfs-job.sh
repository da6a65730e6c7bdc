#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --exclusive --time=04:00:00
#SBATCH --job-name=fanfs
# Run COMMAND on every node of a Slurm job with a fanfs pack mounted on each node, for the
# job's whole life (docs/cluster.md, "Slurm"; integration/test_slurm.py runs this file):
#
#   sbatch --nodes=16 fanfs-job.sh python train.py --data /tmp/$USER/imagenet/train
#
# PACK, MNT and CACHE can also be set in the environment sbatch is called from.
set -uo pipefail
PACK=${PACK:-/lustre/$USER/imagenet.fan}
MNT=${MNT:-/tmp/$USER/imagenet}         # node-local path, the same on every node
CACHE=${CACHE:-/local/ssd/$USER/fanfs}  # node-local SSD (or /dev/shm)

srun --ntasks-per-node=1 mkdir -p "$MNT" || exit 1

# The mount step: one daemon per node, in the foreground, until it is told to stop. It is
# a step of its own, running in the background of this script, so the mounts live as long
# as the job: Slurm kills every process of a step when that step ends.
# --mpi=pmix: the daemons are MPI ranks of this step. --no-kill: one failed node does not
# end the step; the other daemons keep serving.
srun --overlap --no-kill --mpi=pmix --ntasks-per-node=1 \
    fanfs mount "$PACK" "$MNT" --cache-dir "$CACHE" &
MOUNTS=$!

# Later steps share the nodes with the mount step: --overlap (Slurm >= 20.11), or they
# wait for CPUs the mount step holds.
if srun --overlap --ntasks-per-node=1 fanfs wait "$MNT" --timeout 1800; then
    srun --overlap --ntasks-per-node=1 "$@"   # unmodified: reads $MNT like any directory
    rc=$?
else
    echo "fanfs-job: the mounts did not come up" >&2
    rc=1
fi

srun --overlap --ntasks-per-node=1 fanfs umount "$MNT"
wait $MOUNTS
exit $rc
