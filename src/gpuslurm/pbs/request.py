"""What the PBS hook sends gpuslurm on stdin, read bounded and checked: a :class:`PbsRequest`.

``plugins/pbs/gpuslurm_hook.py`` runs inside PBS's own interpreter and cannot import gpuslurm; it
turns the event into one small JSON object (format 1)::

    {"format": 1, "event": "execjob_begin", "hostname": "pbshost",
     "job_id": "12.pbshost", "euser": "alice",
     "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=2)", "exec_host": "pbshost/0*4",
     "vnodes": ["pbshost[0]"], "pid": 4242, "pbs_cgroups": false, "mps": "True"}

``hostname`` is ``pbs.get_local_nodename()`` (the natural vnode); ``vnodes`` the names in the
event's ``vnode_list``; ``pid`` the task process (execjob_launch: the hook's parent; execjob_attach:
``pbs.event().pid``); ``pbs_cgroups`` whether PBS's own cgroups hook is enabled on this host;
``mps`` the job's ``Resource_List.gpuslurm_mps`` (:data:`MPS_RESOURCE`, a boolean PBS checks at
qsub) as the hook's ``str()`` of it: ``True``/``False`` (also ``true``, ``1``, ``yes``, ... for a
resource a site made of another type); anything else is an InputError naming it.
Everything but ``format``, ``event`` and ``hostname`` is optional; unknown keys are ignored, so an
older gpuslurm reads a newer hook's request. Anything malformed is an InputError (exit 2) naming
the field: more than MAX_REQUEST_BYTES, bytes that are not UTF-8, JSON nested too deep, an id
a file name could be built from (``..``, ``/``), a GPU count that is not a small number.

Which GPUs PBS gave the job on this host (:func:`local_shares`): the job's ``exec_vnode`` is one
parenthesised chunk per ``exec_host`` entry, each chunk one or more ``vnode:res=value`` parts
joined by ``+`` (PBS splits a chunk across vnodes when no one vnode holds all of it). The chunks
whose ``exec_host`` entry is this host are this host's; their ``ngpus`` are summed per vnode.
"""

from __future__ import annotations

import json
import re

from gpuslurm.errors import InputError
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import BinaryIO

FORMAT = 1
MAX_REQUEST_BYTES = 1 << 20  # the job's whole exec_vnode fits many times over
MAX_TEXT = 1 << 16  # one field (exec_vnode of a big job) at most
MAX_VNODES = 4096
MAX_NGPUS = 1 << 12  # gpuslurm.ranges.MAX_GPUS
JOB_EVENTS = ("execjob_begin", "execjob_launch", "execjob_attach", "execjob_end")
EVENTS = ("exechost_startup", *JOB_EVENTS)
SOURCE = "PBS hook request"
MPS_RESOURCE = "gpuslurm_mps"  # the job-wide boolean resource a job asks for MPS with
_TRUE = ("true", "t", "yes", "y", "on", "1")
_FALSE = ("false", "f", "no", "n", "off", "0")

# PBS vnode names: a host name, optionally followed by bracketed words (host[0], host[0][1]).
_VNODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}(?:\[[A-Za-z0-9_.-]{1,32}\]){0,4}\Z")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?\Z")  # useradd's NAME_REGEX, and a bit


class VnodeShare(NamedTuple):
    """The GPUs (whole, and MIG instances) PBS gave a job on one vnode of this host."""

    vnode: str
    ngpus: int
    nmigs: int = 0


class PbsRequest(NamedTuple):
    """The hook's request, checked; ``None`` where the hook sent nothing."""

    event: str
    hostname: str
    job_id: str | None = None
    euser: str | None = None
    exec_vnode: str | None = None
    exec_host: str | None = None
    vnodes: tuple[str, ...] = ()
    pid: int | None = None
    pbs_cgroups: bool = False
    mps: bool = False  # the job asked for its own MPS daemon (Resource_List.gpuslurm_mps)

    def require_job(self) -> tuple[str, str]:
        """The job id and user a job event needs; InputError naming the missing field."""
        for name, value in (("job_id", self.job_id), ("euser", self.euser)):
            if value is None:
                raise InputError(f"{name} is missing for {self.event}", source=SOURCE)
        assert self.job_id is not None and self.euser is not None
        return self.job_id, self.euser


