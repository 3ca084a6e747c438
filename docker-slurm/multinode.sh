#!/usr/bin/env bash
# A multi-node Slurm test cluster in namespaces: one slurmctld and N slurmd nodes on 192.0.2.0/24.
#
#   multinode.sh up | down | status | monitors | monitors-down | ctl CMD... | node NODE CMD...
#
# Runs as root, with the host's Slurm (slurm-wlm, munge) and iproute2/util-linux. Nothing it makes
# touches the host's network, /dev or /etc: every address, device file and hosts file lives in
# namespaces it creates, held by one `sleep` process each (pid in run/<name>.pid), and gone when
# those holders and the daemons in them are.
#
#   controller  net+UTS+mount namespace: hostname mn-ctl, a bridge mnbr0 at 192.0.2.1/24, slurmctld
#   mnodeI      net+UTS+mount namespace: eth0 at 192.0.2.(10+I)/24, a veth whose other end is on the
#               controller's bridge; its own /dev (a tmpfs with the basic devices and the fake GPU
#               device files its bundle's gres.conf lines name), its own hooks (bind-mounted at
#               $STATE/hooks), its own run, state, spool and log directories under nodes/mnodeI;
#               slurmd -N mnodeI (Debian's slurmd is built with multiple-slurmd support, so one
#               slurm.conf names them all: %n in the spool, pid and log paths, cgroups slurm_%n)
#   hosts       /etc/hosts in every namespace: the controller and each node (bind-mounted)
#   plugin      plugins/job_submit.lua beside slurm.conf (JobSubmitPlugins=lua); its throttle file,
#               $STATE/etc/gpuslurm-throttle, is absent until a test writes it
#
# mnode2's hostname is an FQDN (mnode2.cluster.test, its NodeHostname), the others' their NodeName.
# One munged on the host serves them all (one key; its socket is a path, reachable from every
# network namespace). Clients reach slurmctld only from its namespace: `multinode.sh ctl sbatch ...`
# (or run/ctl-exec CMD..., which the tests use).
#
# `monitors` starts gpuslurm's monitor on each node (in the node's namespaces, replaying its bundle
# and $STATE/nodes/mnodeI/scenario.json, its exporter on the node's own address, port 9402, its
# violations in the one directory $STATE/violations that every node writes, as a site's NFS
# would be) and, when /usr/bin/prometheus is installed, one Prometheus in the controller's
# namespace (192.0.2.1:9090) scraping the three exporters over the bridge every second.
# `monitors-down` stops them; `down` does too.
#
# Environment:
#   GPUSLURM_MULTINODE_DIR      state directory (default /run/gpuslurm-test-multinode)
#   GPUSLURM_MULTINODE_BUNDLES  one capture bundle per node, space-separated (built-in names or
#                               absolute directories; default "dgx-h100 l40s-4x a100-mig"); each is
#                               copied to nodes/mnodeI/bundle, which that node's hooks replay
#   GPUSLURM_BIN                gpuslurm executable (default: the one beside python3's executable)
#   GPUSLURM_MULTINODE_TIMEOUT  seconds `up` waits for every node to be idle (default 90)
#   GPUSLURM_MULTINODE_EXTRA_CONF  file appended to slurm.conf before the node lines
#   GPUSLURM_MULTINODE_PROMETHEUS  the Prometheus `monitors` runs (default /usr/bin/prometheus;
#                               none when it is not executable)
#   GPUSLURM_MULTINODE_PYTHON   the interpreter the installed hooks run (`gpuslurm install --python`);
#                               the task prolog runs as the job's user, who must be able to run it
#                               (default: the one running gpuslurm; with a root, the root's venv)
#   GPUSLURM_MULTINODE_SLURMDBD  1 (default): accounting, one slurmdbd in the controller's namespaces
#                               (192.0.2.1:6819) on a private MariaDB of the host's (its own datadir
#                               and unix socket under $STATE/mariadb, no TCP), as cluster.sh
#                               --with-slurmdbd makes it; 0: none (AccountingStorageType=none)
#   GPUSLURM_SLURM_ROOT         a Debian root with another Slurm release (tests/helpers/slurm_roots.py
#                               makes them; docs/compatibility.md): every namespace then mounts the root's
#                               /dev (the node's own), /proc, /sys, /tmp, /run, the host's /etc at
#                               /.host-etc, GPUSLURM_CHECKOUT at /opt/gpuslurm/checkout and the
#                               directories GPUSLURM_ROOT_BINDS lists (':'-separated), read-only, and
#                               munged, slurmctld, slurmd, Slurm's clients and the monitors run
#                               chrooted into it (`ctl`, `node`, run/ctl-exec too; only `ip` and
#                               Prometheus run in the host's view). The hooks are installed inside it,
#                               for the root's venv. Slurm runs its cgroup/v2 plugin there, as
#                               docker-slurm/cluster.sh does on this hybrid host: each node gets a
#                               cgroup of its own, /sys/fs/cgroup/unified/gpuslurm-mn-<node>-<pid>
#                               (named in run/cgroup-<node>), a cgroup namespace rooted there, bound
#                               at the root's /sys/fs/cgroup, and its slurmd preloads
#                               GPUSLURM_CLUSTER_PRELOAD (tests/cgroup2_only.c, built with gcc when
#                               unset); `down` kills what is left in those cgroups and removes them.
set -euo pipefail

STATE=${GPUSLURM_MULTINODE_DIR:-/run/gpuslurm-test-multinode}
read -ra BUNDLES <<<"${GPUSLURM_MULTINODE_BUNDLES:-dgx-h100 l40s-4x a100-mig}"
TIMEOUT=${GPUSLURM_MULTINODE_TIMEOUT:-90}
EXTRA_CONF=${GPUSLURM_MULTINODE_EXTRA_CONF:-}
HOOKS_PYTHON=${GPUSLURM_MULTINODE_PYTHON:-}
PLUGIN=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../plugins/job_submit.lua
PROMETHEUS=${GPUSLURM_MULTINODE_PROMETHEUS:-/usr/bin/prometheus}
WITH_DBD=${GPUSLURM_MULTINODE_SLURMDBD:-1}
[[ $WITH_DBD == 1 ]] || WITH_DBD=""
ROOT=${GPUSLURM_SLURM_ROOT:-}
CHECKOUT=${GPUSLURM_CHECKOUT:-}
ROOT_BINDS=${GPUSLURM_ROOT_BINDS:-}
PRELOAD=${GPUSLURM_CLUSTER_PRELOAD:-}
PRELOAD_SOURCE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../tests/cgroup2_only.c
ROOT_PYTHON=/opt/gpuslurm/venv/bin/python  # tests/helpers/slurm_roots.py VENV_PYTHON
HOST_CGROUP2=/sys/fs/cgroup/unified
if [[ -n $ROOT && -z $HOOKS_PYTHON ]]; then
    HOOKS_PYTHON=$ROOT_PYTHON
