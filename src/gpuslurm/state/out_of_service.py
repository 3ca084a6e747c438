"""GPUs taken out of service on this node: ``<state_dir>/out-of-service.json``.

One record per GPU, keyed by UUID (an index or minor can change when a GPU falls off the bus),
with the reason, who took it out (``admin``, ``monitor``, ``prolog``, ``health``) and when. It
lives under ``/var/lib/gpuslurm`` (not the tmpfs ``/run``): a GPU taken out stays out across a
reboot and restarts of slurmd and slurmctld until ``gpuslurm gpu online`` brings it back.

The prolog, ``pick``, the monitor and PBS's exechost_startup read it; the file is 0644 so that
``pick`` run by a user can skip the GPUs it names. Writers (the CLI, the monitor) run as root,
hold ``out-of-service.lock`` for their read-modify-write, and replace the file atomically.
A record that does not parse is bad input (exit 2) and is never overwritten: an admin looks.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence

from gpuslurm.errors import InputError
from gpuslurm.safedir import open_dir, read_private_at, replace_at
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any

    from gpuslurm.hw.model.node import Gpu

GPU_OUT_REASON = "gpuslurm: GPU out"  # how a node drained for the graceful GPU-out path is told apart
RECORD_FILE = "out-of-service.json"
# The job that holds a GPU out of service in Slurm (slurm.gpu_out): root's, with this Comment; the
# prolog lets it through without a health gate (only root's: a user cannot pass the gate this way).
HOLDER_COMMENT = "gpuslurm:gpu-out-holder"
LOCK_FILE = "out-of-service.lock"
FORMAT_VERSION = 1
MAX_RECORD_BYTES = 1 << 20
MAX_REASON = 200
SOURCES = ("admin", "monitor", "prolog", "health")


def _is_gpu_uuid(text: str) -> bool:
    """``GPU-`` and 1 to 80 ASCII letters, digits or dashes (no ``re``: pick reads the record)."""
    body = text[4:]
    return (text.startswith("GPU-") and 1 <= len(body) <= 80
            and all(c.isascii() and (c.isalnum() or c == "-") for c in body))


def _index_or_minor(text: str) -> tuple[str, int] | None:
    """``index:N`` / ``minor:N`` (N of 1 to 6 ASCII digits) → (kind, N); else None."""
    kind, colon, number = text.partition(":")
    if (colon and kind in ("index", "minor") and 1 <= len(number) <= 6 and number.isascii()
            and number.isdigit()):
        return kind, int(number)
    return None


class OutOfService(NamedTuple):
    """One GPU out of service."""

    uuid: str
    reason: str
    since: float  # seconds since the epoch
    by: str  # one of SOURCES
    index: int | None = None  # type: ignore[assignment]  # as taken out: for people, never a key
    minor: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "reason": self.reason, "since": self.since, "by": self.by,
                "index": self.index, "minor": self.minor}


def clean_reason(text: str) -> str:
    """A reason as stored and shown: printable, one line, bounded."""
    flat = "".join(c if c.isprintable() else " " for c in text).strip()
    return flat[:MAX_REASON]


def parse_record(data: bytes, source: str) -> dict[str, OutOfService]:
    """The records in the file's bytes, by UUID; InputError naming ``source`` when malformed."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InputError("not valid JSON (fix or remove it; no GPU state was changed)", source) from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION \
            or not isinstance(doc.get("gpus"), list):
        raise InputError(f"must be an object with version {FORMAT_VERSION} and a list of gpus", source)
    out: dict[str, OutOfService] = {}
    for item in doc["gpus"]:
        rec = _entry(item, source)
        out[rec.uuid] = rec
    return out


