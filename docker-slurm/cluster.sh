#!/usr/bin/env bash
# A one-node Slurm cluster on loopback, configured by gpuslurm from a capture bundle.
#
#   cluster.sh up [--with-slurmdbd] | down | status | env | submit SBATCH-ARGS...
#
# Runs as root on Debian 12 (slurm-wlm, munge; with --with-slurmdbd also slurmdbd and
# mariadb-server). Everything it writes lives in one state directory, except the fake GPU device
# files, which must be in /dev because jobs open them by their real names; fake-devices.sh records
# each one it creates and which cluster holds it, and `down` removes those no other cluster holds. --with-slurmdbd adds accounting: a private MariaDB
# (its own datadir and unix socket under the state directory, no TCP) and slurmdbd on loopback
# (with GPUSLURM_SLURM_ROOT: the root's slurmdbd, the host's MariaDB server).
#
# Environment:
#   GPUSLURM_CLUSTER_DIR         state directory (default /run/gpuslurm-test-cluster)
#   GPUSLURM_BUNDLE              capture bundle dir or built-in name (default dgx-h100)
#   GPUSLURM_BIN                 gpuslurm executable (default: the one beside python3's executable)
#   GPUSLURM_CLUSTER_EXTRA_CONF  file appended to slurm.conf (Prolog=, Epilog=, TaskProlog=, ...)
#   GPUSLURM_CLUSTER_PORT        slurmctld port; slurmd uses the next one, slurmdbd the one after
#                                (default 6817)
#   GPUSLURM_CLUSTER_TIMEOUT     seconds `up` waits for the node to be idle (default 60)
#   GPUSLURM_CLUSTER_CGROUP      CgroupPlugin for cgroup.conf (default autodetect; cgroup/v1 is tested)
#   GPUSLURM_CLUSTER_CONSTRAIN_DEVICES  ConstrainDevices= in cgroup.conf (default yes; "no" leaves
#                                isolation to gpuslurm's own cgroup code)
#   GPUSLURM_GRES_ARGS           extra `gpuslurm gres-conf` options, e.g. "--mps 100"; the GresTypes
#                                line follows the gres names the generated file uses
#   GPUSLURM_CLUSTER_GRES_CONF   use this gres.conf instead of generating one (e.g. one without Cores=)
#   GPUSLURM_SLURM_ROOT          a Debian root with another Slurm release (tests/helpers/slurm_roots.py makes
#                                them): munged, slurmctld and slurmd run chrooted into it, in a mount
#                                namespace of their own (its holder's pid in run/ns.pid) where the
#                                host's /dev, /proc, /sys, /tmp and /run, the host's /etc at /.host-etc and
#                                GPUSLURM_CHECKOUT (this checkout, at /opt/gpuslurm/checkout) and the
#                                directories GPUSLURM_ROOT_BINDS lists (':'-separated; each at its
#                                own path, read-only: the checkout, the test session's Python) are
#                                mounted; the network and pids stay the host's, so clients reach it
#                                on loopback as they do the host's Slurm. Default: the host's Slurm.
#                                With a root, CgroupPlugin autodetect or cgroup/v2 runs Slurm's
#                                cgroup/v2 plugin on this hybrid host, standing in for a host booted
#                                without v1: the cluster gets a cgroup of its own,
#                                /sys/fs/cgroup/unified/gpuslurm-test-<pid> (named in run/cgroup),
#                                bind-mounted at the root's /sys/fs/cgroup; its daemons run in it and
#                                in a cgroup namespace rooted there, and slurmd preloads
#                                GPUSLURM_CLUSTER_PRELOAD (tests/cgroup2_only.c, built with gcc into
#                                run/ when unset), which shows slurmd and slurmstepd only the unified
#                                line of /proc/PID/cgroup. `down` kills what is left in that cgroup
#                                and removes it. CgroupPlugin=disabled runs jobs without cgroups.
#   GPUSLURM_CLUSTER_JOBID_PATHS cgroup.conf's CgroupJobIdPaths= (yes|no; unset: no such line,
#                                Slurm's default; 26.05 names job cgroups s<SLUID> unless yes)
#   GPUSLURM_CLUSTER_PROLOG_FLAGS slurm.conf's PrologFlags= (e.g. RunInJob, Contain; unset: none)
set -euo pipefail

