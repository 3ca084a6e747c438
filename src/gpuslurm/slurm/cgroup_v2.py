"""Where Slurm's cgroup/v2 plugin keeps a job on this node: found from cgroup.conf, the node's name
and what exists on disk, never guessed (pure parsing, and a small finder).

Read from Slurm's ``src/plugins/cgroup/v2/cgroup_v2.c`` and ``src/interfaces/cgroup.c``:

- slurmd's stepd scope is ``<cgroup root>/<CgroupSlice>/<NodeName>_slurmstepd.scope`` when Slurm
  was built with ``--enable-multiple-slurmd`` (Debian's packages are, 22.05 included, so one slurmd
  per host still gets the prefix), else ``<cgroup root>/<CgroupSlice>/slurmstepd.scope``.
  ``CgroupSlice`` (25.11+) defaults to ``system.slice``. Which build this is shows on disk only,
  so both names are looked for.
- a job's directory in the scope is ``job_<id>`` up to 25.11 (which already exports
  ``SLURM_JOB_SLUID`` to Prolog and Epilog), and ``s<SLUID>`` from 26.05, unless cgroup.conf says
  ``CgroupJobIdPaths=yes`` (26.05.2+), which keeps ``job_<id>``. With ``PrologFlags=Contain`` the
  directory exists before the Prolog runs (the extern step is in it), and then it is what is
  used; otherwise the release decides, from ``slurmd -V`` (cached in the run directory, keyed by
  the binary's identity), and only when the job has a SLUID at all.
- Slurm makes these directories as root (``common_cgroup_create(..., 0, 0)``): nothing in them
  is delegated to the job's user.

A missing scope is a HardwareError naming every path looked for: the prolog fails closed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import HardwareError, InputError
from gpuslurm.jobid import valid_job_id, valid_sluid
from gpuslurm.slurm.version import SlurmVersion

if TYPE_CHECKING:
    from gpuslurm.config import Config

DEFAULT_SLICE = "system.slice"
SCOPE = "slurmstepd.scope"
SLUID_DIRS = SlurmVersion(26, 5)  # job directories named s<SLUID> (CgroupJobIdPaths=yes: job_<id>)
MAX_CONF_BYTES = 1 << 20
_TRUE = frozenset({"yes", "true", "1", "up"})  # Slurm's s_p_boolean
_FALSE = frozenset({"no", "false", "0", "down"})


class SlurmCgroupConf(NamedTuple):
    """What gpuslurm reads from Slurm's cgroup.conf (keys are case-insensitive; the last wins)."""

    plugin: str = "autodetect"  # CgroupPlugin
    slice: str = DEFAULT_SLICE  # CgroupSlice (25.11+)
    job_id_paths: bool = False  # CgroupJobIdPaths (26.05.2+)
    constrain_devices: bool = False  # ConstrainDevices


def parse_cgroup_conf(text: str | None, source: str = "cgroup.conf") -> SlurmCgroupConf:
    """The settings of cgroup.conf's ``text`` (None: no file, Slurm's defaults); InputError (one
    line, exit 2) for a value Slurm would refuse or a slice gpuslurm cannot trust."""
    if text is None:
        return SlurmCgroupConf()
    if len(text) > MAX_CONF_BYTES:
        raise InputError(f"larger than {MAX_CONF_BYTES} bytes", source=source)
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        key, eq, value = line.split("#", 1)[0].partition("=")
        key, value = key.strip().lower(), value.strip()
        if eq and key in ("cgroupplugin", "cgroupslice", "cgroupjobidpaths", "constraindevices"):
            found[key] = value
            found[f"{key}:line"] = str(number)
    conf = SlurmCgroupConf()
    if "cgroupplugin" in found:
        conf = conf._replace(plugin=found["cgroupplugin"].lower())
    if "cgroupslice" in found:
        conf = conf._replace(slice=check_slice(found["cgroupslice"], f"{source}:{found['cgroupslice:line']}"))
    if "cgroupjobidpaths" in found:
        conf = conf._replace(job_id_paths=_boolean(found["cgroupjobidpaths"],
                                                   f"{source}:{found['cgroupjobidpaths:line']}"))
    if "constraindevices" in found:
        conf = conf._replace(constrain_devices=_boolean(found["constraindevices"],
                                                        f"{source}:{found['constraindevices:line']}"))
    return conf


def check_slice(value: str, source: str) -> str:
    """``value`` if it is a slice name Slurm's scope can live in: one path component, printable,
    not systemd's per-user tree (users make cgroups there, so nothing below it is a job's)."""
    if not (0 < len(value) <= 255 and value.isprintable() and "/" not in value and value not in (".", "..")
            and not value.startswith(".") and value != "user.slice" and not value.startswith("user-")
            and not value.startswith("user@")):
        raise InputError(f"CgroupSlice={value[:60]!r} is not one slice name outside user.slice",
                         source=source)
    return value


def _boolean(value: str, source: str) -> bool:
    word = value.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise InputError(f"not a yes/no value: {value[:40]!r}", source=source)


def scope_dirs(conf: SlurmCgroupConf, node_name: str) -> tuple[str, ...]:
    """The stepd scope's possible places, relative to the cgroup root, the multiple-slurmd name
    first (Debian's build)."""
    from gpuslurm.names import check_node_name

    check_node_name(node_name, source="SLURMD_NODENAME")
    return (f"{conf.slice}/{node_name}_{SCOPE}", f"{conf.slice}/{SCOPE}")