fi

NET=192.0.2
CTL_ADDR=$NET.1
CTL_NAME=mn-ctl
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819
EXPORTER_PORT=9402
PROM_PORT=9090
BRIDGE=mnbr0
CLUSTER_NAME=gpuslurm-mn
FQDN_NODE=2  # this node's hostname is an FQDN, not its NodeName
FQDN_DOMAIN=cluster.test

SLURMCTLD=/usr/sbin/slurmctld
SLURMD=/usr/sbin/slurmd
MUNGED=/usr/sbin/munged
SINFO=/usr/bin/sinfo
SQUEUE=/usr/bin/squeue
SCANCEL=/usr/bin/scancel
IP=/usr/sbin/ip
SLURMDBD=/usr/sbin/slurmdbd
SACCTMGR=/usr/bin/sacctmgr
MARIADBD=/usr/sbin/mariadbd
MARIADB_INSTALL_DB=/usr/bin/mariadb-install-db
MARIADB_ADMIN=/usr/bin/mariadb-admin
DB_USER=mysql
NSENTER=/usr/bin/nsenter
UNSHARE=/usr/bin/unshare

ETC=$STATE/etc
CONF=$ETC/slurm.conf
RUN=$STATE/run
LOG=$STATE/log
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
VIOLATIONS=$STATE/violations  # every node's monitor writes here (a site's shared directory)
PROM_DIR=$STATE/prometheus
HOOKS=$STATE/hooks  # an empty directory here; each node's own hooks are mounted on it
DBD_CONF=$ETC/slurmdbd.conf
DB_DIR=$STATE/mariadb
DB_SOCKET=$DB_DIR/mariadbd.sock
DB_PIDFILE=$DB_DIR/mariadbd.pid
MARK_VAR=GPUSLURM_TEST_CLUSTER  # in every daemon's environment (slurmstepd inherits it)

