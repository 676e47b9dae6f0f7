#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (slurm-wlm, munge), and the MPI
# example and suites run through it with srun: each rank's rank, world size and local rank come
# from Slurm's environment (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), the processes wire up over
# PMIx. Not part of the test command (its time budget); run it as root:
#   scripts/slurm-one-node.sh [build-dir]      # needs ddp_mpi_test and fashion_mnist_mpi built
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge > /dev/null
node=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
state=/tmp/ddp-slurm
mkdir -p "$state" /etc/slurm /var/log/slurm
# munge authenticates slurmctld, slurmd and srun to each other.
[ -s /etc/munge/munge.key ] || (mungekey --create 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null)
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged > /dev/null || runuser -u munge -- /usr/sbin/munged
# No cgroups in a container: track processes by their parent, no task confinement.
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ddp
SlurmctldHost=$node
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmdSpoolDir=$state/slurmd
StateSaveLocation=$state/ctld
SlurmUser=root
MpiDefault=pmix
ReturnToService=2
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
pkill -x slurmctld || true; pkill -x slurmd || true
slurmctld -i -L /var/log/slurm/slurmctld.log
slurmd -L /var/log/slurm/slurmd.log
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
source scripts/openblas-env.sh
echo "== where each rank sits, from Slurm's environment"
srun --ntasks 2 --overcommit bash -c 'echo "SLURM_PROCID=$SLURM_PROCID SLURM_NTASKS=$SLURM_NTASKS SLURM_LOCALID=$SLURM_LOCALID"'
echo "== the MPI suites through srun (PMIx)"
srun --ntasks 2 --overcommit "$build/tests/ddp_mpi_test" --minimal
echo "== the MPI example through srun"
srun --ntasks 2 --overcommit "$build/examples/fashion_mnist/fashion_mnist_mpi" --epochs 1 --no-progress
echo "== examples/fashion_mnist/sbatch.sh as a batch job (one node, 2 tasks), twice: the second resumes"
rm -rf "$state/ckpt"
for run in 1 2; do
  sbatch --wait --nodes 1 --ntasks-per-node 2 --overcommit --output "$state/sbatch-%j.out" \
         --export "ALL,DDP_CHECKPOINT_DIR=$state/ckpt" examples/fashion_mnist/sbatch.sh --epochs "$run" --no-progress
done
tail -n 4 "$state"/sbatch-*.out
