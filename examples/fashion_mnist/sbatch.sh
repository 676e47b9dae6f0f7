#!/usr/bin/env bash
# The MPI example on a Slurm cluster: sbatch examples/fashion_mnist/sbatch.sh [example flags]
# Two nodes with 8 ranks each; srun starts one process per rank, and each reads its rank, the
# world size and its local rank from Slurm's environment (SLURM_PROCID, SLURM_NTASKS,
# SLURM_LOCALID) and wires up with the others over PMIx. Adjust the resources to your cluster;
# the build directory must be on a file system every node sees (so must --checkpoint's).
#SBATCH --job-name=ddp-fashion-mnist
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=ddp-fashion-mnist-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1  # the ranks are the parallelism
srun --mpi=pmix build/examples/fashion_mnist/fashion_mnist_mpi --checkpoint "${DDP_CHECKPOINT_DIR:-checkpoints/$SLURM_JOB_NAME}" "$@"