STATE=${GPUSLURM_CLUSTER_DIR:-/run/gpuslurm-test-cluster}
BUNDLE=${GPUSLURM_BUNDLE:-dgx-h100}
EXTRA_CONF=${GPUSLURM_CLUSTER_EXTRA_CONF:-}
CTLD_PORT=${GPUSLURM_CLUSTER_PORT:-6817}
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
TIMEOUT=${GPUSLURM_CLUSTER_TIMEOUT:-60}
CONSTRAIN_DEVICES=${GPUSLURM_CLUSTER_CONSTRAIN_DEVICES:-yes}
GRES_ARGS=${GPUSLURM_GRES_ARGS:-}
GRES_CONF=${GPUSLURM_CLUSTER_GRES_CONF:-}
ROOT=${GPUSLURM_SLURM_ROOT:-}
CHECKOUT=${GPUSLURM_CHECKOUT:-}
ROOT_BINDS=${GPUSLURM_ROOT_BINDS:-}
CGROUP_PLUGIN=${GPUSLURM_CLUSTER_CGROUP:-autodetect}
JOBID_PATHS=${GPUSLURM_CLUSTER_JOBID_PATHS:-}
PROLOG_FLAGS=${GPUSLURM_CLUSTER_PROLOG_FLAGS:-}
PRELOAD=${GPUSLURM_CLUSTER_PRELOAD:-}
PRELOAD_SOURCE=$(dirname "${BASH_SOURCE[0]}")/../tests/cgroup2_only.c
# Slurm's cgroup/v2 plugin from a root, on this hybrid host (see GPUSLURM_SLURM_ROOT above).
V2=""
if [[ -n $ROOT && ($CGROUP_PLUGIN == autodetect || $CGROUP_PLUGIN == cgroup/v2) ]]; then
    V2=1
fi
HOST_CGROUP2=/sys/fs/cgroup/unified

SLURMCTLD=/usr/sbin/slurmctld
SLURMD=/usr/sbin/slurmd
MUNGED=/usr/sbin/munged
SBATCH=/usr/bin/sbatch
SINFO=/usr/bin/sinfo
SQUEUE=/usr/bin/squeue
SCANCEL=/usr/bin/scancel
SLURMDBD=/usr/sbin/slurmdbd
SACCTMGR=/usr/bin/sacctmgr
MARIADBD=/usr/sbin/mariadbd
MARIADB_INSTALL_DB=/usr/bin/mariadb-install-db
MARIADB_ADMIN=/usr/bin/mariadb-admin
CLUSTER_NAME="gpuslurm-test"

ETC=$STATE/etc
CONF=$ETC/slurm.conf
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
LOG=$STATE/log
RUN=$STATE/run
# Accounting (--with-slurmdbd). slurmdbd reads slurmdbd.conf beside $SLURM_CONF; its presence is
# what marks a cluster with accounting. MariaDB's files are owned by the mysql user it runs as.
DBD_CONF=$ETC/slurmdbd.conf
DB_DIR=$STATE/mariadb
DB_SOCKET=$DB_DIR/mariadbd.sock
DB_PIDFILE=$DB_DIR/mariadbd.pid
DB_USER=mysql
WITH_DBD=""
# Set in the daemons' environment (slurmstepd inherits it) so `down` can find stray steps.
MARK_VAR=GPUSLURM_TEST_CLUSTER

# shellcheck source=fake-devices.sh
. "$(dirname "${BASH_SOURCE[0]}")/fake-devices.sh"
. "$(dirname "${BASH_SOURCE[0]}")/mariadb.sh"

NS_PIDFILE=$STATE/run/ns.pid
# With a root: runs a command as root where the daemons run (in_root; the tests' daemon wrappers
# call it). run/cgroup names the cluster's cgroup in the host's cgroup2 tree (v2 only).
NODE_EXEC=$STATE/run/node-exec
CGROUP_FILE=$STATE/run/cgroup
NSENTER=/usr/bin/nsenter
UNSHARE=/usr/bin/unshare

die() { echo "cluster.sh: $*" >&2; exit 1; }
note() { echo "cluster.sh: $*" >&2; }

gpuslurm_bin() {
    if [[ -n ${GPUSLURM_BIN:-} ]]; then
        echo "$GPUSLURM_BIN"
        return
    fi
    local py
    py=$(python3 -c 'import sys; print(sys.executable)')
    echo "$(dirname "$py")/gpuslurm"
}

root_release() {  # the Slurm release of $ROOT (its .gpuslurm-root.json, which slurm_roots.py writes)
    local release
    release=$(sed -n 's/^ *"release": "\([0-9.]*\)".*/\1/p' "$ROOT/.gpuslurm-root.json" | head -n 1)
    [[ -n $release ]] || die "$ROOT/.gpuslurm-root.json names no release"
    echo "$release"
}

slurm_env() {
    in_root env SLURM_CONF="$CONF" "$@"
}