def job_dir_names(job_id: str, sluid: str | None) -> tuple[str, ...]:
    """The names the job's directory may have in the scope: ``s<SLUID>`` (when the job has one),
    ``job_<id>``."""
    if not (valid_job_id(job_id) and job_id.isascii() and job_id.isdigit()):
        raise InputError(f"not a Slurm job id: {job_id!r}", source="SLURM_JOB_ID")
    if sluid is not None and not valid_sluid(sluid):
        raise InputError(f"not a SLUID: {sluid[:40]!r}", source="SLURM_JOB_SLUID")
    return ((sluid,) if sluid is not None else ()) + (f"job_{job_id}",)


def names_by_sluid(conf: SlurmCgroupConf, sluid: str | None,
                   version: Callable[[], SlurmVersion | None]) -> bool:
    """Whether Slurm names this job's directory ``s<SLUID>`` (asks ``version`` only when needed);
    HardwareError when that depends on a release that cannot be found."""
    if sluid is None or conf.job_id_paths:
        return False
    found = version()
    if found is None:
        raise HardwareError("cannot tell whether Slurm names the job's cgroup by SLUID (26.05+) or "
                            "job id: no job directory yet and no slurmd -V")
    return found >= SLUID_DIRS


class JobCgroup(NamedTuple):
    """The job's cgroup/v2 directory, found."""

    path: str  # absolute
    exists: bool  # False: Slurm has not made it yet (no PrologFlags=Contain); the caller makes it


def find_job_cgroup(cgroup_root: str, conf: SlurmCgroupConf, node_name: str, job_id: str,
                    sluid: str | None, version: Callable[[], SlurmVersion | None],
                    parent: str = "") -> JobCgroup:
    """Where Slurm keeps job ``job_id`` (``sluid``: ``SLURM_JOB_SLUID``, None before 25.11) under
    ``cgroup_root``; ``parent`` (``[cgroup] v2_job_parent``, relative) overrides the scope's
    discovery. HardwareError naming every path looked for when no scope exists, or a directory
    found is not root's."""
    if parent:
        parts = [p for p in parent.split("/") if p]
        if parent.startswith("/") or ".." in parts:
            raise InputError(f"must be relative to cgroup_root: {parent!r}", source="cgroup.v2_job_parent")
        scopes: tuple[str, ...] = ("/".join(parts),)
    else:
        scopes = scope_dirs(conf, node_name)
    names = job_dir_names(job_id, sluid)
    existing = [os.path.join(cgroup_root, s) for s in scopes if _root_dir(os.path.join(cgroup_root, s))]
    if not existing:
        looked = ", ".join(os.path.join(cgroup_root, s) for s in scopes)
        raise HardwareError(f"no slurmstepd scope of Slurm's cgroup/v2 plugin: looked for {looked}"
                            f"{'' if parent else ' (CgroupSlice ' + conf.slice + ')'}; is slurmd "
                            f"running with cgroup/v2 here? (or set [cgroup] v2_job_parent)")
    for scope in existing:  # PrologFlags=Contain: Slurm made it already
        for name in names:
            path = os.path.join(scope, name)
            if os.path.lexists(path):
                if not _root_dir(path):
                    raise HardwareError(f"{path}: not a cgroup directory of root's")
                return JobCgroup(path, True)
    name = names[0] if names_by_sluid(conf, sluid, version) else names[-1]
    return JobCgroup(os.path.join(existing[0], name), False)


def _root_dir(path: str) -> bool:
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def cached_slurmd_version(run_dir: str, slurmd: str, timeout: float,
                          warn: Callable[[str], None] | None = None) -> SlurmVersion | None:
    """``slurmd -V``'s release, through ``<run_dir>/cache/slurmd-version.json`` while slurmd is the
    same file; None when there is no slurmd (or it says nothing Slurm-like)."""
    from gpuslurm.hooks.cache import cached
    from gpuslurm.slurm.version import installed_slurm_version

    try:
        st = os.stat(slurmd)
    except OSError:
        return None
    key = [slurmd, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]

    def ask() -> list[int] | None:
        try:
            found = installed_slurm_version(slurmd, timeout)
        except InputError:  # it printed something that is no release
            return None
        return list(found) if found is not None else None

    value = cached(run_dir, "slurmd-version.json", key, ask, warn)
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return SlurmVersion(*value)
    return None


def job_cgroup(cfg: Config, node_name: str, job_id: str, sluid: str | None,
               warn: Callable[[str], None] | None = None,
               version: Callable[[], SlurmVersion | None] | None = None) -> JobCgroup:
    """:func:`find_job_cgroup` with this node's config: ``[paths] cgroup_root``, Slurm's cgroup.conf
    (``[paths] slurm_cgroup_conf``), ``[cgroup] v2_job_parent`` and ``[paths] slurmd`` (``version``
    stands in for it when given)."""
    conf_path = cfg.paths.slurm_cgroup_conf
    try:
        with open(conf_path, encoding="utf-8", errors="replace") as fh:
            text: str | None = fh.read(MAX_CONF_BYTES + 1)
    except FileNotFoundError:
        text = None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=conf_path) from None
    conf = parse_cgroup_conf(text, conf_path)
    if version is None:
        def version() -> SlurmVersion | None:
            return cached_slurmd_version(cfg.paths.run_dir, cfg.paths.slurmd, cfg.hooks.command_timeout_s,
                                         warn)
    return find_job_cgroup(cfg.paths.cgroup_root, conf, node_name, job_id, sluid, version,
                           cfg.cgroup.v2_job_parent)
