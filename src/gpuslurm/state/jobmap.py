"""The job→GPU map: ``<jobs dir>/<jobid>.json``, written by the prolog, removed by the epilog.

The prolog runs as root, so every file operation here is made against a directory file
descriptor that was reached one component at a time without following a symlink, and whose
owner and mode were checked (``gpuslurm.safedir``). Files are created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` under a temporary name and renamed into place, so a reader sees
either the old map or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping

from gpuslurm.errors import InputError
from gpuslurm.jobid import check_job_id as check_job_id  # where callers import it from
from gpuslurm.jobid import job_sort_key, valid_job_id, valid_sluid
from gpuslurm.safedir import UnsafePathError as UnsafePathError  # where callers import it from
from gpuslurm.safedir import open_dir, read_private_at, write_private_file
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.state.job import JobDevice

DEFAULT_JOBS_DIR = "/run/gpuslurm/jobs"
FORMAT_VERSION = 1
MAX_MAP_BYTES = 1 << 20  # a map is a few hundred bytes; refuse to slurp anything huge


class MappedDevice(NamedTuple):
    """One device of a job as the map records it."""

    uuid: str  # GPU-… or MIG-…
    minor: int  # /dev/nvidia<minor> of the physical GPU
    gres_index: int | None = None
    parent_uuid: str | None = None  # the physical GPU of a MIG device
    device_files: tuple[str, ...] = ()  # empty when unknown (MIG without capability minors)


class JobMap(NamedTuple):
    """Which devices one job holds on this node, and whose job it is."""

    job_id: str
    user: str
    uid: int
    devices: tuple[MappedDevice, ...]
    start: float  # seconds since the epoch, when the prolog wrote the map
    account: str | None = None  # SLURM_JOB_ACCOUNT; maps written before it was recorded have none
    sluid: str | None = None  # SLURM_JOB_SLUID (Slurm 25.11+): 26.05 names the job's cgroup by it

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def minors(self) -> tuple[int, ...]:
        return tuple(d.minor for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "start": self.start,
            "gpus": [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                      "parent_uuid": d.parent_uuid, "device_files": list(d.device_files)}
                     for d in self.devices],
            **({"account": self.account} if self.account else {}),
            **({"sluid": self.sluid} if self.sluid else {}),
        }

    @classmethod
    def from_dict(cls, data: object, source: str) -> JobMap:
        """Validate a decoded map; unknown keys are ignored so newer writers stay readable."""
        if not isinstance(data, dict):
            raise InputError("a job map must be a JSON object", source=source)
        gpus = _field(data, "gpus", list, source)
        devices = []
        for i, item in enumerate(gpus):
            if not isinstance(item, dict):
                raise InputError(f"gpus[{i}] must be an object", source=source)
            files = _field(item, "device_files", list, source, optional=True) or []
            if not all(isinstance(f, str) for f in files):
                raise InputError(f"gpus[{i}].device_files must be strings", source=source)
            devices.append(MappedDevice(
                uuid=_field(item, "uuid", str, source),
                minor=_field(item, "minor", int, source),
                gres_index=_field(item, "gres_index", int, source, optional=True),
                parent_uuid=_field(item, "parent_uuid", str, source, optional=True),
                device_files=tuple(files),
            ))
        start = _field(data, "start", (int, float), source)
        sluid = _field(data, "sluid", str, source, optional=True) or None
        if sluid is not None and not valid_sluid(sluid):
            raise InputError(f"sluid is not a SLUID: {sluid[:40]!r}", source=source)
        return cls(job_id=check_job_id(_field(data, "job_id", str, source)),
                   user=_field(data, "user", str, source), uid=_field(data, "uid", int, source),
                   devices=tuple(devices), start=float(start),
                   account=_field(data, "account", str, source, optional=True) or None, sluid=sluid)


def job_map(job_id: str, user: str, uid: int, devices: Iterable[JobDevice],
            start: float | None = None, account: str | None = None, sluid: str | None = None) -> JobMap:
    """Build the map for a job from the devices ``resolve_job_gpus`` found."""
    mapped = []
    for dev in devices:
        try:
            files = dev.device_files
        except ValueError:  # MIG device whose capability minors the node did not report
            files = ()
        mapped.append(MappedDevice(uuid=dev.uuid, minor=dev.minor, gres_index=dev.gres_index,
                                   parent_uuid=dev.gpu.uuid if dev.mig is not None else None,
                                   device_files=files))
    return JobMap(check_job_id(job_id), user, uid, tuple(mapped),
                  time.time() if start is None else start, account or None, sluid)


def map_path(job_id: str, base: str = DEFAULT_JOBS_DIR) -> str:
    return os.path.join(base, f"{check_job_id(job_id)}.json")


def write_map(jmap: JobMap, base: str = DEFAULT_JOBS_DIR) -> str:
    """Write ``jmap`` atomically as ``<base>/<jobid>.json`` (mode 0600); returns the path."""
    final = f"{check_job_id(jmap.job_id)}.json"
    payload = (json.dumps(jmap.to_dict(), sort_keys=True) + "\n").encode()
    return write_private_file(base, final, payload)


def read_map(job_id: str, base: str = DEFAULT_JOBS_DIR) -> JobMap | None:
    """The map of ``job_id``, or None when there is none."""
    name = f"{check_job_id(job_id)}.json"
    dfd = _open_dir(base, create=False)
    if dfd is None:
        return None
    try:
        return _read(dfd, name, base)
    finally:
        os.close(dfd)


def remove_map(job_id: str, base: str = DEFAULT_JOBS_DIR) -> bool:
    """Remove the map of ``job_id``; False if there was none."""
    name = f"{check_job_id(job_id)}.json"
    dfd = _open_dir(base, create=False)
    if dfd is None:
        return False
    try:
        os.unlink(name, dir_fd=dfd)  # unlink never follows: a planted symlink just goes away
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def lock_maps(base: str = DEFAULT_JOBS_DIR) -> int:
    """Hold an exclusive lock on ``base`` (made if missing) until the returned descriptor is
    closed: a hook that chooses GPUs by what the maps leave free (PBS's execjob_begin) holds it
    from reading the maps to writing its own, so two jobs starting at once never pick one GPU."""
    import fcntl

    dfd = _open_dir(base, create=True)
    assert dfd is not None
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def list_job_ids(base: str = DEFAULT_JOBS_DIR) -> tuple[str, ...]:
    """Job ids with a map, in numeric order; other names in the directory are ignored."""
    dfd = _open_dir(base, create=False)
    if dfd is None:
        return ()
    try:
        return _job_ids(dfd)
    finally:
        os.close(dfd)


def list_maps(base: str = DEFAULT_JOBS_DIR) -> tuple[JobMap, ...]:
    """Every map in ``base``; a corrupt one raises InputError naming its file."""
    dfd = _open_dir(base, create=False)
    if dfd is None:
        return ()
    try:
        maps = []
        for job_id in _job_ids(dfd):
            m = _read(dfd, f"{job_id}.json", base)
            if m is not None:  # removed between listing and reading
                maps.append(m)
        return tuple(maps)
    finally:
        os.close(dfd)


def _job_ids(dfd: int) -> tuple[str, ...]:
    ids = []
    for name in os.listdir(dfd):
        stem, dot, ext = name.rpartition(".")
        if dot and ext == "json" and valid_job_id(stem):
            ids.append(stem)
    return tuple(sorted(ids, key=job_sort_key))


def _read(dfd: int, name: str, base: str) -> JobMap | None:
    path = os.path.join(base, name)
    data = read_private_at(dfd, name, base, MAX_MAP_BYTES)
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", source=path) from None
    jmap = JobMap.from_dict(doc, path)
    if f"{jmap.job_id}.json" != name:
        raise InputError(f"names job {jmap.job_id}, not the job its file name says", source=path)
    return jmap


def _open_dir(base: str, *, create: bool) -> int | None:
    """A descriptor for ``base``, reached and checked as :func:`gpuslurm.safedir.open_dir` does.

    Missing ancestors are made 0755 (other hooks put per-job directories the user must reach
    beside ``base``); ``base`` itself must be ours and private (made or narrowed to 0700). None
    when a component is missing and ``create`` is false.
    """
    return open_dir(base, create_mode=0o755 if create else None, private=True)


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str,
           optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(f"{key!r} missing or of the wrong type", source=source)
    return value


