#!/bin/bash
# Record what a real `slurmd -G` prints for the emulated DGX H100 (the built-in dgx-h100 bundle,
# as docker-slurm/cluster.sh configures it): once with gpuslurm's gres.conf (clean), once with two
# lines added that Slurm warns about. Run as root from the checkout:
#
#   tests/slurm/slurmd_g/capture.sh ROOT NAME    # ROOT: / for the host's Slurm, or a root that
#                                                # tests/helpers/slurm_roots.py made; writes NAME-clean.txt
#                                                # NAME-warnings.txt and NAME-nomunge.txt
#                                                # (clean, munged stopped) beside this script
#
# Everything runs in a private mount namespace with a scratch directory mounted at ROOT/tmp, so the
# paths in the output are the same for every release and a cached root is never written to.
# munged runs there too (24.11 and later refuse `slurmd -G` without it); its socket is AuthInfo's.
set -euo pipefail
root=${1:?usage: capture.sh ROOT NAME}
name=${2:?usage: capture.sh ROOT NAME}
here=$(cd "$(dirname "$0")" && pwd)
checkout=$(cd "$here/../../.." && pwd)
gpuslurm=${GPUSLURM:-$checkout/.venv/bin/gpuslurm}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
w=$scratch/gsg  # /tmp/gsg inside the namespace
mkdir -p "$w/etc" "$w/spool" "$w/munge"
node_line=$("$gpuslurm" node-conf --from dgx-h100 --node-name dgx-h100 | grep '^NodeName=')
"$gpuslurm" gres-conf --from dgx-h100 --node-name dgx-h100 --dev-root /tmp/gsg --output "$w/clean.conf"
{
    cat "$w/clean.conf"
    # A Type the node line lacks, and a ninth GPU of a type it has eight of: both are warnings.
    echo "NodeName=dgx-h100 Name=gpu Type=nvidia_a100 File=/tmp/gsg/dev/nvidia8"
    echo "NodeName=dgx-h100 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/tmp/gsg/dev/nvidia9"
} >"$w/warnings.conf"
cat >"$w/etc/slurm.conf" <<CONF
ClusterName=gpuslurm-test
SlurmctldHost=localhost
AuthType=auth/munge
AuthInfo=socket=/tmp/gsg/munge/munge.socket
SlurmdParameters=config_overrides
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdSpoolDir=/tmp/gsg/spool
SlurmdPidFile=/tmp/gsg/slurmd.pid
$node_line
PartitionName=test Nodes=ALL Default=YES
CONF
head -c 1024 /dev/urandom >"$w/munge/munge.key"
chmod 400 "$w/munge/munge.key"
/usr/bin/unshare -m --propagation private /bin/bash -eu -c '
    root=$1 scratch=$2 out=$3 name=$4
    mount --bind "$scratch" "$root/tmp"
    if [[ $root != / ]]; then
        mount --bind /etc "$root/.host-etc"; mount -t proc proc "$root/proc"; mount --rbind /sys "$root/sys"
        # As the roots run their cluster (no cgroups); 22.05 has no "disabled" and needs no file.
        echo CgroupPlugin=disabled >"$root/tmp/gsg/etc/cgroup.conf"
    fi
    in_root() { /usr/sbin/chroot "$root" "$@"; }
    for i in $(seq 0 9); do mknod -m 666 "$root/tmp/gsg/dev/nvidia$i" c 195 "$i" 2>/dev/null \
        || { mkdir -p "$root/tmp/gsg/dev"; mknod -m 666 "$root/tmp/gsg/dev/nvidia$i" c 195 "$i"; }; done
    in_root /usr/sbin/munged --force --key-file=/tmp/gsg/munge/munge.key \
        --socket=/tmp/gsg/munge/munge.socket --pid-file=/tmp/gsg/munge/munged.pid \
        --log-file=/tmp/gsg/munge/munged.log --seed-file=/tmp/gsg/munge/munged.seed
    for kind in clean warnings; do
        cp "$root/tmp/gsg/$kind.conf" "$root/tmp/gsg/etc/gres.conf"
        rc=0
        in_root env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C \
            /usr/sbin/slurmd -G -f /tmp/gsg/etc/slurm.conf -N dgx-h100 >"$out/$name-$kind.txt" 2>&1 || rc=$?
        echo "$name-$kind: slurmd -G exited $rc"
    done
    kill "$(cat "$root/tmp/gsg/munge/munged.pid")"
    while [[ -e $root/tmp/gsg/munge/munge.socket ]]; do sleep 0.1; done
    cp "$root/tmp/gsg/clean.conf" "$root/tmp/gsg/etc/gres.conf"
    rc=0
    in_root env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C \
        /usr/sbin/slurmd -G -f /tmp/gsg/etc/slurm.conf -N dgx-h100 >"$out/$name-nomunge.txt" 2>&1 || rc=$?
    echo "$name-nomunge (munged stopped): slurmd -G exited $rc"
' capture "$root" "$scratch" "$here" "$name"
