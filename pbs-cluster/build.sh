#!/bin/bash
# Build OpenPBS from the vendored source tarball into a cached prefix.
# Usage: pbs-cluster/build.sh [TARBALL]   (env: PBS_PREFIX, default /opt/pbs)
# The build is skipped when $PBS_PREFIX/.gpuslurm-source-sha256 matches the tarball's hash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vendor=${GPUSLURM_VENDOR:-$here/../../shared/vendor}
tarball=${1:-$(ls "$vendor"/openpbs-*.tar.gz 2>/dev/null | head -1 || true)}
prefix=${PBS_PREFIX:-/opt/pbs}
expected=c819de5b7b8a21fa32c955568a520ba1a2c1e2d993164842de956b7224d8972d
[ -n "$tarball" ] && [ -f "$tarball" ] || { echo "pbs-build: no OpenPBS tarball in $vendor" >&2; exit 2; }
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
[ "$sum" = "$expected" ] || { echo "pbs-build: $tarball sha256 $sum != $expected (OPENPBS.md)" >&2; exit 2; }
stamp=$prefix/.gpuslurm-source-sha256
# One build at a time per host (CI, a test session and a developer may start one together).
mkdir -p /run/lock
exec {lock_fd}>/run/lock/gpuslurm-pbs-build.lock
flock "$lock_fd"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -x "$prefix/sbin/pbs_server.bin" ]; then
    echo "pbs-build: cached install in $prefix matches $sum"; exit 0
fi
deps="gcc make libtool libhwloc-dev libx11-dev libxt-dev libedit-dev libical-dev libncurses-dev perl
 postgresql-server-dev-all postgresql-contrib python3-dev tcl-dev tk-dev swig libexpat1-dev
 libssl-dev libxext-dev libxft-dev autoconf automake g++ libcjson-dev expat libedit2 postgresql
 sendmail-bin"
missing=$(for p in $deps; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
    echo "pbs-build: installing $missing"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi
work=$(mktemp -d /var/tmp/pbs-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
tar -xzf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
cd "$src"
./autogen.sh >"$work/autogen.log" 2>&1 || { tail -30 "$work/autogen.log"; exit 1; }
./configure --prefix="$prefix" >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log"; exit 1; }
rm -rf "$prefix"
# install writes /etc/pbs.conf and init scripts only through pbs_postinstall, which the cluster
# script replaces with a private PBS_CONF_FILE.
make install >"$work/install.log" 2>&1 || { tail -30 "$work/install.log"; exit 1; }
chmod 4755 "$prefix/sbin/pbs_iff" "$prefix/sbin/pbs_rcp"
echo "$sum" >"$stamp"
echo "pbs-build: built $prefix in $(( $(date +%s) - start ))s"
