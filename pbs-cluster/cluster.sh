#!/usr/bin/env bash
# A one-node OpenPBS cluster in a network + UTS namespace of its own, configured by gpuslurm from a
# capture bundle: one vnode per NUMA node (gpuslurm pbs-conf) holding its CPUs, memory and ngpus.
#
#   cluster.sh up | down | status | env | submit [--user NAME] QSUB-ARGS...
#
# Runs as root on Debian 12 with OpenPBS installed by pbs-cluster/build.sh. PBS refuses a server
# host that resolves only to 127.x, so every daemon and command runs inside network namespace
# $NS (192.0.2.10 on its loopback, hosts file /etc/netns/$NS/hosts) and a UTS namespace named
# $PBS_HOSTNAME. Everything lives in one state directory (a private PBS_CONF_FILE, PBS_HOME with
# the PostgreSQL datastore, job files, the test user's home); /etc/pbs.conf is never touched.
# `down` stops the daemons, kills what is left in the namespace, deletes it, the hosts file, the
# test user, the fake devices it holds (fake-devices.sh) and the state directory.
#
# Environment:
#   GPUSLURM_PBS_DIR      state directory (default /run/gpuslurm-pbs-cluster)
#   GPUSLURM_BUNDLE       capture bundle dir or built-in name (default dgx-h100)
#   GPUSLURM_BIN          gpuslurm executable (default: the one beside python3's executable)
#   PBS_PREFIX            OpenPBS install (default /opt/pbs)
#   GPUSLURM_PBS_USER     the ordinary test user `up` creates (default gpuspbs1)
#   GPUSLURM_PBS_TIMEOUT  seconds `up` waits for the vnodes to be free (default 90)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${GPUSLURM_PBS_DIR:-/run/gpuslurm-pbs-cluster}
BUNDLE=${GPUSLURM_BUNDLE:-dgx-h100}
PREFIX=${PBS_PREFIX:-/opt/pbs}
TEST_USER=${GPUSLURM_PBS_USER:-gpuspbs1}
TIMEOUT=${GPUSLURM_PBS_TIMEOUT:-90}
NS=gpuslurm-pbs
PBS_HOSTNAME=pbshost
ADDR=192.0.2.10
CONF=$STATE/pbs.conf
PBS_HOME_DIR=$STATE/home
USER_MADE=$STATE/user-created
DEVICES_OWNER=pbs:$STATE
export PBS_CONF_FILE=$CONF

# shellcheck source=../docker-slurm/fake-devices.sh
. "$HERE/../docker-slurm/fake-devices.sh"

die() { echo "pbs cluster.sh: $*" >&2; exit 1; }
note() { echo "pbs cluster.sh: $*" >&2; }

gpuslurm_bin() {
    if [[ -n ${GPUSLURM_BIN:-} ]]; then echo "$GPUSLURM_BIN"; return; fi
    echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/gpuslurm"
}

in_ns() {  # in_ns CMD...: run CMD in the namespace, host name $PBS_HOSTNAME
    ip netns exec "$NS" unshare --uts sh -c "hostname $PBS_HOSTNAME; exec \"\$@\"" sh "$@"
}

qmgr() { in_ns "$PREFIX/bin/qmgr" -c "$1"; }

write_conf() {
    mkdir -p "$STATE" "$STATE/jobs"
    chmod 755 "$STATE"
    chmod 1777 "$STATE/jobs"
    cat >"$CONF" <<CONF
PBS_EXEC=$PREFIX
PBS_HOME=$PBS_HOME_DIR
PBS_SERVER=$PBS_HOSTNAME
PBS_START_SERVER=1
PBS_START_SCHED=1
PBS_START_COMM=1
PBS_START_MOM=1
PBS_CORE_LIMIT=unlimited
PBS_SCP=/usr/bin/scp
CONF
}

make_netns() {
    ip netns list | grep -qw "$NS" || ip netns add "$NS"
    ip netns exec "$NS" ip link set lo up
    ip netns exec "$NS" ip addr add "$ADDR/32" dev lo 2>/dev/null || true
    mkdir -p "/etc/netns/$NS"
    printf '127.0.0.1 localhost\n%s %s\n' "$ADDR" "$PBS_HOSTNAME" >"/etc/netns/$NS/hosts"
}

make_user() {
    if ! id "$TEST_USER" >/dev/null 2>&1; then
        useradd --create-home --home-dir "$STATE/users/$TEST_USER" --shell /bin/bash "$TEST_USER"
        echo "$TEST_USER" >"$USER_MADE"
    fi
    mkdir -p "$STATE/users"
    chmod 755 "$STATE/users"
}