# in_root CMD...: CMD as is with the host's Slurm; with GPUSLURM_SLURM_ROOT, in the cluster's
# namespace and chrooted into the root, so that /usr/sbin/slurmd etc. are the root's.
in_root() {
    if [[ -z $ROOT ]]; then
        "$@"
        return
    fi
    alive "$NS_PIDFILE" || die "the namespace holding $ROOT is gone ($NS_PIDFILE)"
    "$NODE_EXEC" "$@"
}

# The script in_root runs: into the cluster's cgroup (v2), then into its namespaces, chrooted;
# slurmd with the preload library in LD_PRELOAD, set by the last env so that no other program on
# the way loads it (the library drops itself from the LD_PRELOAD of any program but slurmd's).
write_node_exec() {
    local enter_cgroup="" ns_cgroup="" lib=""
    if [[ -n $V2 ]]; then
        # shellcheck disable=SC2016  # for the script
        enter_cgroup=$(printf 'echo $$ >%q || exit 1' "$(<"$CGROUP_FILE")/cgroup.procs")
        ns_cgroup=--cgroup
        lib=$RUN/cgroup2_only.so
    fi
    # shellcheck disable=SC2016  # for the script
    {
        echo '#!/bin/sh'
        echo "# Written by docker-slurm/cluster.sh up: CMD as root where the cluster's daemons run ($ROOT)."
        echo "$enter_cgroup"
        echo 'pre='
        echo "for arg; do case \$arg in */sbin/slurmd) pre=$lib ;; esac; done"
        echo "exec $NSENTER --target=\"\$(cat $NS_PIDFILE)\" --mount $ns_cgroup --root --wd=/ -- \\"
        # shellcheck disable=SC2016  # for the script's shell
        echo '    /bin/sh -c '"'"'if [ -n "$0" ]; then [ "$1" != env ] || shift; exec /usr/bin/env LD_PRELOAD="$0" "$@"; fi; exec "$@"'"'"' "$pre" "$@"'
    } >"$NODE_EXEC.tmp"
    chmod 755 "$NODE_EXEC.tmp"
    mv "$NODE_EXEC.tmp" "$NODE_EXEC"
}

# The preload library for slurmd (v2): GPUSLURM_CLUSTER_PRELOAD, or built here from its source.
install_preload() {
    local lib=$RUN/cgroup2_only.so
    if [[ -n $PRELOAD ]]; then
        cp "$PRELOAD" "$lib.tmp" || die "GPUSLURM_CLUSTER_PRELOAD=$PRELOAD cannot be copied"
    else
        [[ -r $PRELOAD_SOURCE ]] || die "$PRELOAD_SOURCE is missing: set GPUSLURM_CLUSTER_PRELOAD"
        gcc -shared -fPIC -O2 -o "$lib.tmp" "$PRELOAD_SOURCE" -ldl \
            || die "cannot build $PRELOAD_SOURCE with gcc; set GPUSLURM_CLUSTER_PRELOAD"
    fi
    chmod 755 "$lib.tmp"
    mv "$lib.tmp" "$lib"
}

# The cluster's own cgroup in the host's cgroup2 tree (v2): Slurm's system.slice lands inside it.
make_cgroup() {
    local dir
    [[ -n $V2 ]] || return 0
    [[ -s $CGROUP_FILE && -d $(<"$CGROUP_FILE") ]] && return 0
    [[ $(stat -f -c %T "$HOST_CGROUP2" 2>/dev/null) == cgroup2fs ]] \
        || die "no cgroup2 at $HOST_CGROUP2 for Slurm's cgroup/v2 plugin; set GPUSLURM_CLUSTER_CGROUP=disabled"
    dir=$HOST_CGROUP2/gpuslurm-test-$$
    mkdir "$dir" || die "cannot make the cluster's cgroup $dir"
    echo "$dir" >"$CGROUP_FILE"
}

remove_cgroup() {
    local dir i
    [[ -s $CGROUP_FILE ]] || return 0
    dir=$(<"$CGROUP_FILE")
    if [[ $dir != "$HOST_CGROUP2"/gpuslurm-test-* || ! -d $dir ]]; then
        rm -f "$CGROUP_FILE"
        return 0
    fi
    # Whatever is still in it (slurmstepd's sleeper, a job's stray process): killed, the kernel's way.
    [[ ! -e $dir/cgroup.kill ]] || echo 1 >"$dir/cgroup.kill" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [[ -z $(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null) ]] && break
        sleep 0.1
    done
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    if [[ -d $dir ]]; then
        note "left $dir: still in use"
    else
        rm -f "$CGROUP_FILE"
    fi
}

