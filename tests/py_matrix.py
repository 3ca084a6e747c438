"""The unit tests under the newer Pythons: Debian 13's 3.13 and forky's 3.14 (issue 19, item 4).

The interpreters are those of the cached Debian roots the Slurm matrix uses (tests/helpers/slurm_roots.py:
24.11 in trixie carries Python 3.13, 26.05 in forky 3.14), or of any root named with ``--root``.
For each, as root:

1. A venv of the root's interpreter holding gpuslurm's dependencies, its test extras and its
   build backend is made once and cached under ``/var/cache/gpuslurm-pyenv/<python>-<key>``
   (the key hashes the dependencies in pyproject.toml, the root's Python and this script's
   version; a change makes a new venv), with pip's cache beside it. pip runs inside the root with
   the host's CA bundle and resolv.conf.
2. Each run, in a private mount namespace, chrooted into an overlay of the root (the cached root is
   only ever read; whatever the tests write there goes to a tmpfs that vanishes with the
   namespace): the cached venv read-only, this checkout read-only at its own path (and
   ``../shared`` beside it), a fresh venv in /tmp whose ``.pth`` names the cached one, gpuslurm
   installed there from the checkout as a site installs it (a wheel, not editable), then pytest
   over the layers that need no cluster (``LAYERS``).

Tests that need Slurm, PBS, Docker or the replay NVML library (built with gcc on the host) stay
on the host's Python, where CI runs the whole suite.

    python tests/py_matrix.py [--python 3.13|3.14]... [--root VERSION=PATH]... [-- PYTEST_ARGS]

Exit status: 0 when every interpreter passed, 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

MATRIX_VERSION = 1
CHECKOUT = Path(__file__).resolve().parents[1]
SHARED = CHECKOUT.parent / "shared"
CACHE = Path(os.environ.get("GPUSLURM_PYENV_CACHE", "/var/cache/gpuslurm-pyenv"))
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Which Slurm root carries which Python (tests/helpers/slurm_roots.py RELEASES).
ROOT_OF = {"3.13": "24.11", "3.14": "26.05"}
# The test layers that need no cluster, no Docker and no C library built on the host.
LAYERS = ("tests/cli", "tests/demo", "tests/gres", "tests/hooks", "tests/hw", "tests/install", "tests/pbs",
          "tests/place", "tests/policy", "tests/report", "tests/slurm", "tests/state", "tests/topo",
          "tests/watch", "tests/test_layers.py", "tests/test_names.py", "tests/test_props_jobid.py",
          "tests/test_props_time.py", "tests/test_safedir.py", "tests/test_security_doc.py",
          "tests/test_times.py", "tests/test_tree.py", "tests/test_tuples.py")
# Under tests/hw, but built with the host's gcc and libcjson (the roots have neither); the behaviour
# snapshot, recorded on this host, holds its Slurm's version (slurmd -V names the MIG types) and its
# OpenPBS install, which a root has in other versions or not at all.
IGNORE = ("--ignore=tests/hw/nvml", "--ignore=tests/cli/test_snapshot.py")
DESELECT = "not slurm and not pbs"
UNSHARE, CHROOT = "/usr/bin/unshare", "/usr/sbin/chroot"


class MatrixError(RuntimeError):
    """A root or a venv could not be made or used."""


def requirements() -> list[str]:
    """gpuslurm's dependencies, its test extras and its build backend, from pyproject.toml."""
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    return [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["test"],
            *project["build-system"]["requires"]]


def root_python(root: Path, version: str) -> str:
    python = f"/usr/bin/python{version}"
    if not (root / python.lstrip("/")).exists():
        raise MatrixError(f"{root} has no {python}")
    return python


def venv_dir(root: Path, version: str) -> Path:
    facts = {"matrix": MATRIX_VERSION, "requirements": requirements(), "python": version,
             "root": json.loads((root / ".gpuslurm-root.json").read_text()).get("packages", {}).get("python3")
             if (root / ".gpuslurm-root.json").exists() else str(root)}
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    return CACHE / f"{version}-{key}"


def default_root(version: str) -> Path:
    """The cached Slurm root that carries ``version`` (built when absent: minutes)."""
    sys.path.insert(0, str(CHECKOUT))
    try:
        from tests.helpers import slurm_roots  # type: ignore[import-not-found]
    except ImportError as exc:
        raise MatrixError(f"no root for Python {version}: name one with --root {version}=PATH "
                          f"(tests/helpers/slurm_roots.py: {exc})") from exc
    return Path(slurm_roots.ensure_root(slurm_roots.RELEASES[ROOT_OF[version]]))


