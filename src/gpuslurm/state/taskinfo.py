"""What a job's tasks need of its devices, written once by the prolog for the task prolog to read.

The task prolog runs once per task as the job's user (``srun -n 64``: 64 times), so it must not
pay for NVML or a bundle parse each time, and it cannot read the root-only job map
(:mod:`gpuslurm.state.jobmap`). The prolog, which has resolved and gated the job's devices
anyway, writes ``<run_dir>/tasks/<jobid>.json``: each device's UUID, GRES index, NUMA node and
close CPUs. The file is root's, mode 0400, and the job's user reads it through a POSIX access ACL
of their uid alone (:func:`gpuslurm.safedir.reader_acl`, set before the rename), in a directory
that is root's and 0755: the job's user can read it and can neither change nor replace it, and no
one else (another member of the job's group included) can read which devices the job has. Where
the file system has no ACLs there is no task file: the job's tasks read the node instead.

The reader (as the job's user) trusts it only when the directory and the file are root's and
writable by nobody else (an ACL entry that grants write shows in the group bits, its mask), the
file is regular, has one link (not another job's file hard-linked
where the user can reach it) and names this job and this user. A missing file (a job started by a
prolog older than this file) is None: the caller falls back to reading the node.
"""

from __future__ import annotations

import json
import os
import stat

from gpuslurm.errors import InputError
from gpuslurm.jobid import check_job_id
from gpuslurm.safedir import UnsafePathError, open_dir, replace_at, why_refused
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.state.job import GpuClaim, JobDevice

TASKS_DIR = "tasks"
FORMAT_VERSION = 1
FILE_MODE = 0o400  # plus read for the job's uid alone, through an ACL
MAX_BYTES = 1 << 18  # a 64-device job is ~10 KiB


class TaskDevice(NamedTuple):
    """One of the job's devices as its tasks see it."""

    uuid: str  # GPU-… or MIG-…
    gres_index: int | None = None  # Slurm's GRES index (node_devices order), when known
    aliases: tuple[str, ...] = ()  # other names a claim may give it (MIG-<gpu uuid>/<gi>/<ci>)
    numa_node: int | None = None
    cpus: str = ""  # the OS CPUs close to its GPU, as ranges (``0-55,112-167``); empty: unknown


class TaskInfo(NamedTuple):
    """The job's devices on this node, for its tasks."""

    job_id: str
    uid: int
    devices: tuple[TaskDevice, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "job_id": self.job_id, "uid": self.uid,
                "devices": [{"uuid": d.uuid, "gres_index": d.gres_index, "aliases": list(d.aliases),
                             "numa_node": d.numa_node, "cpus": d.cpus} for d in self.devices]}

    @classmethod
    def from_dict(cls, data: object, source: str) -> TaskInfo:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise InputError(f"not a version {FORMAT_VERSION} task file", source=source)
        items = _get(data, "devices", list, source)
        devices = []
        for item in items:
            if not isinstance(item, dict):
                raise InputError("a device must be an object", source=source)
            aliases = _get(item, "aliases", list, source)
            if not all(isinstance(a, str) for a in aliases):
                raise InputError("aliases must be strings", source=source)
            devices.append(TaskDevice(_get(item, "uuid", str, source),
                                      _get(item, "gres_index", int, source, optional=True),
                                      tuple(aliases),
                                      _get(item, "numa_node", int, source, optional=True),
                                      _get(item, "cpus", str, source)))
        return cls(check_job_id(_get(data, "job_id", str, source)), _get(data, "uid", int, source),
                   tuple(devices))


def task_device(dev: JobDevice) -> TaskDevice:
    """What a task needs of one resolved device (its GPU's NUMA node and close CPUs)."""
    from gpuslurm.ranges import format_ranges

    aliases = () if dev.mig is None else (f"MIG-{dev.gpu.uuid}/{dev.mig.gi_id}/{dev.mig.ci_id}",)
    return TaskDevice(dev.uuid, dev.gres_index, aliases, dev.gpu.numa_node,
                      format_ranges(dev.gpu.cpu_affinity) if dev.gpu.cpu_affinity else "")


