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
  ``s<SLUID>`` directory exists before the Prolog runs (the extern step is in it), and then it
  is what is used. Otherwise nothing on disk says what slurmstepd will make: neither the slurmd
  binary installed (the running one may be older or newer) nor the cgroup.conf gpuslurm reads
  (configless Slurm reads another) is proof, so the prolog is given every place.
- Slurm makes these directories as root (``common_cgroup_create(..., 0, 0)``): nothing in them
  is delegated to the job's user.

A missing scope is a HardwareError naming every path looked for: the prolog fails closed.
"""

from __future__ import annotations

import os

from gpuslurm.errors import HardwareError, InputError
from gpuslurm.jobid import valid_job_id, valid_sluid
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # not typing's: the prolog imports this module

if TYPE_CHECKING:
    from gpuslurm.config import Config

DEFAULT_SLICE = "system.slice"
SCOPE = "slurmstepd.scope"
MAX_CONF_BYTES = 1 << 20
_TRUE = frozenset({"yes", "true", "1", "up"})  # Slurm's s_p_boolean
_FALSE = frozenset({"no", "false", "0", "down"})


class SlurmCgroupConf(NamedTuple):
    """What gpuslurm reads from Slurm's cgroup.conf (keys are case-insensitive; the last wins)."""

    plugin: str = "autodetect"  # CgroupPlugin
    slice: str = DEFAULT_SLICE  # CgroupSlice (25.11+)
    job_id_paths: bool = False  # CgroupJobIdPaths (26.05.2+): read, not relied on (find_job_cgroup)
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


class JobCgroup(NamedTuple):
    """Where the job's cgroup/v2 directory is, or may be."""

    paths: tuple[str, ...]  # absolute: Slurm's when it made it, else every place it may make it
    exists: bool  # True: Slurm made it already (PrologFlags=Contain); False: the caller makes them


def find_job_cgroup(cgroup_root: str, conf: SlurmCgroupConf, node_name: str, job_id: str,
                    sluid: str | None, parent: str = "") -> JobCgroup:
    """Where Slurm keeps job ``job_id`` (``sluid``: ``SLURM_JOB_SLUID``, None before 25.11) under
    ``cgroup_root``; ``parent`` (``[cgroup] v2_job_parent``, relative) overrides the scope's
    discovery. HardwareError naming every path looked for when no scope exists, or a directory
    found is not root's.

    ``s<SLUID>`` that exists is Slurm's (a SLUID is never reused). Otherwise where slurmstepd will
    make the job's directory is not on disk: the running slurmd may not be the binary installed
    (an upgrade before its restart), a scope of another build may be left, cgroup.conf may not be
    the one slurmd read (configless), and a ``job_<id>`` may be left by an earlier job of that id.
    Every place it may be is given, in each scope found, under each name the job may have.
    """
    paths = _places(cgroup_root, conf, node_name, job_id, sluid, parent)
    for path in paths:
        if os.path.lexists(path) and not _root_dir(path):
            raise HardwareError(f"{path}: not a cgroup directory of root's")
    made = [p for p in paths if os.path.lexists(p) and (sluid is None or os.path.basename(p) == sluid)]
    if made:
        return JobCgroup((made[0],), True)  # PrologFlags=Contain: Slurm made it already
    return JobCgroup(paths, False)


def existing_job_cgroups(cgroup_root: str, conf: SlurmCgroupConf, node_name: str, job_id: str,
                         sluid: str | None, parent: str = "") -> tuple[str, ...]:
    """Every place :func:`find_job_cgroup` may give that is root's directory now (the epilog
    removes the empty ones); none when there is no scope."""
    try:
        paths = _places(cgroup_root, conf, node_name, job_id, sluid, parent)
    except HardwareError:
        return ()
    return tuple(p for p in paths if _root_dir(p))


def _places(cgroup_root: str, conf: SlurmCgroupConf, node_name: str, job_id: str, sluid: str | None,
            parent: str) -> tuple[str, ...]:
    """Each name the job's directory may have, in each stepd scope that exists (root's)."""
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
    return tuple(os.path.join(scope, name) for scope in existing for name in names)


def _root_dir(path: str) -> bool:
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def _read_conf_text(conf_path: str) -> str | None:
    """cgroup.conf's text, bounded (InputError past ``MAX_CONF_BYTES``); None when there is none."""
    try:
        with open(conf_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(MAX_CONF_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=conf_path) from None
    if len(text) > MAX_CONF_BYTES:
        raise InputError(f"larger than {MAX_CONF_BYTES} bytes", source=conf_path)
    return text


def read_cgroup_conf(cfg: Config) -> SlurmCgroupConf:
    """Slurm's cgroup.conf (``[paths] slurm_cgroup_conf``), parsed; none there: Slurm's defaults."""
    conf_path = cfg.paths.slurm_cgroup_conf
    return parse_cgroup_conf(_read_conf_text(conf_path), conf_path)


def constrains_devices(cgroup_conf: str | None) -> bool:
    """Whether cgroup.conf's text says ``ConstrainDevices=yes`` (keys case-insensitive, the last
    setting wins; None: no file, so no).

    Deliberately not :func:`parse_cgroup_conf`: this is asked on cgroup v1 nodes too, whose prolog
    must not fail over a v2-only key gpuslurm refuses (``CgroupSlice``), and a value Slurm would
    not read as true reads as "no", so that gpuslurm isolates the job itself (the safe side).
    """
    result = False
    for line in (cgroup_conf or "").splitlines():
        key, eq, value = line.split("#", 1)[0].partition("=")
        if eq and key.strip().lower() == "constraindevices":
            result = value.strip().lower() in _TRUE
    return result


def read_constrains_devices(cfg: Config) -> bool:
    """:func:`constrains_devices` of Slurm's cgroup.conf (``[paths] slurm_cgroup_conf``)."""
    return constrains_devices(_read_conf_text(cfg.paths.slurm_cgroup_conf))


def job_cgroup(cfg: Config, node_name: str, job_id: str, sluid: str | None) -> JobCgroup:
    """:func:`find_job_cgroup` with this node's config: ``[paths] cgroup_root``, Slurm's cgroup.conf
    and ``[cgroup] v2_job_parent``."""
    return find_job_cgroup(cfg.paths.cgroup_root, read_cgroup_conf(cfg), node_name, job_id, sluid,
                           cfg.cgroup.v2_job_parent)


def existing_job_cgroup_dirs(cfg: Config, node_name: str, job_id: str, sluid: str | None) -> tuple[str, ...]:
    """:func:`existing_job_cgroups` with this node's config."""
    return existing_job_cgroups(cfg.paths.cgroup_root, read_cgroup_conf(cfg), node_name, job_id, sluid,
                                cfg.cgroup.v2_job_parent)