cmd_up() {
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    [[ -x $PREFIX/sbin/pbs_server.bin ]] || die "no OpenPBS in $PREFIX: run pbs-cluster/build.sh"
    local bin; bin=$(gpuslurm_bin)
    write_conf
    make_netns
    make_user
    # The vnodes and the device files come from the same bundle.
    "$bin" pbs-conf --from "$BUNDLE" --node-name "$PBS_HOSTNAME" >"$STATE/vnodes"
    "$bin" gres-conf --from "$BUNDLE" --no-links >"$STATE/gres.conf"
    fake_devices_from_gres "$DEVICES_OWNER" "$STATE/gres.conf"
    in_ns "$PREFIX/libexec/pbs_habitat" >"$STATE/habitat.log" 2>&1 \
        || { cat "$STATE/habitat.log" >&2; die "pbs_habitat failed"; }
    printf '$clienthost %s\n$usecp *:/ /\n' "$PBS_HOSTNAME" >"$PBS_HOME_DIR/mom_priv/config"
    in_ns "$PREFIX/sbin/pbs_mom" -s insert gpuslurm-numa "$STATE/vnodes"
    # pbs_server -t create makes the empty database; init.d then starts comm, mom, sched, server.
    in_ns "$PREFIX/sbin/pbs_comm" 2>/dev/null || true
    yes | in_ns "$PREFIX/sbin/pbs_server" -t create >"$STATE/create.log" 2>&1 || true
    in_ns "$PREFIX/libexec/pbs_init.d" stop >"$STATE/init.log" 2>&1 || true
    in_ns "$PREFIX/libexec/pbs_init.d" start >>"$STATE/init.log" 2>&1 \
        || { cat "$STATE/init.log" >&2; die "pbs_init.d start failed"; }
    local i
    for ((i = 0; i < 30; i++)); do qmgr "list server" >/dev/null 2>&1 && break; sleep 1; done
    qmgr "create resource ngpus type=long, flag=nh" || true
    qmgr "create queue workq queue_type=execution,enabled=true,started=true" 2>/dev/null || true  # -t create made it
    qmgr "set server default_queue=workq"
    qmgr "set server scheduling=true"
    qmgr "set server job_history_enable=true"
    qmgr "set server flatuid=true"
    qmgr "set server scheduler_iteration=2" || true
    # The scheduler considers only resources named here; ngpus must be among them.
    sed -i 's/^resources: "\(.*\)"/resources: "\1, ngpus"/' "$PBS_HOME_DIR/sched_priv/sched_config"
    pkill -HUP -F "$PBS_HOME_DIR/sched_priv/sched.lock" 2>/dev/null || true
    qmgr "create node $PBS_HOSTNAME" 2>/dev/null || true  # the server adds its own host
    local want; want=$(grep -c '^[^#$].*\[[0-9]*\]: resources_available.ncpus' "$STATE/vnodes")
    for ((i = 0; i < TIMEOUT; i++)); do
        [[ $(in_ns "$PREFIX/bin/pbsnodes" -av 2>/dev/null | grep -c '^'"$PBS_HOSTNAME"'\[') -ge $want ]] \
            && in_ns "$PREFIX/bin/pbsnodes" -av 2>/dev/null | grep -q 'state = free' && return 0
        sleep 1
    done
    in_ns "$PREFIX/bin/pbsnodes" -av >&2 || true
    die "the $want NUMA vnodes did not come up free within ${TIMEOUT}s; logs in $PBS_HOME_DIR/*_logs"
}

cmd_down() {
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    if ip netns list | grep -qw "$NS"; then
        [[ ! -f $CONF ]] || in_ns "$PREFIX/libexec/pbs_init.d" stop >/dev/null 2>&1 || true
        # Whatever survived (jobs, postgres, a stuck daemon): every process in the namespace.
        local pids i
        for i in 1 2 3 4 5 6 7 8 9 10; do
            pids=$(ip netns pids "$NS" 2>/dev/null || true)
            [[ -n $pids ]] || break
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
            sleep 0.5
        done
        pids=$(ip netns pids "$NS" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
        ip netns del "$NS"
    fi
    rm -rf "/etc/netns/$NS"
    if [[ -f $USER_MADE ]]; then
        pkill -KILL -u "$(<"$USER_MADE")" 2>/dev/null || true
        userdel "$(<"$USER_MADE")" 2>/dev/null || note "could not delete user $(<"$USER_MADE")"
    fi
    fake_devices_release "$DEVICES_OWNER"
    rm -rf "$STATE"
}

cmd_status() {
    ip netns list | grep -qw "$NS" || { echo "namespace $NS: absent"; return 3; }
    local name pid comms="" rc=0
    for pid in $(ip netns pids "$NS"); do comms+=" $(cat "/proc/$pid/comm" 2>/dev/null) "; done
    for name in pbs_comm pbs_mom pbs_sched pbs_server.bin postgres; do
        if [[ $comms == *" ${name:0:15} "* ]]; then
            echo "$name: running"
        else
            echo "$name: not running"; rc=3
        fi
    done
    echo "PBS_CONF_FILE=$CONF"
    in_ns "$PREFIX/bin/pbsnodes" -avSj 2>/dev/null || rc=3
    in_ns "$PREFIX/bin/qstat" -a 2>/dev/null || true
    return "$rc"
}

cmd_submit() {  # submit [--user NAME] QSUB-ARGS...: from $STATE/jobs, as NAME (default the test user)
    local user=$TEST_USER
    if [[ ${1:-} == --user ]]; then user=$2; shift 2; fi
    cd "$STATE/jobs"
    in_ns runuser -u "$user" -- env PBS_CONF_FILE="$CONF" "$PREFIX/bin/qsub" "$@"
}

main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    case $cmd in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        env) echo "export PBS_CONF_FILE=$CONF"
             echo "# run PBS commands as: ip netns exec $NS unshare --uts sh -c 'hostname $PBS_HOSTNAME; exec \"\$@\"' sh $PREFIX/bin/qstat" ;;
        submit) cmd_submit "$@" ;;
        exec) in_ns "$@" ;;
        *) die "usage: cluster.sh up | down | status | env | submit [--user NAME] QSUB-ARGS... | exec CMD..." ;;
    esac
}

main "$@"