die() { echo "multinode.sh: $*" >&2; exit 1; }
note() { echo "multinode.sh: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/mariadb.sh"

node_name() { echo "mnode$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }
node_host() {
    if (($1 == FQDN_NODE)); then echo "mnode$1.$FQDN_DOMAIN"; else echo "mnode$1"; fi
}
node_dir() { echo "$STATE/nodes/mnode$1"; }
node_count() { echo "${#BUNDLES[@]}"; }

gpuslurm_bin() {
    if [[ -n ${GPUSLURM_BIN:-} ]]; then
        echo "$GPUSLURM_BIN"
        return
    fi
    echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/gpuslurm"
}

pid_alive() {  # pid_alive PID: a running process, not a zombie (this host's init may reap late)
    local stat
    [[ $1 =~ ^[0-9]+$ ]] || return 1
    stat=$(<"/proc/$1/stat") 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

alive() {  # alive PIDFILE: the pid in PIDFILE is a running process
    local pid
    [[ -s $1 ]] || return 1
    pid=$(<"$1") 2>/dev/null || return 1
    pid_alive "$pid"
}

stop_pid() {  # stop_pid NAME PID [SECONDS]: SIGTERM, then SIGKILL after SECONDS (10)
    local name=$1 pid=$2 wait=${3:-10} i
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    # the process, not its pid file: Slurm's daemons remove theirs before they are done
    for ((i = 0; i < wait * 10; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    note "$name (pid $pid) ignored SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE [SECONDS]: stop_pid on the pid it names, then remove it
    local pid
    pid=$(<"$2") 2>/dev/null || pid=""
    [[ -z $pid ]] || stop_pid "$1" "$pid" "${3:-10}"
    rm -f "$2"
}

# in_ns HOLDER CMD...: CMD in the holder's network, UTS and mount namespaces; with a root,
# chrooted into it (the holder's own root), so that Slurm's programs are the root's.
in_ns() {
    local holder=$1
    shift
    alive "$RUN/$holder.pid" || die "the namespace $holder is gone ($RUN/$holder.pid)"
    "$NSENTER" --target="$(<"$RUN/$holder.pid")" --net --uts --mount ${ROOT:+--root --wd} -- "$@"
}

# in_host_ns HOLDER CMD...: the same namespaces, the host's programs (ip, Prometheus), never chrooted.
in_host_ns() {
    local holder=$1
    shift
    alive "$RUN/$holder.pid" || die "the namespace $holder is gone ($RUN/$holder.pid)"
    "$NSENTER" --target="$(<"$RUN/$holder.pid")" --net --uts --mount -- "$@"
}

check_prerequisites() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (namespaces, slurmd, munged, mknod)"
    local bin
    for bin in "$SLURMCTLD" "$SLURMD" "$MUNGED" "$SINFO" "$IP" "$NSENTER" "$UNSHARE"; do
        [[ -x $bin ]] || die "$bin is missing: apt-get install -y slurm-wlm munge iproute2 util-linux"
    done
    [[ -r $PLUGIN ]] || die "$PLUGIN is missing (multinode.sh runs from a gpuslurm checkout)"
    if [[ -n $WITH_DBD ]]; then
        # slurmdbd and sacctmgr are the root's with a root; MariaDB's server is always the host's.
        for bin in "$SLURMDBD" "$SACCTMGR"; do
            [[ -x $ROOT$bin ]] || die "$ROOT$bin is missing: apt-get install -y slurmdbd (or set GPUSLURM_MULTINODE_SLURMDBD=0)"
        done
        for bin in "$MARIADBD" "$MARIADB_INSTALL_DB" "$MARIADB_ADMIN"; do
            [[ -x $bin ]] || die "$bin is missing: apt-get install -y mariadb-server (or set GPUSLURM_MULTINODE_SLURMDBD=0)"
        done
        id -u "$DB_USER" >/dev/null 2>&1 || die "no user $DB_USER to run MariaDB as (mariadb-server makes it)"
    fi
    if [[ -n $ROOT ]]; then
        [[ -s $ROOT/.gpuslurm-root.json ]] || die "$ROOT is not a finished root: python3 tests/helpers/slurm_roots.py build RELEASE"
        # (the venv's python is a link that resolves only inside the root)
        for bin in "$SLURMCTLD" "$SLURMD" "$MUNGED" "$SINFO" /usr/bin/sbatch "$ROOT_PYTHON"; do
            [[ -x $ROOT$bin || -L $ROOT$bin ]] || die "$ROOT$bin is missing: rebuild the root (tests/helpers/slurm_roots.py)"
        done
        [[ -n $CHECKOUT && -d $CHECKOUT/src/gpuslurm ]] || die "GPUSLURM_CHECKOUT must name this gpuslurm checkout"
        [[ $(stat -f -c %T "$HOST_CGROUP2" 2>/dev/null) == cgroup2fs ]] \
            || die "no cgroup2 at $HOST_CGROUP2 for Slurm's cgroup/v2 plugin"
    fi
    [[ -x $(gpuslurm_bin) ]] || die "$(gpuslurm_bin) is not executable: set GPUSLURM_BIN"
    (($(node_count) >= 1 && $(node_count) <= 9)) || die "GPUSLURM_MULTINODE_BUNDLES names $(node_count) bundles; 1 to 9"
}

# --- configuration -------------------------------------------------------------------------------

root_release() {  # the Slurm release of $ROOT (its .gpuslurm-root.json, which slurm_roots.py writes)
    sed -n 's/^ *"release": "\([0-9.]*\)".*/\1/p' "$ROOT/.gpuslurm-root.json" | head -n 1
}

bundle_dir() {  # a built-in name or an absolute directory -> the directory
    local spec=$1
    if [[ $spec == /* ]]; then
        [[ -d $spec ]] || die "bundle $spec is not a directory"
        echo "$spec"
        return
    fi
    [[ $spec =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "bundle name $spec is not a built-in name"
    "$(dirname "$(readlink -f "$(gpuslurm_bin)")")/python3" -c \
        'import sys; from gpuslurm.hw.source import bundle_path; print(bundle_path(sys.argv[1]))' "$spec" \
        2>/dev/null || die "no built-in bundle $spec"
}

write_configs() {
    local gpuslurm i n name dir node_lines="" line gres_types
    gpuslurm=$(gpuslurm_bin)
    n=$(node_count)
    mkdir -p "$ETC" "$RUN" "$LOG" "$MUNGE_DIR" "$STATE/spool/ctld" "$STATE/jobs" "$HOOKS"
    chmod 755 "$STATE" "$STATE/jobs" "$HOOKS"
    # gpuslurm's job_submit.lua, as a site installs it: beside slurm.conf, with its throttle file
    # (absent: nobody is throttled) read from there; a test writes that file.
    install -m 644 "$PLUGIN" "$ETC/job_submit.lua"
    : >"$ETC/gres.conf.tmp"
    {
        echo "# Generated by docker-slurm/multinode.sh up"
        echo "127.0.0.1 localhost"
        echo "$CTL_ADDR $CTL_NAME"
        for ((i = 1; i <= n; i++)); do
            if [[ $(node_host "$i") != "$(node_name "$i")" ]]; then
                echo "$(node_addr "$i") $(node_host "$i") $(node_name "$i")"
            else
                echo "$(node_addr "$i") $(node_name "$i")"
            fi
        done
    } >"$ETC/hosts"
    for ((i = 1; i <= n; i++)); do
        name=$(node_name "$i")
        dir=$(node_dir "$i")
        mkdir -p "$dir/run" "$dir/state" "$dir/spool" "$dir/log" "$dir/slurm-etc" "$dir/hooks"
        chmod 755 "$dir" "$dir/run" "$dir/state"
        rm -rf "$dir/bundle"
        cp -r "$(bundle_dir "${BUNDLES[$((i - 1))]}")" "$dir/bundle"
        chmod -R go-w "$dir/bundle"
        # With a root, MIG Types as its Slurm names them (the host's slurmd -V is 22.05's), here
        # and in the node's Gres= below, and Cores= as it takes them (whole sockets from 24.11).
        "$gpuslurm" gres-conf --from "$dir/bundle" --node-name "$name" --output "$dir/gres.conf" \
            ${ROOT:+--slurm-version "$(root_release)"} \
            || die "gpuslurm gres-conf --from ${BUNDLES[$((i - 1))]} failed"
        cat "$dir/gres.conf" >>"$ETC/gres.conf.tmp"
        line=$("$gpuslurm" node-conf --from "$dir/bundle" --node-name "$name" \
                   ${ROOT:+--slurm-version "$(root_release)"} | grep '^NodeName=') \
            || die "gpuslurm node-conf --from ${BUNDLES[$((i - 1))]} failed"
        line="${line/NodeName=$name /NodeName=$name NodeHostname=$(node_host "$i") NodeAddr=$(node_addr "$i") }"
        node_lines+="$line"$'\n'
        # The node's hooks: its own config (run and state directories) and its own bundle.
        cat >"$dir/gpuslurm.toml" <<EOF
# Generated by docker-slurm/multinode.sh up: node $name
[paths]
run_dir = "$dir/run"
state_dir = "$dir/state"
violations_dir = "$VIOLATIONS"
scontrol = "/usr/bin/scontrol"
slurm_cgroup_conf = "$ETC/cgroup.conf"

[hooks]
command_timeout_s = 20

[scheduler]
kind = "slurm"

[act]
syslog = ""  # the node's /dev has no /dev/log
EOF
        chmod 644 "$dir/gpuslurm.toml"
        # With a root, the hooks are installed inside it once its namespaces are up (start_network).
        [[ -n $ROOT ]] || install_hooks "$i" "$gpuslurm"
    done
    mv "$ETC/gres.conf.tmp" "$ETC/gres.conf"
    gres_types=$(grep -o '\bName=[a-z]*' "$ETC/gres.conf" | cut -d= -f2 | sort -u | paste -sd, -)
    {
        echo "# Generated by docker-slurm/multinode.sh up; rewritten by every fresh 'up'."
        echo "ClusterName=$CLUSTER_NAME"
        echo "SlurmctldHost=$CTL_NAME($CTL_ADDR)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$MUNGE_SOCKET"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$STATE/spool/ctld"
        # %n: the node's name (multiple-slurmd): each node's own directories
        echo "SlurmdSpoolDir=$STATE/nodes/%n/spool"
        echo "SlurmdPidFile=$STATE/nodes/%n/run/slurmd.pid"
        echo "SlurmdLogFile=$STATE/nodes/%n/log/slurmd.log"
        echo "SlurmctldPidFile=$RUN/slurmctld.pid"
        echo "SlurmctldLogFile=$LOG/slurmctld.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        echo "SlurmdParameters=config_overrides"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "GresTypes=$gres_types"
        echo "ProctrackType=proctrack/cgroup"
        echo "TaskPlugin=task/cgroup,task/affinity"
        echo "JobAcctGatherType=jobacct_gather/none"
        if [[ -n $WITH_DBD ]]; then
            echo "AccountingStorageType=accounting_storage/slurmdbd"
            echo "AccountingStorageHost=$CTL_NAME"
            echo "AccountingStoragePort=$DBD_PORT"
            # Clients reach slurmdbd through the munge socket named here, not AuthInfo's.
            echo "AccountingStoragePass=$MUNGE_SOCKET"
            # GPUs are not among the TRES Slurm records by default
            echo "AccountingStorageTRES=gres/gpu"
        else
            echo "AccountingStorageType=accounting_storage/none"
        fi
        echo "MpiDefault=none"
        echo "JobSubmitPlugins=lua"
        echo "MailProg=/bin/true"
        echo "ReturnToService=2"
        echo "SlurmdTimeout=30"
        echo "KillWait=2"
        echo "InactiveLimit=0"
        echo "MinJobAge=300"
        # The same path on every node; each node's mount namespace puts its own hooks there.
        echo "Prolog=$HOOKS/gpuslurm-prolog"
        echo "Epilog=$HOOKS/gpuslurm-epilog"
        echo "TaskProlog=$HOOKS/gpuslurm-task-prolog"
        if [[ -n $EXTRA_CONF ]]; then
            [[ -r $EXTRA_CONF ]] || die "GPUSLURM_MULTINODE_EXTRA_CONF=$EXTRA_CONF is not readable"
            echo "# --- from $EXTRA_CONF"
            cat "$EXTRA_CONF"
            echo "# --- end of $EXTRA_CONF"
        fi
        printf '%s' "$node_lines"
        echo "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
    if [[ -n $WITH_DBD ]]; then
        write_dbd_conf
    else
        rm -f "$DBD_CONF"
    fi
    # A root: Slurm's cgroup/v2 plugin on each node's own cgroup2 tree (CgroupAutomount is defunct
    # from 24.05; no systemd makes the stepd scope, slurmd does; devices need no controller, Slurm
    # confines them with BPF), as docker-slurm/cluster.sh runs it.
    {
        if [[ -n $ROOT ]]; then
            echo "CgroupPlugin=cgroup/v2"
        else
            echo "CgroupPlugin=cgroup/v1"
        fi
        echo "CgroupMountpoint=/sys/fs/cgroup"
        [[ -n $ROOT ]] || echo "CgroupAutomount=yes"
        echo "ConstrainDevices=yes"
        echo "ConstrainCores=no"
        echo "ConstrainRAMSpace=no"
        echo "ConstrainSwapSpace=no"
        if [[ -n $ROOT ]]; then
            echo "IgnoreSystemd=yes"
            echo "IgnoreSystemdOnFailure=yes"
            echo "EnableControllers=no"
        fi
    } >"$ETC/cgroup.conf"
}

# install_hooks I GPUSLURM: `gpuslurm install` for node I, with its own config and bundle copy, into
# nodes/mnodeI/hooks (bind-mounted on $HOOKS in its namespace). With a root, run inside it (its
# venv's Python, which the hooks then run), in the node's namespaces.
install_hooks() {
    local i=$1 gpuslurm=$2 name dir
    name=$(node_name "$i")
    dir=$(node_dir "$i")
    local argv=(install --slurm-etc "$dir/slurm-etc" --prefix "$dir/hooks" --config "$dir/gpuslurm.toml"
                --replay "$dir/bundle" ${HOOKS_PYTHON:+--python "$HOOKS_PYTHON"})
    if [[ -n $ROOT ]]; then
        in_ns "$name" "$ROOT_PYTHON" -m gpuslurm "${argv[@]}" >"$LOG/install-$name.log" 2>&1 \
            || die "gpuslurm install for $name (in $ROOT) failed: $(tail -n 5 "$LOG/install-$name.log")"
    else
        "$gpuslurm" "${argv[@]}" >"$LOG/install-$name.log" 2>&1 \
            || die "gpuslurm install for $name failed: $(tail -n 5 "$LOG/install-$name.log")"
    fi
}

# --- namespaces ----------------------------------------------------------------------------------

# Device files "PATH MAJOR MINOR" a node's gres.conf names, plus nvidiactl and nvidia-uvm(-tools).
device_list() {
    local path
    while read -r path; do
        case $path in
            /dev/nvidia-caps/nvidia-cap[0-9]*) echo "$path 235 ${path##*nvidia-cap}" ;;
            /dev/nvidia[0-9]*)
                [[ ${path#/dev/nvidia} =~ ^[0-9]+$ ]] || die "gres.conf names $path, which cannot be made"
                echo "$path 195 ${path#/dev/nvidia}" ;;
            *) die "gres.conf names $path, which cannot be made" ;;
        esac
    done < <(grep -v '^\s*#' "$1" | grep -oE '(File|MultipleFiles)=[^ ]+' | cut -d= -f2 | tr ',' '\n' | sort -u)
    echo "/dev/nvidiactl 195 255"
    echo "/dev/nvidia-uvm 511 0"
    echo "/dev/nvidia-uvm-tools 511 1"
}

# What each holder runs in its new namespaces before it sleeps: the hosts file; for a node also its
# own /dev and its hooks at $HOOKS. Arguments: hostname, hosts file, device list ("" for the
# controller), the node's hooks directory.
# shellcheck disable=SC2016  # expanded by the holder's shell
NS_SETUP='set -e
    hostname "$1"
    mount --bind "$2" /etc/hosts
    if [ -n "$3" ]; then
        mount -t tmpfs -o mode=755,size=1m gpuslurm-dev /dev
        for spec in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
            IFS=: read -r name major minor <<<"$spec"
            mknod -m 666 "/dev/$name" c "$major" "$minor"
        done
        mkdir /dev/pts /dev/shm
        mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts
        ln -s pts/ptmx /dev/ptmx
        mount -t tmpfs -o mode=1777 shm /dev/shm
        ln -s /proc/self/fd /dev/fd
        ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
        while read -r path major minor; do
            mkdir -p "$(dirname "$path")"
            mknod -m 666 "$path" c "$major" "$minor"
        done <"$3"
        mount --bind "$4" "$5"
    fi
    r=$6
    [ -n "$r" ] || exec sleep infinity
    # A root (GPUSLURM_SLURM_ROOT): this namespace'"'"'s /dev, /proc, /sys, /tmp (the state and the
    # hooks mounted above), /run and /etc (its hosts file) inside it, then chrooted into it.
    mount --rbind /dev "$r/dev"; mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"
    mount --rbind /tmp "$r/tmp"; mount --rbind /run "$r/run"
    if [ -n "$9" ]; then mount --bind "$9" "$r/sys/fs/cgroup"; fi
    mount --rbind /etc "$r/.host-etc"; mount -o remount,bind,ro "$r/.host-etc"
    if [ -n "$7" ]; then mount --bind "$7" "$r/opt/gpuslurm/checkout"; mount -o remount,bind,ro "$r/opt/gpuslurm/checkout"; fi
    IFS=: read -ra binds <<<"$8"
    for dir in "${binds[@]}"; do
        [ -d "$dir" ] || continue
        mkdir -p "$r$dir"; mount --bind "$dir" "$r$dir"; mount -o remount,bind,ro "$r$dir"
    done
    exec /usr/sbin/chroot "$r" /bin/sleep infinity'

# With a root, a node's own cgroup in the host's cgroup2 tree (run/cgroup-NAME names it): its slurmd's
# system.slice lands inside it. Nothing for the controller.
node_cgroup() {  # node_cgroup NAME: its path, made if need be
    local file=$RUN/cgroup-$1 dir
    if [[ -s $file && -d $(<"$file") ]]; then
        cat "$file"
        return 0
    fi
    dir=$HOST_CGROUP2/gpuslurm-mn-$1-$$
    mkdir "$dir" || die "cannot make the cgroup $dir"
    echo "$dir" >"$file"
    echo "$dir"
}

start_holder() {  # start_holder NAME HOSTNAME DEVICE-LIST HOOKS-DIR
    local name=$1 i pidfile=$RUN/$1.pid cgroup="" enter='exec "$@"'
    alive "$pidfile" && return 0
    if [[ -n $ROOT && -n $3 ]]; then
        # The holder enters the node's cgroup before it makes its cgroup namespace, rooted there.
        cgroup=$(node_cgroup "$name")
        # shellcheck disable=SC2016  # expanded by the inner shell
        enter='echo $$ >"$0/cgroup.procs" && exec "$@"'
    fi
    env "$MARK_VAR=$STATE" setsid /bin/bash -c "$enter" "$cgroup" \
        "$UNSHARE" --net --uts --mount ${cgroup:+--cgroup} --propagation private -- \
        /bin/bash -c "$NS_SETUP" "$name" "$2" "$ETC/hosts" "$3" "$4" "$HOOKS" \
        "$ROOT" "$CHECKOUT" "$ROOT_BINDS" "$cgroup" \
        </dev/null >>"$LOG/namespace-$name.log" 2>&1 &
    echo $! >"$pidfile"
    for ((i = 0; i < 100; i++)); do
        [[ $(cat "/proc/$(<"$pidfile")/comm" 2>/dev/null) == sleep ]] && return 0
        alive "$pidfile" || break
        sleep 0.1
    done
    die "the namespace $name did not start; $LOG/namespace-$name.log says: $(tail -n 5 "$LOG/namespace-$name.log")"
}

start_network() {
    local i n name
    n=$(node_count)
    start_holder ctl "$CTL_NAME" "" ""
    if ! in_host_ns ctl "$IP" link show "$BRIDGE" >/dev/null 2>&1; then
        in_host_ns ctl "$IP" link set lo up
        in_host_ns ctl "$IP" link add "$BRIDGE" type bridge
        in_host_ns ctl "$IP" addr add "$CTL_ADDR/24" dev "$BRIDGE"
        in_host_ns ctl "$IP" link set "$BRIDGE" up
    fi
    for ((i = 1; i <= n; i++)); do
        name=$(node_name "$i")
        device_list "$(node_dir "$i")/gres.conf" >"$(node_dir "$i")/devices"
        start_holder "$name" "$(node_host "$i")" "$(node_dir "$i")/devices" "$(node_dir "$i")/hooks"
        in_host_ns ctl "$IP" link show "veth-$name" >/dev/null 2>&1 && continue
        # Made in the controller's namespace, one end moved into the node's: never in the host's.
        in_host_ns ctl "$IP" link add "veth-$name" type veth peer name eth0 netns "$(<"$RUN/$name.pid")"
        in_host_ns ctl "$IP" link set "veth-$name" master "$BRIDGE" up
        in_host_ns "$name" "$IP" link set lo up
        in_host_ns "$name" "$IP" addr add "$(node_addr "$i")/24" dev eth0
        in_host_ns "$name" "$IP" link set eth0 up
    done
    if [[ -n $ROOT ]]; then
        for ((i = 1; i <= n; i++)); do
            install_hooks "$i" "$(gpuslurm_bin)"
        done
    fi
}

# --- daemons -------------------------------------------------------------------------------------

start_munged() {
    alive "$RUN/munged.pid" && return 0
    chmod 755 "$MUNGE_DIR"
    [[ -s $MUNGE_DIR/munge.key ]] || (umask 077 && head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key")
    chmod 400 "$MUNGE_DIR/munge.key"
    # With a root, its own munged (its libmunge's), chrooted in the controller's namespaces; the
    # socket is a path under $STATE, which every namespace and the root see.
    ${ROOT:+in_ns ctl} env "$MARK_VAR=$STATE" "$MUNGED" --force --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$RUN/munged.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
        || die "munged failed to start: $(tail -n 5 "$LOG/munged.log" 2>/dev/null)"
}

start_daemon() {  # start_daemon HOLDER NAME PIDFILE LOGFILE BINARY ARGS...
    local holder=$1 name=$2 pidfile=$3 logfile=$4 i
    shift 4
    alive "$pidfile" && return 0
    if [[ -n $ROOT && -s $RUN/cgroup-$holder ]]; then
        # A node's slurmd with a root: into the node's cgroup and cgroup namespace first, and with
        # the preload library that shows it only its cgroup2 line (docs/compatibility.md).
        # shellcheck disable=SC2016  # expanded by the inner shell
        /bin/bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$(<"$RUN/cgroup-$holder")" \
            "$NSENTER" --target="$(<"$RUN/$holder.pid")" --net --uts --mount --cgroup --root --wd -- \
            env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" LD_PRELOAD="$RUN/cgroup2_only.so" "$@" -f "$CONF" \
            || die "$name failed to start; last lines of its log:"$'\n'"$(tail -n 20 "$logfile" 2>/dev/null)"
    else
        in_ns "$holder" env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" "$@" -f "$CONF" \
            || die "$name failed to start; last lines of its log:"$'\n'"$(tail -n 20 "$logfile" 2>/dev/null)"
    fi
    for ((i = 0; i < 50; i++)); do
        alive "$pidfile" && return 0
        sleep 0.1
    done
    die "$name did not write $pidfile; last lines of its log:"$'\n'"$(tail -n 20 "$logfile" 2>/dev/null)"
}

wait_idle() {
    local deadline states="" n
    n=$(node_count)
    deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        states=$(in_ns ctl env SLURM_CONF="$CONF" "$SINFO" -h -N -o '%N=%T' 2>/dev/null | sort -u | paste -sd' ' -) || true
        [[ $(grep -o '=idle' <<<"$states" | wc -l) -eq $n ]] && return 0
        sleep 0.5
    done
    {
        echo "multinode.sh: not every node is idle after ${TIMEOUT}s (sinfo says: ${states:-nothing})"
        echo "--- $LOG/slurmctld.log (last 20 lines)"
        tail -n 20 "$LOG/slurmctld.log" 2>/dev/null || true
        local i
        for ((i = 1; i <= n; i++)); do
            echo "--- $(node_dir "$i")/log/slurmd.log (last 10 lines)"
            tail -n 10 "$(node_dir "$i")/log/slurmd.log" 2>/dev/null || true
        done
    } >&2
    exit 1
}

write_ctl_exec() {
    # The tests' way in: CMD as root in the controller's namespaces (Slurm's clients reach it there).
    cat >"$RUN/ctl-exec.tmp" <<EOF
#!/bin/sh
# Written by docker-slurm/multinode.sh up: CMD in the controller's namespaces, SLURM_CONF set.
exec $NSENTER --target="\$(cat $RUN/ctl.pid)" --net --uts --mount ${ROOT:+--root --wd }-- /usr/bin/env SLURM_CONF=$CONF "\$@"
EOF
    chmod 755 "$RUN/ctl-exec.tmp"
    mv "$RUN/ctl-exec.tmp" "$RUN/ctl-exec"
}

# --- accounting: one slurmdbd on a private MariaDB ------------------------------------------------

write_dbd_conf() {
    # slurmdbd refuses a slurmdbd.conf others can read. MariaDB's root is reached through its
    # socket as the OS user root: no password here.
    (umask 077 && cat >"$DBD_CONF.tmp" <<EOF
# Generated by docker-slurm/multinode.sh up; rewritten by every fresh 'up'.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$CTL_NAME
DbdAddr=$CTL_ADDR
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

sacctmgr() {
    in_ns ctl env SLURM_CONF="$CONF" timeout 30 "$SACCTMGR" "$@"
}

# slurmdbd in the controller's namespaces (a root's, chrooted), then the cluster registered, before
# slurmctld first starts (so it takes the database's ClusterID).
start_slurmdbd() {
    local i said="" out up=""
    if ! alive "$RUN/slurmdbd.pid"; then
        in_ns ctl env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" MYSQL_UNIX_PORT="$DB_SOCKET" "$SLURMDBD" \
            || die "slurmdbd failed to start: $(tail -n 20 "$LOG/slurmdbd.log" 2>/dev/null)"
    fi
    for ((i = 0; i < TIMEOUT * 2; i++)); do
        if said=$(sacctmgr -n -P show cluster format=cluster 2>&1); then
            up=1
            break
        fi
        alive "$RUN/slurmdbd.pid" || ((i < 20)) || die "slurmdbd exited: $(tail -n 20 "$LOG/slurmdbd.log" 2>/dev/null)"
        sleep 0.5
    done
    [[ -n $up ]] || die "slurmdbd does not answer sacctmgr ($said): $(tail -n 20 "$LOG/slurmdbd.log" 2>/dev/null)"
    if ! grep -qxF "$CLUSTER_NAME" <<<"$said"; then
        out=$(sacctmgr -i add cluster "$CLUSTER_NAME" 2>&1) || die "sacctmgr add cluster $CLUSTER_NAME failed: $out"
        # 23.02+: slurmctld stops on a ClusterID that the new database does not know
        rm -f "$STATE/spool/ctld/clustername"
    fi
}

# --- monitors, exporters and Prometheus ----------------------------------------------------------

# in_ns_bg HOLDER PIDFILE LOGFILE CMD...: CMD started in the holder's namespaces, in the background,
# with the cluster's mark; its pid (nsenter execs CMD: no new pid namespace, so no fork) in PIDFILE.
in_ns_bg() {
    local holder=$1 pidfile=$2 logfile=$3
    shift 3
    alive "$RUN/$holder.pid" || die "the namespace $holder is gone ($RUN/$holder.pid)"
    setsid "$NSENTER" --target="$(<"$RUN/$holder.pid")" --net --uts --mount ${IN_ROOT:+--root --wd} -- \
        env "$MARK_VAR=$STATE" SLURM_CONF="$CONF" "$@" </dev/null >>"$logfile" 2>&1 &
    echo $! >"$pidfile"
}
IN_ROOT=$ROOT  # in_ns_bg chroots the monitors into the root (they run Slurm's clients); Prometheus not

# wait_port HOST PORT NAME PIDFILE LOGFILE: until HOST:PORT accepts a connection from the
# controller's namespace (bash's /dev/tcp: no client needed), or the process is gone.
wait_port() {
    local host=$1 port=$2 name=$3 pidfile=$4 logfile=$5 i
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        in_host_ns ctl /bin/bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null && return 0
        alive "$pidfile" || die "$name exited; $logfile says: $(tail -n 5 "$logfile" 2>/dev/null)"
        sleep 0.2
    done
    die "$name does not answer on $host:$port after ${TIMEOUT}s; $logfile says: $(tail -n 5 "$logfile" 2>/dev/null)"
}

cmd_monitors() {
    local i n name dir gpuslurm targets=""
    [[ $# -eq 0 ]] || die "monitors: unexpected argument $1"
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    alive "$RUN/slurmctld.pid" || die "the cluster is not up ($STATE): multinode.sh up first"
    gpuslurm=$(gpuslurm_bin)
    n=$(node_count)
    mkdir -p "$VIOLATIONS"
    chmod 755 "$VIOLATIONS"
    for ((i = 1; i <= n; i++)); do
        name=$(node_name "$i")
        dir=$(node_dir "$i")
        targets+="${targets:+, }'$(node_addr "$i"):$EXPORTER_PORT'"
        alive "$dir/run/monitor.pid" && continue
        # the node's replayed processes and load: a test rewrites it (atomically) while the monitor runs
        [[ -e $dir/scenario.json ]] || echo '{"procs": []}' >"$dir/scenario.json"
        in_ns_bg "$name" "$dir/run/monitor.pid" "$dir/log/monitor.log" \
            GPUSLURM_CONFIG="$dir/gpuslurm.toml" GPUSLURM_SCENARIO="$dir/scenario.json" \
            "$gpuslurm" monitor --interval 1 --from "$dir/bundle" \
            --prometheus-addr "$(node_addr "$i")" --prometheus-port "$EXPORTER_PORT"
    done
    for ((i = 1; i <= n; i++)); do
        dir=$(node_dir "$i")
        wait_port "$(node_addr "$i")" "$EXPORTER_PORT" "the monitor of $(node_name "$i")" \
            "$dir/run/monitor.pid" "$dir/log/monitor.log"
    done
    if [[ ! -x $PROMETHEUS ]]; then
        note "monitors: $n up; no Prometheus ($PROMETHEUS is not executable)"
        return 0
    fi
    alive "$PROM_DIR/prometheus.pid" && return 0
    mkdir -p "$PROM_DIR"
    cat >"$PROM_DIR/prometheus.yml" <<EOF
# Generated by docker-slurm/multinode.sh monitors: every node's exporter, over the bridge
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpuslurm
    static_configs:
      - targets: [$targets]
EOF
    IN_ROOT="" in_ns_bg ctl "$PROM_DIR/prometheus.pid" "$LOG/prometheus.log" "$PROMETHEUS" \
        --config.file="$PROM_DIR/prometheus.yml" --storage.tsdb.path="$PROM_DIR/data" \
        --web.listen-address="$CTL_ADDR:$PROM_PORT" --storage.tsdb.retention.time=1d
    wait_port "$CTL_ADDR" "$PROM_PORT" prometheus "$PROM_DIR/prometheus.pid" "$LOG/prometheus.log"
    note "monitors: $n up, exporters on :$EXPORTER_PORT; Prometheus on http://$CTL_ADDR:$PROM_PORT"
}

stop_monitors() {
    local dir
    # (a pid file read in a directory that is not there stops the script under set -e)
    [[ ! -e $PROM_DIR/prometheus.pid ]] || stop_pidfile prometheus "$PROM_DIR/prometheus.pid"
    for dir in "$STATE"/nodes/*/; do
        [[ -e $dir/run/monitor.pid ]] || continue
        stop_pidfile "monitor $(basename "$dir")" "$dir/run/monitor.pid"
    done
}


# The preload library for the nodes' slurmd (a root): GPUSLURM_CLUSTER_PRELOAD, or built from its source.
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

cmd_up() {
    local i n
    [[ $# -eq 0 ]] || die "up: unexpected argument $1"
    check_prerequisites
    n=$(node_count)
    mkdir -p "$STATE" "$RUN" "$LOG"
    if alive "$RUN/slurmctld.pid"; then
        note "already up ($STATE)"
        return 0
    fi
    write_configs
    [[ -z $ROOT ]] || install_preload
    start_network
    write_ctl_exec
    start_munged
    if [[ -n $WITH_DBD ]]; then
        start_mariadb
        start_slurmdbd
    fi
    start_daemon ctl slurmctld "$RUN/slurmctld.pid" "$LOG/slurmctld.log" "$SLURMCTLD"
    for ((i = 1; i <= n; i++)); do
        start_daemon "$(node_name "$i")" "slurmd $(node_name "$i")" "$(node_dir "$i")/run/slurmd.pid" \
            "$(node_dir "$i")/log/slurmd.log" "$SLURMD" -N "$(node_name "$i")"
    done
    wait_idle
    note "up: $n nodes idle; run/ctl-exec CMD runs Slurm's clients"
}

# Processes whose environment has the line LINE, outside this script's own process group.
pids_with_env() {
    local line=$1 mypgid pid pgid
    mypgid=$(ps -o pgid= -p $$ | tr -d ' ')
    while read -r pid pgid; do
        [[ $pgid == "$mypgid" ]] && continue
        { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF -- "$line" || continue
        echo "$pid"
    done < <(ps -e -o pid=,pgid=)
}

# Processes in the network namespace of one of the holders (the holders among them).
pids_in_namespaces() {
    local file pid ns namespaces=" "
    for file in "$RUN"/*.pid; do
        alive "$file" || continue
        ns=$(readlink "/proc/$(<"$file")/ns/net" 2>/dev/null) || continue
        [[ $ns == "$(readlink /proc/$$/ns/net)" ]] || namespaces+="$ns "
    done
    [[ $namespaces != " " ]] || return 0
    for pid in /proc/[0-9]*; do
        ns=$(readlink "$pid/ns/net" 2>/dev/null) || continue
        [[ $namespaces == *" $ns "* ]] && echo "${pid#/proc/}"
    done
    return 0
}

# The holders (with them go the namespaces, their veths, bridge, /dev and mounts), then the nodes'
# cgroups: down's last step, run on its way out whatever failed before it.
stop_holders() {
    local name dir
    for name in "$RUN"/*.pid; do
        [[ -e $name ]] || continue
        stop_pidfile "namespace $(basename "$name" .pid)" "$name" 2
    done
    for dir in /sys/fs/cgroup/*/slurm_mnode[0-9]; do
        [[ -d $dir ]] || continue
        find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || note "left $dir: still in use"
    done
    remove_node_cgroups
}

# A root's node cgroups (run/cgroup-NAME): whatever is still in them (slurmstepd's sleeper, a stray
# task) killed the kernel's way, then removed.
remove_node_cgroups() {
    local file dir i
    for file in "$RUN"/cgroup-*; do
        [[ -s $file ]] || continue
        dir=$(<"$file")
        if [[ $dir != "$HOST_CGROUP2"/gpuslurm-mn-* || ! -d $dir ]]; then
            rm -f "$file"
            continue
        fi
        [[ ! -e $dir/cgroup.kill ]] || echo 1 >"$dir/cgroup.kill" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -z $(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null) ]] && break
            sleep 0.1
        done
        find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
        if [[ -d $dir ]]; then
            note "left $dir: still in use"
        else
            rm -f "$file"
        fi
    done
}

cmd_down() {
    local i pid pids jobs name dir
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    mkdir -p "$LOG"
    # A trace of this run, for a failure's message (tests/helpers/multinode_fixture.py shows its end).
    exec {trace}>"$LOG/down.trace"
    BASH_XTRACEFD=$trace
    set -x
    trap 'stop_holders' EXIT
    stop_monitors
    if alive "$RUN/slurmctld.pid" && alive "$RUN/ctl.pid"; then
        # Cancel jobs first: slurmd does not take its jobs' slurmstepd down with it.
        jobs=$(in_ns ctl env SLURM_CONF="$CONF" "$SQUEUE" -h -o %i 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $jobs ]] || in_ns ctl env SLURM_CONF="$CONF" "$SCANCEL" --quiet $jobs 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -z $(in_ns ctl env SLURM_CONF="$CONF" "$SQUEUE" -h -o %i -t PD,R,CG,S 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    # Every slurmd's pid read before any is stopped (a pid file may go before its process does).
    local slurmds=()
    for dir in "$STATE"/nodes/*/; do
        pid=$(<"$dir/run/slurmd.pid") 2>/dev/null || continue
        slurmds+=("$(basename "$dir"):$pid")
        rm -f "$dir/run/slurmd.pid"
    done
    for name in "${slurmds[@]}"; do
        stop_pid "slurmd ${name%%:*}" "${name#*:}"
    done
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
    # After slurmctld, which sends its last job records to slurmdbd as it stops.
    [[ ! -e $RUN/slurmdbd.pid ]] || stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
    [[ ! -e $DB_PIDFILE ]] || stop_pidfile mariadbd "$DB_PIDFILE" 60
    # Stray slurmstepd (marked through the daemons' environment) and anything else still in the
    # cluster's network namespaces (a job's tasks carry the job's environment, not the mark).
    pids=$( { pids_with_env "$MARK_VAR=$STATE"; pids_in_namespaces; } | sort -u)
    for name in "$RUN"/*.pid; do
        [[ -e $name ]] || continue
        pids=$(grep -vxF "$(cat "$name" 2>/dev/null || echo none)" <<<"$pids" || true)
    done
    if [[ -n $pids ]]; then
        note "killing leftover processes: ${pids//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    stop_pidfile munged "$RUN/munged.pid"
    trap - EXIT
    stop_holders
    note "down ($STATE)"
}

cmd_status() {
    local pidfile rc=0
    for pidfile in "$RUN"/*.pid "$STATE"/nodes/*/run/slurmd.pid "$STATE"/nodes/*/run/monitor.pid \
            "$PROM_DIR/prometheus.pid"; do
        [[ -e $pidfile ]] || continue
        if alive "$pidfile"; then
            echo "${pidfile#"$STATE"/}: running, pid $(<"$pidfile")"
        else
            echo "${pidfile#"$STATE"/}: not running"
            rc=3
        fi
    done
    if alive "$RUN/slurmctld.pid"; then
        in_ns ctl env SLURM_CONF="$CONF" "$SINFO" -N -o '%N %T %G' || rc=3
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
        monitors) cmd_monitors "$@" ;;
        monitors-down)
            [[ $(id -u) -eq 0 ]] || die "must run as root"
            stop_monitors ;;
        ctl) in_ns ctl env SLURM_CONF="$CONF" "$@" ;;
        node)
            [[ $# -ge 2 && ${1:-} =~ ^mnode[1-9]$ ]] || die "usage: node mnodeI CMD..."
            local holder=$1
            shift
            in_ns "$holder" env SLURM_CONF="$CONF" "$@" ;;
        *) die "usage: multinode.sh up | down | status | monitors | monitors-down | ctl CMD... | node mnodeI CMD..." ;;
    esac
}

main "$@"