def _entry(item: object, source: str) -> OutOfService:
    if not isinstance(item, dict):
        raise InputError("each GPU entry must be an object", source)
    uuid, reason, since, by = item.get("uuid"), item.get("reason"), item.get("since"), item.get("by")
    if not isinstance(uuid, str) or not _is_gpu_uuid(uuid):
        raise InputError("an entry's uuid is not a GPU UUID", source)
    if not isinstance(reason, str) or len(reason) > MAX_REASON or reason != clean_reason(reason):
        raise InputError(f"{uuid}: reason must be one printable line of at most {MAX_REASON} characters",
                         source)
    if not isinstance(since, (int, float)) or isinstance(since, bool) or not 0 <= since < 253402300800:
        raise InputError(f"{uuid}: since must be a time in seconds", source)
    if by not in SOURCES:
        raise InputError(f"{uuid}: by must be one of {', '.join(SOURCES)}", source)
    nums = []
    for key in ("index", "minor"):
        value = item.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value < 1_000_000):
            raise InputError(f"{uuid}: {key} must be a whole number", source)
        nums.append(value)
    return OutOfService(uuid, reason, float(since), by, nums[0], nums[1])


def format_record(records: dict[str, OutOfService]) -> bytes:
    doc = {"version": FORMAT_VERSION, "gpus": [r.to_dict() for _, r in sorted(records.items())]}
    return (json.dumps(doc, indent=1) + "\n").encode()