# The mount namespace the root's daemons run in: a process chrooted into the root that sleeps, its
# pid in $NS_PIDFILE; the namespace lives as long as it or any daemon does.
start_namespace() {
    local i
    [[ -n $ROOT ]] || return 0
    alive "$NS_PIDFILE" && return 0
    make_cgroup
    [[ -z $V2 ]] || install_preload
    write_node_exec
    # shellcheck disable=SC2016  # expanded by the inner shell
    local setup='set -e; r=$1
        mount --rbind /dev "$r/dev"; mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"
        mount --rbind /tmp "$r/tmp"; mount --rbind /run "$r/run"
        if [[ -n $4 ]]; then mount --bind "$4" "$r/sys/fs/cgroup"; fi
        mount --bind /etc "$r/.host-etc"; mount -o remount,bind,ro "$r/.host-etc"
        if [[ -n $2 ]]; then mount --bind "$2" "$r/opt/gpuslurm/checkout"; mount -o remount,bind,ro "$r/opt/gpuslurm/checkout"; fi
        IFS=: read -ra binds <<<"$3"
        for dir in "${binds[@]}"; do
            [[ -d $dir ]] || continue
            mkdir -p "$r$dir"; mount --bind "$dir" "$r$dir"; mount -o remount,bind,ro "$r$dir"
        done
        exec /usr/sbin/chroot "$r" /bin/sleep infinity'
    # v2: the holder enters the cluster's cgroup before it makes its cgroup namespace, which is
    # then rooted there.
    local cgroup="" enter='exec "$@"'
    if [[ -n $V2 ]]; then
        cgroup=$(<"$CGROUP_FILE")
        # shellcheck disable=SC2016  # expanded by the inner shell
        enter='echo $$ >"$0/cgroup.procs" && exec "$@"'
    fi
    env "$MARK_VAR=$STATE" setsid /bin/bash -c "$enter" "$cgroup" \
        "$UNSHARE" --mount ${V2:+--cgroup} --propagation private -- /bin/bash -c "$setup" ns \
        "$ROOT" "$CHECKOUT" "$ROOT_BINDS" "$cgroup" </dev/null >>"$LOG/namespace.log" 2>&1 &
    echo $! >"$NS_PIDFILE"
    for ((i = 0; i < 100; i++)); do
        # Set up and chrooted once the holder is sleep itself.
        [[ $(cat "/proc/$(<"$NS_PIDFILE")/comm" 2>/dev/null) == sleep ]] && return 0
        alive "$NS_PIDFILE" || break
        sleep 0.1
    done
    die "the namespace for $ROOT did not start; $LOG/namespace.log says: $(tail -n 5 "$LOG/namespace.log")"
}

