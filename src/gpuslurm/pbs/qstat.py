"""``qstat -f -F json`` and ``pbsnodes -av -F json``: PBS's jobs and vnodes as typed values.

Pure parsing of the documents OpenPBS 23.06 prints (recorded in tests/pbs/data); nothing here runs
a command. Both are bounded (``MAX_BYTES`` of text, ``MAX_ENTRIES`` jobs or vnodes, nesting no deeper
than PBS's own two levels) and every mistake is one :class:`InputError` line naming the command.
Fields a job's owner chooses (its name, account, variables) are never needed to find the job's node,
user or GPUs; those come from what the server sets (``euser``, ``exec_host``, ``exec_vnode``,
``Resource_List.ngpus``, ``session_id``, ``stime``).

``exec_vnode`` is PBS's record of where each chunk went: ``(pbshost[0]:ncpus=4:ngpus=2)`` is one
chunk on one vnode; ``(n1[0]:ncpus=2:ngpus=1+n1[1]:ngpus=1)`` one chunk PBS split across two vnodes
of a host; ``+`` between parentheses separates chunks.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

from gpuslurm.errors import InputError, one_line
from gpuslurm.jobid import valid_job_id

MAX_BYTES = 64 << 20  # ~20,000 jobs of PBS's ~3 KB each
MAX_ENTRIES = 100_000
MAX_FIELD = 64 << 10  # exec_vnode of a huge job stays far below
MAX_COUNT = 1 << 20  # a resource count (ngpus, ncpus) above this is not a count
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep",
                                       "Oct", "Nov", "Dec"), start=1)}


class VnodeShare(NamedTuple):
    """One vnode's part of a chunk: ``pbshost[1]:ncpus=4:ngpus=2``."""

    vnode: str
    resources: tuple[tuple[str, str], ...]  # (name, value) in PBS's order

    @property
    def host(self) -> str:
        """The execution host of this vnode: ``pbshost[1]`` → ``pbshost``."""
        return self.vnode.split("[", 1)[0]

    def count(self, resource: str) -> int:
        """The integer amount of ``resource`` here (0 when absent)."""
        for name, value in self.resources:
            if name == resource:
                return _count(value, f"exec_vnode {resource}")
        return 0


class PbsJob(NamedTuple):
    job_id: str  # 123.server, 123[4].server
    user: str  # euser: the account the job runs as
    state: str  # job_state: Q, R, H, E, F, ...
    queue: str
    account: str | None
    exec_hosts: tuple[str, ...]  # host names from exec_host, in order, repeated per chunk
    chunks: tuple[tuple[VnodeShare, ...], ...]  # exec_vnode: one tuple of vnode shares per chunk
    ngpus: int  # Resource_List.ngpus: the job's GPUs in all (0 when it asked for none)
    start: float  # stime (seconds since the epoch), 0 when not started
    session_id: int | None  # the job shell's session on its first host (mother superior)
    name: str = ""  # Job_Name: the user's text (end-of-job messages show it, as data)

    def gpus_on(self, host: str) -> int:
        """How many GPUs the job holds on ``host`` (the sum of its vnode shares there)."""
        return sum(share.count("ngpus") for chunk in self.chunks for share in chunk if share.host == host)

    def vnodes_on(self, host: str) -> tuple[VnodeShare, ...]:
        """The job's vnode shares on ``host``, in exec_vnode order."""
        return tuple(share for chunk in self.chunks for share in chunk if share.host == host)

    def runs_on(self, host: str) -> bool:
        return host in self.exec_hosts or any(s.host == host for c in self.chunks for s in c)


class PbsNode(NamedTuple):
    """One vnode as ``pbsnodes -av -F json`` shows it."""

    name: str  # pbshost, pbshost[0]
    host: str  # resources_available.host (the natural vnode's name)
    states: tuple[str, ...]  # "free", "offline", "job-busy", ...
    comment: str
    ngpus: int  # resources_available.ngpus
    ngpus_assigned: int
    jobs: tuple[str, ...]  # job ids with a share here


def _fail(message: str, source: str) -> InputError:
    return InputError(one_line(message)[:300], source=source)


