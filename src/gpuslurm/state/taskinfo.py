"""What a job's tasks need of its devices, written once by the prolog for the task prolog to read.

The task prolog runs once per task as the job's user (``srun -n 64``: 64 times), so it must not
pay for NVML or a bundle parse each time, and it cannot read the root-only job map
(:mod:`gpuslurm.state.jobmap`). The prolog, which has resolved and gated the job's devices
anyway, writes ``<run_dir>/tasks/<jobid>.task``: each device's UUID, GRES index, NUMA node and
close CPUs, as lines of words (:meth:`TaskInfo.to_text`; not JSON: ``json`` brings ``re`` and
``enum`` with it, ~10 ms of each task prolog's CPU). The file is root's, mode 0400, and the job's
user reads it through a POSIX access ACL of their uid alone (:func:`gpuslurm.safedir.reader_acl`,
set before the rename), in a directory that is root's and 0755: the job's user can read it and
can neither change nor replace it, and no one else (another member of the job's group included)
can read which devices the job has. Where the file system has no ACLs there is no task file: the
job's tasks read the node instead.

The reader (as the job's user) trusts it only when the directory and the file are root's and
writable by nobody else (an ACL entry that grants write shows in the group bits, its mask), the
file is regular, has one link (not another job's file hard-linked
where the user can reach it) and names this job and this user. A missing file (a job started by a
prolog older than this file) is None: the caller falls back to reading the node.
"""

from __future__ import annotations

import os
import stat

from gpuslurm.errors import InputError
from gpuslurm.jobid import check_job_id
from gpuslurm.safedir import UnsafePathError, open_dir, replace_at, why_refused
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.state.job import GpuClaim, JobDevice

TASKS_DIR = "tasks"
SUFFIX = ".task"
OLD_SUFFIX = ".json"  # format 1, written by the prolog before format 2; removed by the epilog
FORMAT_VERSION = 2
HEADER = f"gpuslurm-tasks {FORMAT_VERSION}"
NONE = "-"  # a field with no value
MAX_INT_DIGITS = 10
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

    def to_text(self) -> str:
        """The file's text: a header, ``job ID``, ``uid UID``, then one ``device UUID GRES_INDEX
        NUMA_NODE CPUS ALIASES`` line per device (``-`` for none; aliases joined by ``,``).
        ValueError for a value that is not one word (it would change the lines' meaning)."""
        lines = [HEADER, f"job {check_job_id(self.job_id)}", f"uid {int(self.uid)}"]
        for d in self.devices:
            if any("," in a for a in d.aliases):
                raise ValueError(f"an alias of {d.uuid!r} holds a comma")
            fields = [d.uuid, _field(d.gres_index), _field(d.numa_node), d.cpus or NONE,
                      ",".join(d.aliases) or NONE]
            if not all(_word(f) for f in fields):
                raise ValueError(f"not one word each: {fields!r}")
            lines.append("device " + " ".join(fields))
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str, source: str) -> TaskInfo:
        """Parse :meth:`to_text`'s lines; anything else is an InputError naming ``source``."""
        lines = text.split("\n")
        if lines[:1] != [HEADER] or lines[-1:] != [""]:
            raise InputError(f"not a version {FORMAT_VERSION} task file", source=source)
        job_id: str | None = None
        uid: int | None = None
        devices = []
        for n, line in enumerate(lines[1:-1], 2):
            key, _, rest = line.partition(" ")
            words = rest.split(" ")
            if not all(_word(w) for w in words):
                raise InputError(f"line {n}: not single-spaced words", source=source)
            if key == "job" and job_id is None and len(words) == 1:
                job_id = check_job_id(words[0])
            elif key == "uid" and uid is None and len(words) == 1:
                uid = _int(words[0], source, n, negative=False)
            elif key == "device" and len(words) == 5:
                uuid, gres, numa, cpus, aliases = words
                devices.append(TaskDevice(uuid, _opt_int(gres, source, n), ()
                                          if aliases == NONE else tuple(aliases.split(",")),
                                          _opt_int(numa, source, n), "" if cpus == NONE else cpus))
            else:
                raise InputError(f"line {n}: unexpected {key[:20]!r} line", source=source)
        if job_id is None or uid is None:
            raise InputError("no job or no uid line", source=source)
        return cls(job_id, uid, tuple(devices))


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
    """Write ``<run_dir>/tasks/<jobid>.task`` atomically (root's, 0400, read for ``info.uid``
    through an ACL) through directories checked component by component (:mod:`gpuslurm.safedir`);
    returns the path. ``gid`` is unused: the job's group no longer reads the file (a file system
    without ACLs raises OSError, and the job has no task file)."""
    del gid
    base = tasks_dir(run_dir)
    name = f"{check_job_id(info.job_id)}{SUFFIX}"
    dfd = open_dir(base, create_mode=0o755)
    assert dfd is not None
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise UnsafePathError(f"refusing to use: owned by uid {st.st_uid}", source=base)
        payload = info.to_text().encode("ascii")
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
    name = f"{check_job_id(job_id)}{SUFFIX}"
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
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise InputError(f"not ASCII (byte {exc.start})", source=path) from None
    info = TaskInfo.from_text(text, path)
    if info.job_id != job_id:
        raise UnsafePathError(f"names job {info.job_id}, not job {job_id}", source=path)
    if uid is not None and info.uid != uid:
        raise UnsafePathError(f"is job {job_id} of uid {info.uid}, not of uid {uid}", source=path)
    return info


def remove_task_info(run_dir: str, job_id: str) -> bool:
    """Remove job ``job_id``'s task file (and a format 1 one, from a prolog before the upgrade);
    False when there was none."""
    dfd = open_dir(tasks_dir(run_dir))
    if dfd is None:
        return False
    removed = False
    try:
        for suffix in (SUFFIX, OLD_SUFFIX):
            try:
                os.unlink(f"{check_job_id(job_id)}{suffix}", dir_fd=dfd)  # never follows a symlink
                removed = True
            except FileNotFoundError:
                pass
    finally:
        os.close(dfd)
    return removed


def _root_only(st: os.stat_result, source: str, what: str) -> None:
    """Refuse what root does not own or what others may write: the job's user could swap it."""
    if st.st_uid != 0:
        raise UnsafePathError(f"refusing to use: {what} owned by uid {st.st_uid}, not root", source=source)
    if st.st_mode & 0o022:
        raise UnsafePathError(f"refusing to use: {what} writable by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o})", source=source)


def _word(text: str) -> bool:
    """One non-empty printable word without white space (a field of the file)."""
    return bool(text) and text.isprintable() and not any(c.isspace() for c in text)


def _field(value: int | None) -> str:
    return NONE if value is None else str(value)


def _int(text: str, source: str, line: int, negative: bool = True) -> int:
    digits = text[1:] if negative and text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_INT_DIGITS:
        raise InputError(f"line {line}: not a number: {text[:20]!r}", source=source)
    return int(text)


def _opt_int(text: str, source: str, line: int) -> int | None:
    return None if text == NONE else _int(text, source, line)