alive() {  # alive PIDFILE: the pid in PIDFILE is a running process
    local pid stat
    [[ -s $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    # not a zombie: an init that reaps late leaves a stopped daemon passing kill -0 for a while
    stat=$(<"/proc/$pid/stat") 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE [SECONDS]: SIGTERM, then SIGKILL after SECONDS (10)
    local name=$1 file=$2 wait=${3:-10} pid i
    alive "$file" || { rm -f "$file"; return 0; }
    pid=$(<"$file")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        note "$name (pid $pid) ignored SIGTERM; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

check_prerequisites() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd, munged and mknod need it)"
    local bin
    if [[ -n $ROOT ]]; then
        [[ -s $ROOT/.gpuslurm-root.json ]] || die "$ROOT is not a finished root: python3 tests/helpers/slurm_roots.py build RELEASE"
        for bin in "$SLURMCTLD" "$SLURMD" "$MUNGED" "$SBATCH" "$SINFO"; do
            [[ -x $ROOT$bin ]] || die "$ROOT$bin is missing: rebuild the root"
        done
        [[ -x $NSENTER && -x $UNSHARE ]] || die "$NSENTER and $UNSHARE are needed (util-linux)"
        [[ -x $(gpuslurm_bin) ]] || die "$(gpuslurm_bin) is not executable: set GPUSLURM_BIN"
        [[ -n $WITH_DBD ]] || return 0
        # The root's slurmdbd and sacctmgr; the host's MariaDB server (a private one, as below).
        for bin in "$SLURMDBD" "$SACCTMGR"; do
            [[ -x $ROOT$bin ]] || die "$ROOT$bin is missing: rebuild the root (tests/helpers/slurm_roots.py)"
        done
        check_mariadb
        return 0
    fi
    for bin in "$SLURMCTLD" "$SLURMD" "$MUNGED" "$SBATCH" "$SINFO"; do
        [[ -x $bin ]] || die "$bin is missing: apt-get install -y slurm-wlm munge"
    done
    [[ -x $(gpuslurm_bin) ]] || die "$(gpuslurm_bin) is not executable: set GPUSLURM_BIN"
    [[ -n $WITH_DBD ]] || return 0
    for bin in "$SLURMDBD" "$SACCTMGR"; do
        [[ -x $bin ]] || die "$bin is missing: apt-get install -y slurmdbd mariadb-server"
    done
    check_mariadb
}

check_mariadb() {
    local bin
    for bin in "$MARIADBD" "$MARIADB_INSTALL_DB" "$MARIADB_ADMIN"; do
        [[ -x $bin ]] || die "$bin is missing: apt-get install -y mariadb-server"
    done
    id -u "$DB_USER" >/dev/null 2>&1 || die "no user $DB_USER to run MariaDB as (mariadb-server makes it)"
}

# --- configuration -------------------------------------------------------------------------------

write_configs() {
    local host=$1 gpuslurm node_line
    gpuslurm=$(gpuslurm_bin)
    mkdir -p "$ETC" "$LOG" "$RUN" "$STATE/spool/ctld" "$STATE/spool/slurmd"
    # With a root, gres.conf (MIG Types, Cores=) and the node line for the root's Slurm release, not
    # the host's slurmd -V (22.05): 24.11 and later refuse Cores= that split a socket.
    node_line=$("$gpuslurm" node-conf --from "$BUNDLE" --node-name "$host" \
                    ${ROOT:+--slurm-version "$(root_release)"} | grep '^NodeName=') \
        || die "gpuslurm node-conf --from $BUNDLE failed"
    # Loopback only: slurmctld must reach this slurmd at 127.0.0.1 whatever the host name resolves to.
    node_line="${node_line/NodeName=$host /NodeName=$host NodeAddr=127.0.0.1 }"
    if [[ -n $GRES_CONF ]]; then
        [[ -r $GRES_CONF ]] || die "GPUSLURM_CLUSTER_GRES_CONF=$GRES_CONF is not readable"
        cp "$GRES_CONF" "$ETC/gres.conf"
    else
        # shellcheck disable=SC2086  # GRES_ARGS is a list of options
        "$gpuslurm" gres-conf --from "$BUNDLE" --node-name "$host" $GRES_ARGS --output "$ETC/gres.conf" \
            ${ROOT:+--slurm-version "$(root_release)"} \
            || die "gpuslurm gres-conf --from $BUNDLE $GRES_ARGS failed"
    fi
    local gres_types
    gres_types=$(grep -o '\bName=[a-z]*' "$ETC/gres.conf" | cut -d= -f2 | sort -u | paste -sd, -)
    [[ -n $gres_types ]] || die "$ETC/gres.conf names no gres"
    # Slurm counts gres of every type the node line names; add them to the node's Gres=.
    local extra
    for extra in mps shard; do
        if [[ ,$gres_types, == *,$extra,* && $node_line != *"$extra:"* ]]; then
            local count=0 n
            for n in $(grep -o "Name=$extra .*Count=[0-9]*" "$ETC/gres.conf" | grep -o '[0-9]*$'); do
                count=$((count + n))
            done
            node_line=$(sed -E "s/(Gres=[^ ]*)/\1,$extra:$count/" <<<"$node_line")
        fi
    done

    {
        echo "# Generated by docker-slurm/cluster.sh from bundle $BUNDLE; rewritten by every fresh 'up'."
        echo "ClusterName=$CLUSTER_NAME"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$MUNGE_SOCKET"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$STATE/spool/ctld"
        echo "SlurmdSpoolDir=$STATE/spool/slurmd"
        echo "SlurmctldPidFile=$RUN/slurmctld.pid"
        echo "SlurmdPidFile=$RUN/slurmd.pid"
        echo "SlurmctldLogFile=$LOG/slurmctld.log"
        echo "SlurmdLogFile=$LOG/slurmd.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        # The node line describes the bundle's machine (a DGX H100), not this one.
        echo "SlurmdParameters=config_overrides"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "GresTypes=$gres_types"
        if [[ $CGROUP_PLUGIN == disabled ]]; then
            # No cgroups at all: processes tracked through their parents, no task/cgroup.
            echo "ProctrackType=proctrack/linuxproc"
            echo "TaskPlugin=task/affinity"
        else
            echo "ProctrackType=proctrack/cgroup"
            echo "TaskPlugin=task/cgroup,task/affinity"
        fi
        # The root's plugins, for the daemons inside it and the root's clients run on the host
        # alike (the root's own path leads back to its top inside it).
        [[ -z $ROOT ]] || echo "PluginDir=$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm"
        echo "JobAcctGatherType=jobacct_gather/none"
        if [[ -n $WITH_DBD ]]; then
            echo "AccountingStorageType=accounting_storage/slurmdbd"
            echo "AccountingStorageHost=127.0.0.1"
            echo "AccountingStoragePort=$DBD_PORT"
            # Clients reach slurmdbd through the munge socket named here, not AuthInfo's.
            echo "AccountingStoragePass=$MUNGE_SOCKET"
        else
            echo "AccountingStorageType=accounting_storage/none"
        fi
        echo "MpiDefault=none"
        echo "MailProg=/bin/true"
        echo "ReturnToService=2"
        echo "SlurmdTimeout=30"
        echo "KillWait=2"
        echo "InactiveLimit=0"
        echo "MinJobAge=300"
        [[ -z $PROLOG_FLAGS ]] || echo "PrologFlags=$PROLOG_FLAGS"
        if [[ -n $EXTRA_CONF ]]; then
            [[ -r $EXTRA_CONF ]] || die "GPUSLURM_CLUSTER_EXTRA_CONF=$EXTRA_CONF is not readable"
            echo "# --- from $EXTRA_CONF"
            cat "$EXTRA_CONF"
            echo "# --- end of $EXTRA_CONF"
        fi
        echo "$node_line"
        echo "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"

    if [[ -n $WITH_DBD ]]; then
        write_dbd_conf "$host"
    else
        rm -f "$DBD_CONF"
    fi

    # Only devices are constrained: the bundle's cores and memory do not exist on this machine.
    # CgroupAutomount is defunct from 24.05 (the roots' releases log an error for it).
    # v2 (a root): no systemd to make the stepd scope (slurmd makes it), no controller to enable
    # (the host's cgroup2 has none; devices need none: Slurm confines them with BPF).
    {
        echo "CgroupPlugin=$CGROUP_PLUGIN"
        echo "CgroupMountpoint=/sys/fs/cgroup"
        [[ -n $ROOT ]] || echo "CgroupAutomount=yes"
        echo "ConstrainDevices=$CONSTRAIN_DEVICES"
        echo "ConstrainCores=no"
        echo "ConstrainRAMSpace=no"
        echo "ConstrainSwapSpace=no"
        if [[ -n $V2 ]]; then
            echo "IgnoreSystemd=yes"
            echo "IgnoreSystemdOnFailure=yes"
            echo "EnableControllers=no"
        fi
        [[ -z $JOBID_PATHS ]] || echo "CgroupJobIdPaths=$JOBID_PATHS"
    } >"$ETC/cgroup.conf"
}

write_dbd_conf() {
    # slurmdbd refuses a slurmdbd.conf others can read (it may hold a database password; this one
    # does not: MariaDB's root is reached through its socket, authenticated as the OS user root).
    (umask 077 && cat >"$DBD_CONF.tmp" <<EOF
# Generated by docker-slurm/cluster.sh up --with-slurmdbd; rewritten by every fresh 'up'.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$1
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
# localhost: the client library's unix socket, which MYSQL_UNIX_PORT points at ours
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DBD_CONF.tmp"
    mv "$DBD_CONF.tmp" "$DBD_CONF"
}

# --- fake GPU devices ----------------------------------------------------------------------------

make_devices() {
    # Every device file gres.conf names (File=, or each of MultipleFiles=), shared with the PBS
    # test cluster through fake-devices.sh's ledger.
    fake_devices_from_gres "slurm:$STATE" "$ETC/gres.conf" || die "cannot make the fake GPU device files"
}

remove_devices() {
    fake_devices_release "slurm:$STATE"
}

remove_cgroups() {
    local dir
    for dir in /sys/fs/cgroup/*/"slurm_$(hostname -s)"; do
        [[ -d $dir ]] || continue
        find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || note "left $dir: still in use"
    done
}

# --- daemons -------------------------------------------------------------------------------------

start_munged() {
    alive "$RUN/munged.pid" && return 0
    mkdir -p /run/munge "$MUNGE_DIR"
    # Other users' sbatch must reach the socket; the key itself stays root-only.
    chmod 755 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        (umask 077 && head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key")
    fi
    chmod 400 "$MUNGE_DIR/munge.key"
    # --force: munged refuses a socket directory it did not expect unless forced; as root it
    # only warns about running as root.
    in_root env "$MARK_VAR=$STATE" "$MUNGED" --force --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$RUN/munged.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
        || die "munged failed to start: $(tail -n 5 "$LOG/munged.log" 2>/dev/null)"
}

port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_daemon() {  # start_daemon NAME BINARY PIDFILE ARGS...
    local name=$1 bin=$2 pidfile=$3 i
    shift 3
    alive "$pidfile" && return 0
    in_root env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" "$bin" -f "$CONF" "$@" \
        || die "$name failed to start; last lines of its log:"$'\n'"$(tail -n 20 "$LOG/$name.log" 2>/dev/null)"
    for ((i = 0; i < 50; i++)); do
        alive "$pidfile" && return 0
        sleep 0.1
    done
    die "$name did not write $pidfile; last lines of its log:"$'\n'"$(tail -n 20 "$LOG/$name.log" 2>/dev/null)"
}

# --- accounting (--with-slurmdbd) ----------------------------------------------------------------

sacctmgr() {
    slurm_env timeout 30 "$SACCTMGR" "$@"
}

start_slurmdbd() {
    local i said=""
    if ! alive "$RUN/slurmdbd.pid"; then
        # MYSQL_UNIX_PORT: the client library's socket for StorageHost=localhost. With a root, its
        # slurmdbd (and its client library) in the cluster's namespace, which sees the host's
        # MariaDB socket under $STATE (/tmp and /run are the host's there).
        in_root env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" MYSQL_UNIX_PORT="$DB_SOCKET" "$SLURMDBD" \
            || die "slurmdbd failed to start; last lines of its log:"$'\n'"$(tail -n 20 "$LOG/slurmdbd.log" 2>/dev/null)"
    fi
    # Answering sacctmgr means it has its database and its port.
    for ((i = 0; i < TIMEOUT * 2; i++)); do
        said=$(sacctmgr -n -P show cluster format=cluster 2>&1) && return 0
        alive "$RUN/slurmdbd.pid" || ((i < 20)) || break
        sleep 0.5
    done
    die "slurmdbd does not answer sacctmgr ($said); last lines of its log:"$'\n'"$(tail -n 20 "$LOG/slurmdbd.log" 2>/dev/null)"
}

register_cluster() {
    local out
    [[ -n $(sacctmgr -n -P show cluster "$CLUSTER_NAME" format=cluster) ]] && return 0
    out=$(sacctmgr -i add cluster "$CLUSTER_NAME" 2>&1) || die "sacctmgr add cluster $CLUSTER_NAME failed: $out"
    # From 23.02 slurmctld keeps a ClusterID in StateSaveLocation and stops ("CLUSTER ID
    # MISMATCH") when slurmdbd knows the cluster by another: a cluster first run without
    # accounting made one of its own. The database was just made, so the state's ID is stale.
    rm -f "$STATE/spool/ctld/clustername"
}

node_state() {
    slurm_env "$SINFO" -h -N -n "$1" -o '%T' 2>/dev/null | head -n 1
}

wait_idle() {  # wait_idle HOST [ACCEPTED-STATE-REGEX]
    local host=$1 accept=${2:-idle} deadline state=""
    deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        state=$(node_state "$host" || true)
        [[ $state =~ ^($accept)$ ]] && return 0
        sleep 0.5
    done
    {
        echo "cluster.sh: node $host is not idle after ${TIMEOUT}s (sinfo says: ${state:-nothing})"
        echo "--- $LOG/slurmctld.log (last 20 lines)"
        tail -n 20 "$LOG/slurmctld.log" 2>/dev/null || true
        echo "--- $LOG/slurmd.log (last 20 lines)"
        tail -n 20 "$LOG/slurmd.log" 2>/dev/null || true
    } >&2
    exit 1
}

cmd_up() {
    local host slurm_running=""
    if [[ ${1:-} == --with-slurmdbd ]]; then
        WITH_DBD=1
        shift
    fi
    [[ $# -eq 0 ]] || die "up: unexpected argument $1"
    if alive "$RUN/slurmctld.pid" || alive "$RUN/slurmd.pid"; then
        slurm_running=1
    fi
    # A running cluster keeps the configuration it was started with.
    if [[ -n $slurm_running && -e $DBD_CONF ]]; then
        WITH_DBD=1
    elif [[ -n $slurm_running && -n $WITH_DBD ]]; then
        die "the running cluster ($STATE) has no accounting; run 'down' before 'up --with-slurmdbd'"
    fi
    check_prerequisites
    host=$(hostname -s)
    mkdir -p "$STATE" "$RUN" "$LOG"
    chmod 755 "$STATE"
    if alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid" && alive "$RUN/munged.pid" \
        && { [[ -z $WITH_DBD ]] || { alive "$RUN/slurmdbd.pid" && alive "$DB_PIDFILE"; }; }; then
        # A running cluster may have jobs: the node only has to be responding.
        wait_idle "$host" 'idle|mixed|allocated|completing'
        note "already up ($STATE)"
        return 0
    fi
    if [[ -z $slurm_running ]]; then
        local port ports=("$CTLD_PORT" "$SLURMD_PORT")
        [[ -z $WITH_DBD ]] || alive "$RUN/slurmdbd.pid" || ports+=("$DBD_PORT")
        for port in "${ports[@]}"; do
            ! port_in_use "$port" || die "port $port is in use (another Slurm?); set GPUSLURM_CLUSTER_PORT"
        done
        write_configs "$host"
    fi
    make_devices
    start_namespace
    start_munged
    if [[ -n $WITH_DBD ]]; then
        # Before slurmctld, so that it finds its cluster registered when it connects.
        start_mariadb
        start_slurmdbd
        register_cluster
    fi
    start_daemon slurmctld "$SLURMCTLD" "$RUN/slurmctld.pid"
    start_daemon slurmd "$SLURMD" "$RUN/slurmd.pid" -N "$host"
    if [[ -n $slurm_running ]]; then
        # slurmd restarted under a running slurmctld: jobs may still run on the node
        wait_idle "$host" 'idle|mixed|allocated|completing'
    else
        wait_idle "$host"
    fi
    note "up: node $host idle${WITH_DBD:+, accounting in slurmdbd}; export SLURM_CONF=$CONF"
}

# Processes whose environment has the line LINE (and, given PREFIX, a line starting with PREFIX),
# outside this script's own process group: its subshells inherit the caller's environment.
pids_with_env() {
    local line=$1 prefix=${2:-} mypgid pid pgid env
    mypgid=$(ps -o pgid= -p $$ | tr -d ' ')
    while read -r pid pgid; do
        [[ $pgid == "$mypgid" ]] && continue
        # Kernel threads and processes that just exited have no readable environ.
        env=$( { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null ) || continue
        grep -qxF -- "$line" <<<"$env" || continue
        [[ -z $prefix ]] || grep -q "^$prefix" <<<"$env" || continue
        echo "$pid"
    done < <(ps -e -o pid=,pgid=)
}

cmd_down() {
    local i pids
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    if alive "$RUN/slurmctld.pid"; then
        # Cancel jobs first: slurmd does not take its jobs' slurmstepd down with it.
        local jobs
        jobs=$(slurm_env "$SQUEUE" -h -o %i 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $jobs ]] || slurm_env "$SCANCEL" --quiet $jobs 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -z $(slurm_env "$SQUEUE" -h -o %i -t PD,R,CG,S 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    stop_pidfile slurmd "$RUN/slurmd.pid"
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
    # After slurmctld, which sends its last job records to slurmdbd as it stops.
    stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
    # InnoDB flushes on SIGTERM; give it longer than the Slurm daemons before SIGKILL.
    stop_pidfile mariadbd "$DB_PIDFILE" 60
    # Stray slurmstepd (marked via slurmd's environment) and job tasks (submitted with our SLURM_CONF).
    pids=$( { pids_with_env "$MARK_VAR=$STATE"; pids_with_env "SLURM_CONF=$CONF" SLURM_JOB_ID=; } | sort -u)
    pids=$(grep -vxF "$(cat "$RUN/munged.pid" 2>/dev/null || echo none)" <<<"$pids" || true)
    if [[ -n $pids ]]; then
        note "killing leftover processes: ${pids//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    stop_pidfile munged "$RUN/munged.pid"
    stop_pidfile namespace "$NS_PIDFILE" 2
    remove_devices
    remove_cgroups
    remove_cgroup
    note "down ($STATE)"
}

cmd_status() {
    local name pidfile rc=0
    local names=(munged slurmctld slurmd)
    [[ ! -e $DBD_CONF ]] || names+=(mariadbd slurmdbd)
    for name in "${names[@]}"; do
        pidfile=$RUN/$name.pid
        [[ $name != mariadbd ]] || pidfile=$DB_PIDFILE
        if alive "$pidfile"; then
            echo "$name: running, pid $(<"$pidfile")"
        else
            echo "$name: not running"
            rc=3
        fi
    done
    echo "SLURM_CONF=$CONF"
    if alive "$RUN/slurmctld.pid"; then
        slurm_env "$SINFO" -N -o '%N %T %c %G' || rc=3
        slurm_env "$SQUEUE" || true
    fi
    return "$rc"
}

main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        env) echo "export SLURM_CONF=$CONF" ;;
        submit) slurm_env "$SBATCH" "$@" ;;
        *) die "usage: cluster.sh up [--with-slurmdbd] | down | status | env | submit SBATCH-ARGS..." ;;
    esac
}

main "$@"