def read_request(stream: BinaryIO, event: str) -> PbsRequest:
    """Read at most MAX_REQUEST_BYTES from ``stream`` and check them (:func:`parse_request`)."""
    data = stream.read(MAX_REQUEST_BYTES + 1)
    if len(data) > MAX_REQUEST_BYTES:
        raise InputError(f"more than {MAX_REQUEST_BYTES} bytes on stdin", source=SOURCE)
    return parse_request(data, event)


def parse_request(data: bytes, event: str) -> PbsRequest:
    """The request in ``data`` for ``event`` (the command line's word, which it must repeat)."""
    if event not in EVENTS:
        raise InputError(f"unknown event {_shown(event)} (one of {', '.join(EVENTS)})", source=SOURCE)
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError("not UTF-8", source=SOURCE) from None
    except RecursionError:
        raise InputError("JSON nested too deep", source=SOURCE) from None
    except ValueError as exc:
        raise InputError(f"not valid JSON: {_shown(str(exc))}", source=SOURCE) from None
    if not isinstance(doc, dict):
        raise InputError("must be a JSON object", source=SOURCE)
    if doc.get("format") != FORMAT:
        raise InputError(f"format {_shown(doc.get('format'))}: this gpuslurm reads format {FORMAT} "
                         "(re-run `gpuslurm install --pbs` to import the matching hook)", source=SOURCE)
    if doc.get("event") != event:
        raise InputError(f"event {_shown(doc.get('event'))} is not the {event} the hook named",
                         source=SOURCE)
    hostname = _text(doc, "hostname", required=True)
    assert hostname is not None
    if not _VNODE.match(hostname):
        raise InputError(f"hostname: not a PBS node name: {_shown(hostname)}", source=SOURCE)
    job_id = _text(doc, "job_id")
    if job_id is not None:
        from gpuslurm.jobid import valid_job_id

        if "." not in job_id or not valid_job_id(job_id):
            raise InputError(f"job_id: not a PBS job id: {_shown(job_id)}", source=SOURCE)
    euser = _text(doc, "euser")
    if euser is not None and not _USER.match(euser):
        raise InputError(f"euser: not a user name: {_shown(euser)}", source=SOURCE)
    vnodes = doc.get("vnodes", [])
    if not isinstance(vnodes, list) or len(vnodes) > MAX_VNODES:
        raise InputError(f"vnodes: must be a list of at most {MAX_VNODES} names", source=SOURCE)
    for name in vnodes:
        if not isinstance(name, str) or not _VNODE.match(name):
            raise InputError(f"vnodes: not a PBS vnode name: {_shown(name)}", source=SOURCE)
    pid = doc.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or not 1 < pid < 1 << 22):
        raise InputError(f"pid: not a process id: {_shown(pid)}", source=SOURCE)
    cgroups = doc.get("pbs_cgroups", False)
    if not isinstance(cgroups, bool):
        raise InputError("pbs_cgroups: must be true or false", source=SOURCE)
    req = PbsRequest(event, hostname, job_id, euser, _text(doc, "exec_vnode"), _text(doc, "exec_host"),
                     tuple(vnodes), pid, cgroups, _mps(doc))
    if event in JOB_EVENTS:
        req.require_job()
    if req.exec_vnode is not None:
        local_shares(req)  # a malformed exec_vnode is refused here, before anything is done
    return req


