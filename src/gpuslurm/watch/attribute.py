"""Which job (Slurm or PBS) a GPU process belongs to, and which GPUs each job was given.

A process's job comes from its cgroup, which only root can change: Slurm puts every step's
processes (and, with ``pam_slurm_adopt``, a user's ssh sessions) into
``/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>`` under cgroup v1, and into
``/<slice>/[<node>_]slurmstepd.scope/job_<id>/step_<step>/…`` under cgroup v2. The prolog's
job maps are the truth about which GPUs a job holds; ``squeue --json`` stands in, rate-limited,
for jobs seen in a cgroup without a map (a node where the prolog is not installed).

Slurm 26.05 names the v2 job directory by the job's SLUID (``…/slurmstepd.scope/s<SLUID>/…``).
The SLUID becomes a job id through the prolog's maps (which record ``SLURM_JOB_SLUID``), else
through ``sluid_job`` (the Slurm adapter's ``scontrol show -d job s<SLUID>``, asked once per
SLUID, again after ``squeue_interval_s`` while it has no answer); never through anything a
process of the job can set (its environment). A SLUID neither knows stays the sample's job id,
as the SLUID text, and is reported every cycle as a ``sluid-unknown`` problem: the process is in
a job's cgroup (only root makes those), so the rogue detector does not call it "in no job" and
the monitor never kills it on a guess (:func:`gpuslurm.policy.rogue.why_rogue`).

Which job a cgroup names is the scheduler's layout: ``job_of_cgroup`` is the adapter's
:meth:`~gpuslurm.state.scheduler.Scheduler.job_of_cgroup` (without one, only gpuslurm's own job
cgroups name a job). PBS puts a job's processes in a cgroup only with its cgroups hook
(``/pbs_jobs.service/jobid/<id>``). Without it, given ``sessions`` (the PBS adapter's session id → job
map from qstat's ``session_id``), a process outside every job cgroup belongs to the job whose shell
leads its session; failing that, to its owner's one job on this node when the owner (not root) has
exactly one (maps and qstat together). A process that left its job's session (``setsid``) of a user with
two jobs here stays unattributed.

:class:`Attributor` keeps, per PID and start time, what it read
about a process, so a steady process costs one read of its stat file per cycle; the cgroup and
owner are read again every ``refresh_s`` seconds.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from gpuslurm.errors import GpuslurmError
from gpuslurm.hw.live import procfs
from gpuslurm.jobid import valid_sluid
from gpuslurm.samples import Allocation, ProcessReading, ProcSample, ScanProblem
from gpuslurm.state.cgroup import CgroupJob, own_job_of_cgroup
from gpuslurm.state.jobmap import JobMap, list_job_ids, read_map


def map_allocation(jmap: object) -> Allocation:
    """An Allocation from a prolog job map (``gpuslurm.state.jobmap.JobMap``)."""
    assert isinstance(jmap, JobMap)
    return Allocation(jmap.job_id, jmap.user, jmap.uid, jmap.uuids, jmap.start, jmap.account, source="map")


class _Known(NamedTuple):
    start_ticks: int
    uid: int
    job_id: str | None
    started: float
    read_at: float
    sluid: str | None = None  # the SLUID its cgroup names, while no job id is known for it


class Attributor:
    """Turns the processes a GPU reports into ProcSamples, and lists the node's allocations.

    ``squeue`` is a function returning Allocations of running jobs on this node (the adapter's
    :meth:`~gpuslurm.state.scheduler.Scheduler.node_allocations`); None turns the fallback off.
    ``job_of_cgroup`` reads a ``/proc/PID/cgroup`` text in the scheduler's layout (the adapter's
    :meth:`~gpuslurm.state.scheduler.Scheduler.job_of_cgroup`); the default knows gpuslurm's own
    job cgroups only.
    """

    def __init__(self, *, jobs_dir: str, proc_root: str = procfs.PROC_ROOT,
                 squeue: Callable[[], Sequence[Allocation]] | None = None,
                 squeue_interval_s: float = 60.0, refresh_s: float = 60.0,
                 sessions: Callable[[], Mapping[int, str]] | None = None,
                 sluid_job: Callable[[str], str | None] | None = None,
                 job_of_cgroup: Callable[[str], CgroupJob | None] = own_job_of_cgroup) -> None:
        self.jobs_dir = jobs_dir
        self._job_of_cgroup = job_of_cgroup
        self._sluid_job = sluid_job
        self._map_sluids: dict[str, str] = {}  # SLUID -> job id, from the maps
        self._asked: dict[str, tuple[float, str | None]] = {}  # SLUID -> (when asked, job id)
        self._sessions = sessions
        self.proc_root = proc_root
        self._squeue = squeue
        self._squeue_interval = squeue_interval_s
        self._squeue_at: float | None = None
        self._squeue_allocs: dict[str, Allocation] = {}
        self._refresh = refresh_s
        self._known: dict[int, _Known] = {}
        self._users: dict[int, str] = {}
        self._maps_stamp: tuple[int, int] | None = None
        self._maps: tuple[Allocation, ...] = ()
        self._map_problems: tuple[ScanProblem, ...] = ()

    # -- allocations ------------------------------------------------------------------------------

    def _job_maps(self, now: float) -> tuple[tuple[Allocation, ...], tuple[ScanProblem, ...]]:
        """The prolog's maps, re-read only when the directory changed (maps are renamed in)."""
        try:
            st = os.stat(self.jobs_dir)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        if stamp is not None and stamp == self._maps_stamp:
            return self._maps, self._map_problems
        maps: list[Allocation] = []
        sluids: dict[str, str] = {}
        problems: list[ScanProblem] = []
        try:
            ids = list_job_ids(self.jobs_dir) if stamp is not None else ()
        except (GpuslurmError, OSError) as exc:
            ids = ()
            problems.append(ScanProblem(now, "jobmap-unreadable", self.jobs_dir, str(exc)))
        for job_id in ids:
            try:
                jmap = read_map(job_id, self.jobs_dir)
            except (GpuslurmError, OSError) as exc:  # one bad map must not hide the others
                problems.append(ScanProblem(now, "jobmap-unreadable", job_id, str(exc)))
                continue
            if jmap is not None:
                maps.append(map_allocation(jmap))
                if jmap.sluid is not None:
                    sluids[jmap.sluid] = jmap.job_id
        self._maps_stamp, self._maps, self._map_problems = stamp, tuple(maps), tuple(problems)
        self._map_sluids = sluids
        return self._maps, self._map_problems

    def _from_squeue(self, now: float, wanted: Iterable[str],
                     problems: list[ScanProblem]) -> dict[str, Allocation]:
        if self._squeue is None:
            return {}
        due = self._squeue_at is None or now - self._squeue_at >= self._squeue_interval
        if due and any(j not in self._squeue_allocs for j in wanted):
            self._squeue_at = now
            try:
                self._squeue_allocs = {a.job_id: a for a in self._squeue()}
            except (GpuslurmError, ValueError) as exc:  # keep what the last good answer said
                problems.append(ScanProblem(now, "squeue-error", "squeue", str(exc)))
        return self._squeue_allocs

    def _job_of_sluid(self, sluid: str, now: float, problems: list[ScanProblem]) -> str | None:
        """The job id of ``sluid``: the maps', else the scheduler's answer (asked again only after
        ``squeue_interval_s`` while it has none); None when neither knows."""
        if (job_id := self._map_sluids.get(sluid)) is not None:
            return job_id
        asked = self._asked.get(sluid)
        if asked is not None and (asked[1] is not None or now - asked[0] < self._squeue_interval):
            return asked[1]
        if self._sluid_job is None:
            return None
        try:
            job_id = self._sluid_job(sluid)
        except (GpuslurmError, ValueError) as exc:
            problems.append(ScanProblem(now, "sluid-error", sluid, str(exc)))
            job_id = None
        if len(self._asked) > 4096:  # SLUIDs of ended jobs: never let the cache grow unbounded
            self._asked.clear()
        self._asked[sluid] = (now, job_id)
        return job_id

    # -- processes --------------------------------------------------------------------------------

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def _lookup(self, pid: int, now: float, problems: list[ScanProblem]) -> tuple[str, _Known] | str:
        """``(comm, facts)``, or the kind of problem recorded in ``problems``."""
        ident = procfs.read_identity(pid, self.proc_root)
        if isinstance(ident, procfs.ProcessProblem):
            problems.append(ScanProblem(now, ident.kind, str(pid), ident.detail))
            return ident.kind
        known = self._known.get(pid)
        if known is not None and known.start_ticks == ident.start_ticks \
                and now - known.read_at < self._refresh:
            if known.sluid is not None:  # its job id may be known by now (a map appeared)
                known = self._named(known, now, problems)
                self._known[pid] = known
            return ident.comm, known
        facts = procfs.read_process(pid, self.proc_root, ident)
        if isinstance(facts, procfs.ProcessProblem):
            problems.append(ScanProblem(now, facts.kind, str(pid), facts.detail))
            self._known.pop(pid, None)
            return facts.kind
        job = self._job_of_cgroup(facts.cgroup)
        job_id = job.job_id if job else None
        if job_id is None and job is None and self._sessions is not None and facts.session > 0:
            job_id = self._sessions().get(facts.session)
        known = _Known(facts.start_ticks, facts.uid, job_id,
                       procfs.start_time(facts.start_ticks, self.proc_root), now,
                       job.sluid if job is not None else None)
        if known.sluid is not None:
            known = self._named(known, now, problems)
        self._known[pid] = known
        return facts.comm, known

    def _named(self, known: _Known, now: float, problems: list[ScanProblem]) -> _Known:
        """``known`` (in a SLUID cgroup) with its job id; the SLUID itself, and a ``sluid-unknown``
        problem, while no map or scheduler answer names the job."""
        assert known.sluid is not None
        job_id = self._job_of_sluid(known.sluid, now, problems)
        if job_id is None:
            problems.append(ScanProblem(now, "sluid-unknown", known.sluid,
                                        "a process in this SLUID's job cgroup, whose job id neither "
                                        "a job map nor the scheduler gives: not judged rogue"))
            return known._replace(job_id=known.sluid)
        return known._replace(job_id=job_id, sluid=None)

    def attribute(self, now: float, readings: Sequence[ProcessReading]) -> tuple[
            tuple[ProcSample, ...], tuple[Allocation, ...], tuple[ScanProblem, ...]]:
        """ProcSamples for ``readings``, the node's allocations, and what could not be read.

        A process that exited is left out (its reading is stale); one whose /proc entry cannot
        be read is kept with its owner and job unknown, so its GPU use is still seen.
        """
        problems: list[ScanProblem] = []
        maps, map_problems = self._job_maps(now)
        problems.extend(map_problems)
        if self._sessions is not None and readings:
            self._from_squeue(now, {""}, problems)  # sessions first: the lookups below use them
        looked: dict[int, tuple[str, _Known] | str] = {}
        samples: list[ProcSample] = []
        for r in readings:
            if r.name is not None:  # a replayed capture's process: its PID is another machine's
                samples.append(ProcSample(now, r.gpu_uuid, r.pid, r.mig_uuid, r.name, mem_mib=r.mem_mib,
                                          sm_util_pct=r.sm_util_pct))
                continue
            if r.pid in looked:
                found = looked[r.pid]
            else:
                found = looked[r.pid] = self._lookup(r.pid, now, problems)
            if isinstance(found, str):
                if found == "pid-gone":
                    continue
                samples.append(ProcSample(now, r.gpu_uuid, r.pid, r.mig_uuid, mem_mib=r.mem_mib,
                                          sm_util_pct=r.sm_util_pct))
                continue
            comm, k = found
            samples.append(ProcSample(now, r.gpu_uuid, r.pid, r.mig_uuid, comm, k.uid, self._user(k.uid),
                                      k.job_id, r.mem_mib, r.sm_util_pct, k.started))
        for pid in [p for p in self._known if p not in looked]:
            del self._known[pid]  # gone from every GPU: forget it so the cache cannot grow
        mapped = {a.job_id for a in maps}
        unmapped = {s.job_id for s in samples
                    if s.job_id is not None and s.job_id not in mapped and not valid_sluid(s.job_id)}
        if not os.path.isdir(self.jobs_dir):
            # no prolog on this node: squeue is the only source of allocations, idle ones included
            unmapped.add("")
        extra = self._from_squeue(now, unmapped, problems)
        # a map older than the account field: squeue's last answer may know the account
        maps = tuple(a._replace(account=extra[a.job_id].account) if a.account is None and a.job_id in extra
                     else a for a in maps)
        allocations = maps + tuple(a for j, a in sorted(extra.items()) if j not in mapped)
        if self._sessions is not None:
            samples = _by_owner(samples, allocations)
        return tuple(samples), allocations, tuple(problems)


def _by_owner(samples: list[ProcSample], allocations: Sequence[Allocation]) -> list[ProcSample]:
    """Samples in no job given to their owner's one job on this node, when the owner has one; root's
    processes (daemons, monitoring) are never guessed into a job."""
    jobs: dict[int, set[str]] = {}
    for a in allocations:
        jobs.setdefault(a.uid, set()).add(a.job_id)
    out = []
    for s in samples:
        if s.job_id is None and s.uid is not None and s.uid > 0 and len(jobs.get(s.uid, ())) == 1:
            s = s._replace(job_id=next(iter(jobs[s.uid])))
        out.append(s)
    return out