class OutOfServiceStore:
    """The record file in ``state_dir`` (reached safely: root-owned directories, no symlinks)."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, RECORD_FILE)

    def read(self) -> dict[str, OutOfService]:
        """Every GPU out of service; empty when there is no record (or no state directory)."""
        dfd = open_dir(self.state_dir)
        if dfd is None:
            return {}
        try:
            return self._read_at(dfd)
        finally:
            os.close(dfd)

    def _read_at(self, dfd: int) -> dict[str, OutOfService]:
        try:
            data = read_private_at(dfd, RECORD_FILE, self.state_dir, MAX_RECORD_BYTES)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", self.path) from None
        return {} if data is None else parse_record(data, self.path)

    def update(self) -> AbstractContextManager[dict[str, OutOfService]]:
        """Read under the lock, let the caller change the dict, write it back if it changed."""
        from contextlib import contextmanager  # here: every hook imports this module, few update it

        return contextmanager(self._update)()

    def _update(self) -> Iterator[dict[str, OutOfService]]:
        dfd = open_dir(self.state_dir, create_mode=0o755)
        assert dfd is not None
        try:
            lock = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                           dir_fd=dfd)
        except OSError as exc:
            os.close(dfd)
            where = os.path.join(self.state_dir, LOCK_FILE)
            raise InputError(f"cannot open the lock: {exc.strerror}", where) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = self._read_at(dfd)
            before = dict(records)
            yield records
            if records != before:
                try:
                    replace_at(dfd, RECORD_FILE, format_record(records), 0o644, source=self.path)
                except OSError as exc:
                    raise InputError(f"cannot write: {exc.strerror}", self.path) from None
        finally:
            os.close(lock)
            os.close(dfd)


def parse_gpu_spec(spec: str) -> tuple[str, str | int]:
    """``GPU-…`` → ("uuid", text); ``index:N`` / ``minor:N`` → (kind, N); else InputError.

    A bare number is refused: where minors differ from indices it names two different GPUs.
    """
    text = spec.strip()
    if _is_gpu_uuid(text):
        return "uuid", text
    if found := _index_or_minor(text):
        return found
    shown = text if text.isprintable() and len(text) < 80 else repr(text[:80])
    if text.isascii() and text.isdigit():
        raise InputError(f"{shown} is ambiguous: say index:{text} (NVML order) or minor:{text} "
                         f"(/dev/nvidia{text})", "GPU")
    raise InputError(f"{shown}: not a GPU (give a UUID, index:N or minor:N)", "GPU")


def resolve_gpu(spec: str, gpus: Sequence[Gpu]) -> Gpu:
    """The GPU ``spec`` names among ``gpus``; InputError when none does."""
    kind, value = parse_gpu_spec(spec)
    for gpu in gpus:
        if (kind == "uuid" and isinstance(value, str) and gpu.uuid.lower() == value.lower()) or \
                (kind == "index" and gpu.index == value) or (kind == "minor" and gpu.minor == value):
            return gpu
    raise InputError(f"no GPU with {kind} {value} on this node", "GPU")


def take_out(store: OutOfServiceStore, gpus: Sequence[Gpu], gpu: Gpu, reason: str, by: str, *,
             now: float, force: bool = False) -> bool:
    """Record ``gpu`` out of service; False when it already was (its first reason is kept).

    Taking out the last GPU in service is refused (InputError) unless ``force``: the node then
    serves no GPU job at all, which an admin decides, not a passing fault.
    """
    with store.update() as records:
        if gpu.uuid in records:
            return False
        left = [g for g in gpus if g.uuid not in records and g.uuid != gpu.uuid]
        if not left and not force:
            raise InputError(f"GPU index {gpu.index} ({gpu.uuid}) is the last GPU in service on this "
                             "node; --force takes it out and drains the node", "GPU")
        records[gpu.uuid] = OutOfService(gpu.uuid, clean_reason(reason) or "no reason given", now, by,
                                         gpu.index, gpu.minor)
    return True


def bring_back(store: OutOfServiceStore, gpu: Gpu) -> OutOfService | None:
    """Remove ``gpu`` from the record; the record it had, or None when it was in service."""
    with store.update() as records:
        return records.pop(gpu.uuid, None)


def gpu_out_reason(total: int, out: Mapping[str, OutOfService]) -> str:
    """The drain reason of the graceful GPU-out path (``total``: the node's GPUs, ``out`` those of
    them out of service): ``gpuslurm: GPU out: index 3 (/dev/nvidia3, GPU-…): <reason>; resumes
    with 7 GPUs when its jobs end``."""
    left = total - len(out)
    parts = [f"index {r.index} (/dev/nvidia{r.minor}, {u}): {r.reason}" for u, r in sorted(out.items())]
    tail = f"resumes with {left} GPUs when its jobs end" if left > 0 else "no GPU left in service"
    text = f"{GPU_OUT_REASON}: {'; '.join(parts) or 'GPUs back in service'}; {tail}"
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:1000]


def read_shared(state_dir: str) -> dict[str, OutOfService]:
    """The record as any user may read it (``pick`` run inside a job): the file must be a regular
    file of root's (or ours) that nobody else can write; empty when it is missing."""
    import stat

    from gpuslurm.safedir import read_regular

    path = os.path.join(state_dir, RECORD_FILE)
    try:
        st = os.stat(path)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise InputError(f"refusing to use: owned by uid {st.st_uid}, "
                             f"mode {stat.S_IMODE(st.st_mode):04o}", path)
        data = read_regular(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    return parse_record(data, path)


def holder_name(node_name: str) -> str:
    """The job name of ``node_name``'s holder jobs."""
    return f"gpuslurm-gpu-out-{node_name}"


if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Protocol, TypeVar

    class _Decision(Protocol):
        def out_records(self, by: str, now: float) -> Mapping[str, OutOfService]: ...

    _D = TypeVar("_D", bound=_Decision)


def take_out_decided(store: OutOfServiceStore, decide: Callable[[frozenset[str]], _D], by: str, *,
                     now: float, out: Iterable[str] | None = None) -> _D:
    """Record what ``decide`` (given the UUIDs out of service) takes out: its ``out_records``.

    ``out``: the record as the caller read it; when ``decide`` takes nothing out on it, that
    decision is returned without taking the lock. Else it decides again under the record's lock,
    on the record as it is then: two writers at once (the prolog and the monitor) never both take
    out GPUs that leave the node none in service. A GPU already out keeps its first record.
    """
    if out is not None:
        first = decide(frozenset(out))
        if not first.out_records(by, now):
            return first
    with store.update() as records:
        decision = decide(frozenset(records))
        for uuid, rec in decision.out_records(by, now).items():
            records.setdefault(uuid, rec)
    return decision