def claimed_devices(info: TaskInfo, claim: GpuClaim) -> tuple[TaskDevice, ...]:
    """The devices of ``claim`` (a step's, or the job's) among the job's, in the claim's order,
    repeats dropped, as :func:`gpuslurm.state.job.resolve_devices` finds them on the node. A
    device the job was not given is an InputError naming ``claim.source``: a task's environment
    never names a device into the job."""
    found: list[TaskDevice] = []
    if claim.uuids:
        for item in claim.uuids:
            wanted = item.lower()
            dev = next((d for d in info.devices
                        if wanted == d.uuid.lower() or wanted in (a.lower() for a in d.aliases)), None)
            if dev is None:
                raise InputError(f"{item} is not one of job {info.job_id}'s devices", source=claim.source)
            found.append(dev)
    else:
        for i in claim.indices:
            dev = next((d for d in info.devices if d.gres_index == i), None)
            if dev is None:
                raise InputError(f"GPU index {i} is not one of job {info.job_id}'s devices",
                                 source=claim.source)
            found.append(dev)
    unique: dict[str, TaskDevice] = {}
    for dev in found:
        unique.setdefault(dev.uuid, dev)
    return tuple(unique.values())


def tasks_dir(run_dir: str) -> str:
    return os.path.join(run_dir, TASKS_DIR)


def write_task_info(run_dir: str, info: TaskInfo, gid: int | None = None) -> str:
    """Write ``<run_dir>/tasks/<jobid>.json`` atomically (root's, 0400, read for ``info.uid``
    through an ACL) through directories checked component by component (:mod:`gpuslurm.safedir`);
    returns the path. ``gid`` is unused: the job's group no longer reads the file (a file system
    without ACLs raises OSError, and the job has no task file)."""
    del gid
    base = tasks_dir(run_dir)
    name = f"{check_job_id(info.job_id)}.json"
    dfd = open_dir(base, create_mode=0o755)
    assert dfd is not None
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise UnsafePathError(f"refusing to use: owned by uid {st.st_uid}", source=base)
        payload = (json.dumps(info.to_dict(), sort_keys=True) + "\n").encode()
        replace_at(dfd, name, payload, FILE_MODE, source=os.path.join(base, name),
                   reader=info.uid if info.uid != 0 else None)  # root reads it anyway
    finally:
        os.close(dfd)
    return os.path.join(base, name)


def read_task_info(run_dir: str, job_id: str, uid: int | None) -> TaskInfo | None:
    """Job ``job_id``'s task file, checked as the module docstring says; None when there is none.

    ``uid``: the user the file must name (the task prolog's own); None (root, reading any job's)
    skips that check. A file or directory that fails a check is an UnsafePathError."""
    base = tasks_dir(run_dir)
    name = f"{check_job_id(job_id)}.json"
    path = os.path.join(base, name)
    dfd = open_dir(base)
    if dfd is None:
        return None
    try:
        _root_only(os.fstat(dfd), base, "directory")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UnsafePathError(f"refusing to read: {why_refused(dfd, name, exc)}", source=path) from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("refusing to read: not a regular file", source=path)
        _root_only(st, path, "file")
        if st.st_nlink != 1:
            raise UnsafePathError(f"refusing to read: {st.st_nlink} links to the file", source=path)
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise InputError(f"larger than {MAX_BYTES} bytes: not a file gpuslurm wrote", source=path)
    try:
        info = TaskInfo.from_dict(json.loads(data), path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", source=path) from None
    if info.job_id != job_id:
        raise UnsafePathError(f"names job {info.job_id}, not job {job_id}", source=path)
    if uid is not None and info.uid != uid:
        raise UnsafePathError(f"is job {job_id} of uid {info.uid}, not of uid {uid}", source=path)
    return info


def remove_task_info(run_dir: str, job_id: str) -> bool:
    """Remove job ``job_id``'s task file; False when there was none."""
    name = f"{check_job_id(job_id)}.json"
    dfd = open_dir(tasks_dir(run_dir))
    if dfd is None:
        return False
    try:
        os.unlink(name, dir_fd=dfd)  # never follows: a planted symlink just goes away
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def _root_only(st: os.stat_result, source: str, what: str) -> None:
    """Refuse what root does not own or what others may write: the job's user could swap it."""
    if st.st_uid != 0:
        raise UnsafePathError(f"refusing to use: {what} owned by uid {st.st_uid}, not root", source=source)
    if st.st_mode & 0o022:
        raise UnsafePathError(f"refusing to use: {what} writable by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o})", source=source)


def _get(data: dict[str, Any], key: str, kind: type, source: str, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(f"{key!r} missing or of the wrong type", source=source)
    return value

