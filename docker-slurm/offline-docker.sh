#!/usr/bin/env bash
# A private Docker engine and a Debian 12 base image for machines that reach no container registry
# (the test machines of this project): Debian's docker.io started as root with its own data root
# and socket, no bridge and no iptables, and a base image made by debootstrap instead of pulled.
#
#   offline-docker.sh start   start dockerd (if its socket does not answer); prints the socket
#   offline-docker.sh stop    stop the dockerd this script started (by its pid file)
#   offline-docker.sh status  exit 0 when a dockerd answers on the socket
#   offline-docker.sh base    print the base image's name, making it first if the engine lacks it
#
# Environment:
#   GPUSLURM_DOCKER_ROOT    data root (default /var/lib/gpuslurm-docker): images and the build
#                           cache live here, so a machine that keeps it builds only what changed
#   GPUSLURM_DOCKER_RUN     socket, pid file and exec root (default /run/gpuslurm-docker)
#   GPUSLURM_DEBIAN_MIRROR  debootstrap's mirror (default: the first http URI of apt's sources,
#                           else http://deb.debian.org/debian)
#
# The base image is `gpuslurm-debootstrap:bookworm-<marker>`, the marker a hash of what makes it
# (suite, variant, mirror, debootstrap's version), so a changed recipe makes a new image and an
# unchanged one is reused. It stands in for `debian:12`: `docker build --build-arg BASE=<name>`.
set -euo pipefail

ROOT=${GPUSLURM_DOCKER_ROOT:-/var/lib/gpuslurm-docker}
RUN=${GPUSLURM_DOCKER_RUN:-/run/gpuslurm-docker}
SOCKET=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
LOG=$RUN/dockerd.log
SUITE=bookworm
VARIANT=minbase
DOCKERD=/usr/sbin/dockerd
DEBOOTSTRAP=/usr/sbin/debootstrap

die() { echo "offline-docker.sh: $*" >&2; exit 1; }
note() { echo "offline-docker.sh: $*" >&2; }

docker_cli() {
    # Any docker client works; the engine's API is all this script uses it for.
    command -v docker >/dev/null || die "no docker client (apt-get install -y docker.io)"
    docker --host "unix://$SOCKET" "$@"
}

answers() { docker_cli version --format '{{.Server.Version}}' >/dev/null 2>&1; }

cmd_start() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (dockerd)"
    [[ -x $DOCKERD ]] || die "$DOCKERD is missing: apt-get install -y docker.io"
    if answers; then
        echo "$SOCKET"
        return 0
    fi
    mkdir -p "$ROOT" "$RUN"
    chmod 700 "$ROOT" "$RUN"
    # --bridge=none --iptables=false: no network of Docker's own and no firewall changes; containers
    # run with --network none (or host). The managed containerd keeps its state under the exec root.
    setsid "$DOCKERD" --data-root "$ROOT" --exec-root "$RUN/exec" --host "unix://$SOCKET" \
        --pidfile "$PIDFILE" --storage-driver vfs --bridge none --iptables=false --ip-masq=false \
        --ip-forward=false --log-level warn </dev/null >"$LOG" 2>&1 &
    local i
    for ((i = 0; i < 300; i++)); do
        if answers; then
            echo "$SOCKET"
            return 0
        fi
        sleep 0.2
    done
    die "dockerd does not answer on $SOCKET after 60 s; last lines of $LOG:"$'\n'"$(tail -n 20 "$LOG")"
}

cmd_stop() {
    local pid i
    [[ -s $PIDFILE ]] || return 0
    pid=$(<"$PIDFILE")
    [[ $pid =~ ^[0-9]+$ ]] || die "$PIDFILE holds no pid"
    kill -TERM "$pid" 2>/dev/null || return 0
    # dockerd stops its containers (10 s each) and its containerd before it exits.
    for ((i = 0; i < 600; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    note "dockerd (pid $pid) still runs after 60 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
}

mirror() {
    if [[ -n ${GPUSLURM_DEBIAN_MIRROR:-} ]]; then
        echo "$GPUSLURM_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(grep -hoE '(^deb |^URIs:) *http://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* \
        2>/dev/null | grep -oE 'http://[^ ]+' | head -n 1 || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

cmd_base() {
    local url marker name dir
    [[ -x $DEBOOTSTRAP ]] || die "$DEBOOTSTRAP is missing: apt-get install -y debootstrap"
    url=$(mirror)
    marker=$(printf '%s\n' "$SUITE" "$VARIANT" "$url" "$(dpkg-query -W -f='${Version}' debootstrap)" \
        | sha256sum | cut -c1-12)
    name=gpuslurm-debootstrap:$SUITE-$marker
    if docker_cli image inspect "$name" >/dev/null 2>&1; then
        echo "$name"
        return 0
    fi
    dir=$(mktemp -d "${TMPDIR:-/tmp}/gpuslurm-debootstrap.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this directory
    trap "rm -rf '$dir'" EXIT
    note "debootstrap --variant=$VARIANT $SUITE from $url (a few minutes)"
    "$DEBOOTSTRAP" --variant="$VARIANT" "$SUITE" "$dir/root" "$url" >"$dir/debootstrap.log" 2>&1 \
        || die "debootstrap failed; last lines of its log:"$'\n'"$(tail -n 20 "$dir/debootstrap.log")"
    # As in Debian's own images: no apt caches, and apt's sources the mirror debootstrap used.
    rm -rf "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"*
    tar -C "$dir/root" -c . | docker_cli import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
    echo "$name"
}

case ${1:-} in
    start) cmd_start ;;
    status) answers ;;
    stop) cmd_stop ;;
    base) cmd_base ;;
    *) die "usage: offline-docker.sh start | stop | status | base" ;;
esac
