"""``gpuslurm install --pbs --classic``: write ``$PBS_HOME/mom_priv/prologue`` and ``epilogue``.

Each script is a few lines of Python run by the interpreter that holds gpuslurm (``#!PYTHON -I``:
pbs_mom execs it directly, with no PATH to search) calling :func:`gpuslurm.pbs.classic.run` with
the config file and capture bundle written into it. pbs_mom runs a script only when it is a
regular file owned by root, readable and executable by its owner and writable by neither group
nor others (``run_pelog`` in ``src/resmom/prolog.c``; anything else is a "Permission Error" and the
job is requeued), so they are written root's, mode 0755, atomically (a temporary file in
``mom_priv`` renamed over the old one). Run again, an unchanged script is left alone; a script
gpuslurm did not write (no marker line) is refused unless ``force``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from gpuslurm.errors import InputError

KINDS = ("prologue", "epilogue")
MARKER = "# gpuslurm: the classic PBS"  # the line that says gpuslurm wrote the file
MODE = 0o755
DEFAULT_PBS_HOME = "/var/spool/pbs"
MAX_SHEBANG = 200  # Linux reads 255 bytes of a #! line (BINPRM_BUF_SIZE 256)


class ScriptStep(NamedTuple):
    """One script to write (``verb``: create, update, fix) or leave (``same``)."""

    path: str
    verb: str
    content: bytes


def pbs_home(environ: Mapping[str, str] | None = None) -> str:
    """``PBS_MOM_HOME``, else ``PBS_HOME``, from the pbs.conf PBS reads (``PBS_CONF_FILE``, else
    /etc/pbs.conf); else /var/spool/pbs."""
    env = os.environ if environ is None else environ
    conf = env.get("PBS_CONF_FILE") or "/etc/pbs.conf"
    found: dict[str, str] = {}
    try:
        with open(conf, encoding="utf-8", errors="replace") as handle:
            for line in handle.read(1 << 16).splitlines():
                key, eq, value = line.partition("=")
                if eq and key.strip() in ("PBS_MOM_HOME", "PBS_HOME") and os.path.isabs(value.strip()):
                    found[key.strip()] = value.strip()
    except OSError:
        pass
    return found.get("PBS_MOM_HOME") or found.get("PBS_HOME") or DEFAULT_PBS_HOME


def script_text(kind: str, python: str, config: str = "", capture: str = "") -> bytes:
    """The ``kind`` script: runs :func:`gpuslurm.pbs.classic.run` under ``python -I``."""
    if kind not in KINDS:
        raise ValueError(kind)
    if not os.path.isabs(python) or any(c.isspace() for c in python) or len(python) > MAX_SHEBANG:
        raise InputError("the interpreter must be an absolute path without spaces (a #! line)", python)
    for value in (config, capture):
        if value and (not os.path.isabs(value) or "\n" in value):
            raise InputError("must be an absolute path", value)
    return (f"#!{python} -I\n"
            f"{MARKER} {kind}, written by `gpuslurm install --pbs --classic`; see docs/pbs.md.\n"
            "# pbs_mom runs it as root with the job's id, user and group (and more for the epilogue).\n"
            "from gpuslurm.pbs.classic import run\n"
            f"run({kind!r}, config={config or None!r}, capture={capture or None!r})\n").encode()


def plan_scripts(mom_priv: str, python: str, config: str = "", capture: str = "",
                 force: bool = False) -> list[ScriptStep]:
    """What to write in ``mom_priv``: one step per script (``same`` when nothing changes).

    InputError for a directory that is not there, a link or other non-file in a script's place,
    or a script gpuslurm did not write (without ``force``)."""
    if not os.path.isdir(mom_priv):
        raise InputError("is not a directory: is this a PBS execution host? (--pbs-home)", mom_priv)
    steps = []
    for kind in KINDS:
        path = os.path.join(mom_priv, kind)
        want = script_text(kind, python, config, capture)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            steps.append(ScriptStep(path, "create", want))
            continue
        if not stat.S_ISREG(st.st_mode):
            raise InputError("is not a regular file (a link?): remove it first", path)
        with open(path, "rb") as handle:
            have = handle.read(1 << 20)
        if have != want and MARKER.encode() not in have and not force:
            raise InputError("is a site's own script, not gpuslurm's: merge it by hand, or give "
                             "--force to replace it", path)
        if have != want:
            steps.append(ScriptStep(path, "update", want))
        elif st.st_uid != 0 or stat.S_IMODE(st.st_mode) != MODE:
            steps.append(ScriptStep(path, "fix", want))
        else:
            steps.append(ScriptStep(path, "same", want))
    return steps


def write_script(step: ScriptStep) -> None:
    """Write ``step``'s script root's, mode 0755, by renaming a finished temporary file over it."""
    directory, name = os.path.split(step.path)
    tmp = os.path.join(directory, f".{name}.gpuslurm-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
    try:
        try:
            os.write(fd, step.content)
            os.fchown(fd, 0, 0)
            os.fchmod(fd, MODE)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, step.path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def describe(steps: Sequence[ScriptStep], mom_priv: str, dry_run: bool) -> list[str]:
    """What the install does to the scripts (``dry_run``: would do), or that nothing changes."""
    would = "would " if dry_run else ""
    said = {"create": "create {} (root's, mode 0755)", "update": "update {} (root's, mode 0755)",
            "fix": "set {} root's, mode 0755"}
    lines = [f"{would}{said[s.verb].format(s.path)}" for s in steps if s.verb in said]
    if all(s.verb == "same" for s in steps):
        lines.append(f"nothing to change: {mom_priv} has gpuslurm's prologue and epilogue")
    return lines


def apply_scripts(steps: Sequence[ScriptStep]) -> None:
    """Write every script that changes (:func:`write_script`)."""
    for step in steps:
        if step.verb != "same":
            write_script(step)


WHAT_THEY_DO = ("# pbs_mom runs them for each job when no execjob_prologue/execjob_epilogue hook is "
                "enabled: health gate and vnode offline, leftovers, summary; no GPU choice, no "
                "CUDA_VISIBLE_DEVICES, no device cgroup (gpuslurm's hooks do those: install --pbs)")