def _document(text: str, key: str, source: str) -> dict[str, Any]:
    if len(text) > MAX_BYTES:
        raise _fail(f"more than {MAX_BYTES} bytes of output", source)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _fail("not PBS's JSON: nested too deeply", source) from None
    except ValueError as exc:
        raise _fail(f"not valid JSON: {exc}", source) from None
    if not isinstance(doc, dict):
        raise _fail("not a JSON object", source)
    entries = doc.get(key, {})  # absent: no jobs (qstat prints no "Jobs" when there are none)
    if not isinstance(entries, dict):
        raise _fail(f"{key!r} is not an object", source)
    if len(entries) > MAX_ENTRIES:
        raise _fail(f"more than {MAX_ENTRIES} entries in {key!r}", source)
    return entries


def _str(item: dict[str, Any], key: str, where: str, source: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if value is None:
        raise _fail(f"{where}: no {key}", source)
    if not isinstance(value, str) or len(value) > MAX_FIELD:
        raise _fail(f"{where}: {key} is not a string of at most {MAX_FIELD} characters", source)
    return value


def _int(value: object, what: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**63 - 1:
        raise _fail(f"{what} is not a non-negative integer: {str(value)[:40]!r}", source)
    return value


def _count(value: str, what: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 7) or int(value) > MAX_COUNT:
        raise InputError(f"{what} is not a count: {value[:40]!r}", source="exec_vnode")
    return int(value)


def parse_exec_vnode(text: str) -> tuple[tuple[VnodeShare, ...], ...]:
    """``(a[0]:ncpus=4:ngpus=2)+(a[1]:ngpus=1+b:ngpus=1)`` → chunks of vnode shares; InputError."""
    if len(text) > MAX_FIELD:
        raise InputError(f"longer than {MAX_FIELD} characters", source="exec_vnode")
    chunks: list[tuple[VnodeShare, ...]] = []
    rest = text.strip()
    while rest:
        if not rest.startswith("("):
            raise InputError(f"a chunk must start with '(': {rest[:40]!r}", source="exec_vnode")
        end = rest.find(")")
        if end < 0:
            raise InputError(f"unclosed chunk: {rest[:40]!r}", source="exec_vnode")
        chunks.append(tuple(_share(part) for part in rest[1:end].split("+")))
        rest = rest[end + 1:]
        if rest.startswith("+"):
            rest = rest[1:]
            if not rest:
                raise InputError("a '+' with no chunk after it", source="exec_vnode")
        elif rest:
            raise InputError(f"text after a chunk: {rest[:40]!r}", source="exec_vnode")
    return tuple(chunks)


def _share(text: str) -> VnodeShare:
    name, *pairs = text.split(":")
    if not _vnode_name(name):
        raise InputError(f"not a vnode name: {name[:40]!r}", source="exec_vnode")
    resources = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key or not (key.isascii() and key.replace("_", "").isalnum()) or not value:
            raise InputError(f"not resource=value: {pair[:40]!r}", source="exec_vnode")
        resources.append((key, value))
    return VnodeShare(name, tuple(resources))


def _vnode_name(name: str) -> bool:
    host, bracket, index = name.partition("[")
    ok_host = (0 < len(host) <= 255 and host.isascii()
               and host.replace("-", "").replace(".", "").replace("_", "").isalnum())
    if not bracket:
        return ok_host
    return ok_host and index.endswith("]") and index[:-1].isascii() and index[:-1].isdigit() \
        and len(index) <= 11


def parse_exec_host(text: str) -> tuple[str, ...]:
    """``pbshost/0*4+other/1`` → ``("pbshost", "other")``; InputError when a part is no host."""
    if len(text) > MAX_FIELD:
        raise InputError(f"longer than {MAX_FIELD} characters", source="exec_host")
    hosts = []
    for part in text.strip().split("+"):
        host, slash, slot = part.partition("/")
        if not _vnode_name(host) or "[" in host or not slash or not slot:
            raise InputError(f"not host/slot: {part[:40]!r}", source="exec_host")
        hosts.append(host)
    return tuple(hosts)


def parse_pbs_time(text: str) -> float:
    """``Mon Nov 23 16:17:56 2026`` (PBS's ctime(3) form, the server's local time) → epoch seconds."""
    parts = text.split()
    if len(parts) != 5 or parts[1] not in _MONTHS:
        raise InputError(f"not a PBS time: {text[:40]!r}", source="qstat")
    clock = parts[3].split(":")
    numbers = [parts[2], *clock, parts[4]]
    if len(clock) != 3 or not all(n.isascii() and n.isdigit() and len(n) <= 4 for n in numbers):
        raise InputError(f"not a PBS time: {text[:40]!r}", source="qstat")
    day, hour, minute, second, year = (int(n) for n in numbers)
    if not (1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 61 and 1970 <= year <= 9998):
        raise InputError(f"not a PBS time: {text[:40]!r}", source="qstat")
    try:
        return time.mktime((year, _MONTHS[parts[1]], day, hour, minute, second, 0, 0, -1))
    except (OverflowError, ValueError):
        raise InputError(f"not a PBS time: {text[:40]!r}", source="qstat") from None


def parse_qstat_json(text: str, source: str = "qstat -f -F json") -> tuple[PbsJob, ...]:
    """The jobs of a ``qstat -f -F json`` document, in its order; InputError on any mistake."""
    jobs = _document(text, "Jobs", source)
    out = []
    for job_id, item in jobs.items():
        if not valid_job_id(job_id) or "." not in job_id:
            raise _fail(f"not a PBS job id: {job_id[:60]!r}", source)
        if not isinstance(item, dict):
            raise _fail(f"{job_id}: not an object", source)
        owner = _str(item, "Job_Owner", job_id, source, "")
        user = _str(item, "euser", job_id, source, owner.split("@", 1)[0])
        if not user or any(c.isspace() or not c.isprintable() for c in user) or len(user) > 256:
            raise _fail(f"{job_id}: no user name (euser or Job_Owner)", source)
        resources = item.get("Resource_List", {})
        if not isinstance(resources, dict):
            raise _fail(f"{job_id}: Resource_List is not an object", source)
        try:
            chunks = parse_exec_vnode(_str(item, "exec_vnode", job_id, source, ""))
            hosts = parse_exec_host(_str(item, "exec_host", job_id, source)) if "exec_host" in item else ()
            stime = _str(item, "stime", job_id, source, "")
            start = parse_pbs_time(stime) if stime else 0.0
            for chunk in chunks:
                for share in chunk:
                    share.count("ngpus")  # checked here, so gpus_on never raises later
        except InputError as exc:
            raise _fail(f"{job_id}: {exc}", source) from None
        ngpus = _int(resources.get("ngpus", 0), f"{job_id}: Resource_List.ngpus", source)
        session = item.get("session_id")
        account = item.get("Account_Name")
        out.append(PbsJob(
            job_id=job_id, user=user,
            state=_str(item, "job_state", job_id, source),
            queue=_str(item, "queue", job_id, source, ""),
            account=_account(account, item.get("project")),
            exec_hosts=hosts, chunks=chunks, ngpus=ngpus, start=start,
            session_id=_int(session, f"{job_id}: session_id", source) if session is not None else None,
            name=_str(item, "Job_Name", job_id, source, ""),
        ))
    return tuple(out)


def _account(account: object, project: object) -> str | None:
    """Account_Name, else a project other than PBS's default: what fair-share groups users by."""
    for value in (account, project):
        if isinstance(value, str) and value and value != "_pbs_project_default":
            return one_line(value)[:256]
    return None


def parse_pbsnodes_json(text: str, source: str = "pbsnodes -av -F json") -> tuple[PbsNode, ...]:
    """The vnodes of a ``pbsnodes -av -F json`` document; InputError on any mistake."""
    nodes = _document(text, "nodes", source)
    out = []
    for name, item in nodes.items():
        if not _vnode_name(name):
            raise _fail(f"not a vnode name: {name[:60]!r}", source)
        if not isinstance(item, dict):
            raise _fail(f"{name}: not an object", source)
        avail = item.get("resources_available", {})
        assigned = item.get("resources_assigned", {})
        jobs = item.get("jobs", [])
        if not isinstance(avail, dict) or not isinstance(assigned, dict) or not isinstance(jobs, list):
            raise _fail(f"{name}: resources or jobs of the wrong type", source)
        if not all(isinstance(j, str) and valid_job_id(j.split("/", 1)[0]) for j in jobs):
            raise _fail(f"{name}: a job that is not a PBS job id", source)
        out.append(PbsNode(
            name=name, host=_str(avail, "host", name, source, name.split("[", 1)[0]),
            states=tuple(_str(item, "state", name, source).split(",")),
            comment=_str(item, "comment", name, source, ""),
            ngpus=_int(avail.get("ngpus", 0), f"{name}: ngpus", source),
            ngpus_assigned=_int(assigned.get("ngpus", 0), f"{name}: assigned ngpus", source),
            jobs=tuple(dict.fromkeys(j.split("/", 1)[0] for j in jobs)),
        ))
    return tuple(out)