# Run in a private mount namespace: $1 root, $2 scratch (a tmpfs goes there), $3 venv cache dir,
# $4 checkout, $5 shared ("" when absent), then the command to run chrooted.
NAMESPACE = r'''
set -eu
root=$1 scratch=$2 pyenv=$3 checkout=$4 shared=$5
shift 5
mount -t tmpfs -o mode=0755 gpuslurm-py "$scratch"
mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$scratch/upper,workdir=$scratch/work" "$scratch/root"
new=$scratch/root
mount --rbind /dev "$new/dev"
mount -t proc proc "$new/proc"
mount --rbind /sys "$new/sys"
mount -t tmpfs -o mode=1777 tmp "$new/tmp"
mount -t tmpfs -o mode=0755 run "$new/run"
mkdir -p "$new$pyenv" "$new$checkout"
# The host's users and hosts as files of the overlay (the root links them to /.host-etc): tests that
# add users and groups (groupadd) write the copies, never the host's files.
for f in passwd group shadow gshadow hosts; do rm -f "$new/etc/$f"; cp -p "/etc/$f" "$new/etc/$f"; done
mount --bind "$pyenv" "$new$pyenv"
mount --bind -o ro "$checkout" "$new$checkout"
if [ -n "$shared" ]; then mkdir -p "$new$shared" && mount --bind -o ro "$shared" "$new$shared"; fi
mkdir -p "$new/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$new/etc/ssl/certs/ca-certificates.crt"
rm -f "$new/etc/resolv.conf" && cp /etc/resolv.conf "$new/etc/resolv.conf"
exec /usr/sbin/chroot "$new" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
'''


def in_root(root: Path, pyenv: Path, script: str, *args: str, timeout: float) -> int:
    """Run ``script`` (sh) chrooted into an overlay of ``root``, its output passed through."""
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuslurm-py-{os.getpid()}"
    scratch.mkdir(mode=0o700)
    try:
        argv = [UNSHARE, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", NAMESPACE, "ns",
                str(root), str(scratch), str(pyenv), str(CHECKOUT), str(SHARED) if SHARED.is_dir() else "",
                "/bin/sh", "-c", script, "inside", *args]
        return subprocess.run(argv, timeout=timeout, check=False).returncode
    finally:
        scratch.rmdir()  # the tmpfs went with the namespace


# Inside the root: $1 the interpreter, $2 the venv cache dir, then the requirements.
MAKE_VENV = r'''
set -eu
python=$1 dir=$2
shift 2
"$python" -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install -q --disable-pip-version-check --cache-dir "$dir/pip-cache" \
    --cert /etc/ssl/certs/ca-certificates.crt "$@"
'''


def ensure_venv(root: Path, version: str) -> Path:
    """The cached venv for ``version`` (made first when absent; serialised by a lock)."""
    pyenv = venv_dir(root, version)
    if (pyenv / "complete").exists():
        return pyenv
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{version}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (pyenv / "complete").exists():
            return pyenv
        shutil.rmtree(pyenv, ignore_errors=True)  # a build cut short
        pyenv.mkdir(mode=0o755)
        print(f"py_matrix: making {pyenv} (Python {version} of {root})", flush=True)
        rc = in_root(root, pyenv, MAKE_VENV, root_python(root, version), str(pyenv), *requirements(),
                     timeout=1200)
        if rc != 0:
            raise MatrixError(f"pip in {root} could not make {pyenv} (exit {rc})")
        (pyenv / "complete").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return pyenv


# Inside the root: a venv for this run whose .pth names the cached one, gpuslurm built from the
# checkout as a wheel and installed there, then pytest from the checkout.
RUN = r'''
set -eu
cached=$1 checkout=$2
shift 2
run=/tmp/venv
"$cached/venv/bin/python" -m venv --without-pip "$run"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
purelib "$cached/venv/bin/python" > "$(purelib "$run/bin/python")/gpuslurm-matrix-deps.pth"
"$run/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation \
    --no-cache-dir "$checkout"
cd "$checkout"
echo "py_matrix: $("$run/bin/python" -VV | head -1)"
export CI=1 PYTHONPYCACHEPREFIX=/tmp/pycache
exec "$run/bin/python" -m pytest -p no:cacheprovider "$@"
'''


def run_version(version: str, root: Path, pytest_args: list[str]) -> tuple[int, float]:
    started = time.monotonic()
    pyenv = ensure_venv(root, version)
    made = time.monotonic() - started
    print(f"py_matrix: Python {version}: root {root}, venv {pyenv} ({made:.0f} s)", flush=True)
    args = pytest_args or ["-q", "-m", DESELECT, *IGNORE, *LAYERS]
    rc = in_root(root, pyenv, RUN, str(pyenv), str(CHECKOUT), *args, timeout=3600)
    return rc, time.monotonic() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="py_matrix.py", description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", choices=sorted(ROOT_OF), help="default: all")
    parser.add_argument("--root", action="append", default=[], metavar="VERSION=PATH",
                        help="a Debian root holding /usr/bin/pythonVERSION "
                             "(default: tests/helpers/slurm_roots.py's)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: LAYERS)")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (a mount namespace and chroot)")
    roots: dict[str, Path] = {}
    for item in opts.root:
        version, sep, path = item.partition("=")
        if not sep or version not in ROOT_OF or not Path(path).is_dir():
            parser.error(f"--root {item!r}: not VERSION=PATH with VERSION one of {', '.join(ROOT_OF)} "
                         "and PATH a directory")
        roots[version] = Path(path)
    results = {}
    for version in opts.python or sorted(ROOT_OF):
        try:
            root = roots.get(version) or default_root(version)
            results[version] = run_version(version, root, opts.pytest_args)
        except (MatrixError, OSError, subprocess.SubprocessError) as exc:
            print(f"py_matrix: Python {version}: {exc}", file=sys.stderr)
            results[version] = (1, 0.0)
    for version, (rc, took) in results.items():
        said = "passed" if rc == 0 else f"FAILED (exit {rc})"
        print(f"py_matrix: Python {version}: {said} in {took:.0f} s")
    return 0 if all(rc == 0 for rc, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