def local_shares(req: PbsRequest) -> tuple[VnodeShare, ...]:
    """The job's GPUs (``ngpus``) and MIG instances (``nmigs``) on this host per vnode, in
    exec_vnode order (vnodes with neither left out).

    A chunk whose exec_host entry is another host is not this host's; without an ``exec_host``
    (or with one of another length) every vnode is taken as this host's.
    """
    if req.exec_vnode is None:
        return ()
    chunks = parse_exec_vnode(req.exec_vnode)
    hosts = parse_exec_host(req.exec_host) if req.exec_host is not None else []
    if len(hosts) != len(chunks):
        hosts = [req.hostname] * len(chunks)
    me = req.hostname.split(".")[0].lower()
    total: dict[str, list[int]] = {}
    for host, chunk in zip(hosts, chunks, strict=True):
        if host.split(".")[0].lower() != me:
            continue
        for vnode, resources in chunk:
            for i, key in enumerate(("ngpus", "nmigs")):
                n = resources.get(key)
                if n is None:
                    continue
                if not (n.isascii() and n.isdigit() and len(n) <= 5 and int(n) <= MAX_NGPUS):
                    raise InputError(f"exec_vnode: {key}={_shown(n)} on {vnode} is not a GPU count",
                                     source=SOURCE)
                counts = total.setdefault(vnode, [0, 0])
                counts[i] += int(n)
                if counts[i] > MAX_NGPUS:
                    raise InputError(f"exec_vnode: more than {MAX_NGPUS} {key} on {vnode}", source=SOURCE)
    return tuple(VnodeShare(v, g, m) for v, (g, m) in total.items() if g > 0 or m > 0)


def parse_exec_vnode(text: str) -> list[list[tuple[str, dict[str, str]]]]:
    """``(a:ncpus=2:ngpus=1+b:ngpus=1)+(c:ncpus=4)`` → one list of (vnode, resources) per chunk."""
    chunks = []
    for raw in _split_chunks(text, "exec_vnode"):
        if not (raw.startswith("(") and raw.endswith(")")):
            raise InputError(f"exec_vnode: chunk {_shown(raw)} is not in parentheses", source=SOURCE)
        parts = []
        for piece in raw[1:-1].split("+"):
            name, *assignments = piece.split(":")
            if not _VNODE.match(name):
                raise InputError(f"exec_vnode: not a vnode name: {_shown(name)}", source=SOURCE)
            resources: dict[str, str] = {}
            for item in assignments:
                key, eq, value = item.partition("=")
                if not eq or not key or not value:
                    raise InputError(f"exec_vnode: {_shown(item)} is not resource=value", source=SOURCE)
                resources[key] = value
            parts.append((name, resources))
        chunks.append(parts)
    return chunks


def parse_exec_host(text: str) -> list[str]:
    """``hostA/0*2+hostB/1`` → the host of each chunk, in order."""
    hosts = []
    for item in text.split("+"):
        host = item.partition("/")[0].partition(":")[0]
        if not _VNODE.match(host):
            raise InputError(f"exec_host: not a host name: {_shown(host)}", source=SOURCE)
        hosts.append(host)
    return hosts


def _split_chunks(text: str, field: str) -> list[str]:
    """``text`` split at ``+`` outside parentheses (a chunk never nests)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if depth not in (0, 1):
            raise InputError(f"{field}: unbalanced parentheses", source=SOURCE)
        if c == "+" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise InputError(f"{field}: unbalanced parentheses", source=SOURCE)
    parts.append(text[start:])
    return parts


def _mps(doc: dict[str, object]) -> bool:
    """``mps``: absent, a JSON boolean, or the text of a boolean (PBS's own spellings)."""
    value = doc.get("mps")
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and len(value) <= 8:
        word = value.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise InputError(f"mps: {MPS_RESOURCE} must be true or false, not {_shown(value)} (create it with "
                     f"`qmgr -c \"create resource {MPS_RESOURCE} type=boolean\"`, as "
                     "`gpuslurm install --pbs` does)", source=SOURCE)


def _text(doc: dict[str, object], key: str, *, required: bool = False) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise InputError(f"{key} is missing", source=SOURCE)
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isprintable():
        raise InputError(f"{key}: must be one printable line of at most {MAX_TEXT} characters",
                         source=SOURCE)
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
