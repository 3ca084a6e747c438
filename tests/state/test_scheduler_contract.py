"""The Scheduler contract: every implementation of :class:`gpuslurm.state.scheduler.Scheduler` (Slurm,
PBS's commands, the PBS hook's actions, the tests' recording one) answers every method with the
types and meanings the interface documents, on outputs recorded from the real clusters:
tests/slurm/scheduler/<release>/ (recorded by tests/cluster/test_record_scheduler_e2e.py, one folder
per Slurm release run: each release's outputs go through every method), tests/slurm/show_job/
(26.05's SLUIDs, for a release recorded without one) and tests/pbs/data/ (OpenPBS 23.06).

The commands are stand-ins that print those recordings and log their argv; nothing else is faked.
A third scheduler is one more entry in ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.recording_scheduler import RecordingScheduler

from gpuslurm.config import Config, PathsConfig
from gpuslurm.errors import GpuslurmError
from gpuslurm.hw.source import load_node
from gpuslurm.pbs.answer import HookAnswer, PbsHookActions
from gpuslurm.pbs.scheduler import PbsScheduler
from gpuslurm.samples import Allocation
from gpuslurm.slurm.adapter import SlurmScheduler
from gpuslurm.state.job import GpuClaim, HookJob, resolve_devices
from gpuslurm.state.jobmap import job_map, write_map
from gpuslurm.state.running import JobDetail
from gpuslurm.state.scheduler import Scheduler

TESTS = Path(__file__).resolve().parents[1]
SLURM_DATA = TESTS / "slurm" / "scheduler"
SHOW_JOB = TESTS / "slurm" / "show_job"
PBS_DATA = TESTS / "pbs" / "data"
NODE = load_node("dgx-h100")
# OpenPBS's cgroups hook's layout (pbs_cgroups.PY: <cgroup_prefix>.service/jobid/<id> in each v1
# controller); the test cluster runs PBS without that hook, so this one is from its source, not recorded
PBS_CGROUP = ("12:devices:/pbs_jobs.service/jobid/0.pbshost\n"
              "4:memory:/pbs_jobs.service/jobid/0.pbshost\n"
              "1:name=systemd:/system.slice/pbs.service\n0::/system.slice/pbs.service\n")
RELEASES = sorted(p.name for p in SLURM_DATA.iterdir() if (p / "squeue-running.json").is_file()) \
    if SLURM_DATA.is_dir() else []


@dataclass
class Case:
    """One implementation, set up on one recording, and what that recording says it must answer."""

    sched: Scheduler
    node_name: str
    job: HookJob  # one of its jobs on the node
    foreign_job_id: str  # an id that is not this scheduler's
    allocations: Mapping[str, int]  # job id → GPUs, as the recording lists them
    sessions: Mapping[int, str] | None  # after node_allocations
    details: tuple[str, ...] | None  # job ids of running_job_details, None: it gives none
    in_job_env: dict[str, str]  # an environment inside one of its jobs
    sluid: tuple[str, str | None] = ("s00000000000AB", None)  # a SLUID and the job it names
    # a /proc/PID/cgroup text of a process of ``job`` (recorded where the recording has one), and
    # what names the job in it: its id, or (Slurm 26.05) its SLUID
    cgroup: tuple[str, str] | None = None
    commands: Callable[[], list[list[str]]] = list  # the stand-ins' argv so far
    unsupported: frozenset[str] = frozenset()  # actions it documents as raising GpuslurmError
    extra: dict[str, Any] = field(default_factory=dict)


def stand_in(bindir: Path, name: str, log: Path, answers: Mapping[str, Path] | None = None,
             default: Path | None = None) -> str:
    """An executable ``name`` that logs its argv (one JSON list a line) and prints the recording
    whose key appears in its arguments (else ``default``, else nothing)."""
    script = bindir / name
    lines = ["#!/bin/sh", f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$@" >> {log}']
    lines += ['case " $* " in']
    for key, path in (answers or {}).items():
        lines.append(f'  *"{key}"*) cat {path}; exit 0;;')
    lines.append(f"  *) {'cat ' + str(default) if default else 'true'};;")
    lines.append("esac")
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return str(script)


def read_log(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def slurm_case(tmp: Path, release: str) -> Case:
    data = SLURM_DATA / release
    job_id, node_name = (data / "job").read_text().split()
    bindir, log = tmp / "bin", tmp / "commands.log"
    bindir.mkdir()
    # the release's own job's SLUID and scontrol's answer by it where it has SLUIDs (25.11+), else
    # 26.05's capture (an older scontrol asked for a SLUID answers as for an unknown job)
    if (data / "sluid").is_file():
        sluid, by_sluid, sluid_job = (data / "sluid").read_text().strip(), data / "show-job-by-sluid.txt", \
            job_id
    else:
        sluid, by_sluid, sluid_job = (SHOW_JOB / "26.05-sluid").read_text().strip(), \
            SHOW_JOB / "26.05-by-sluid.txt", "1"
    scontrol = stand_in(bindir, "scontrol", log, {f"job {sluid}": by_sluid,
                                                   "show node": data / "show-node.txt",
                                                   f"job {job_id}": data / "show-job.txt"})
    squeue = stand_in(bindir, "squeue", log, default=data / "squeue-running.json")
    scancel = stand_in(bindir, "scancel", log)
    sbatch = stand_in(bindir, "sbatch", log)
    from gpuslurm.config import GpuOutConfig

    sched = SlurmScheduler(squeue=squeue, scontrol=scontrol, scancel=scancel, timeout=10,
                           sacctmgr=str(bindir / "no-sacctmgr"), gpu_out=GpuOutConfig(sbatch=sbatch))
    listed = json.loads((data / "squeue-running.json").read_text())["jobs"]
    # the job's batch step's /proc/self/cgroup, as the release's slurmd made it (26.05: by SLUID)
    cgroup = ((data / "cgroup").read_text(), sluid if (data / "sluid").is_file() and f"/{sluid}/"
              in (data / "cgroup").read_text() else job_id) if (data / "cgroup").is_file() else None
    return Case(sched, node_name, HookJob("slurm", job_id, 1000, "alice", node_name), "7.pbshost",
                {str(j["job_id"]): 2 for j in listed}, None, (job_id,),
                {"SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": "0,1"}, (sluid, sluid_job), cgroup,
                lambda: read_log(log))


def pbs_commands_case(tmp: Path) -> Case:
    bindir, log = tmp / "bin", tmp / "commands.log"
    bindir.mkdir()
    names = {n: stand_in(bindir, n, log) for n in ("qalter", "qhold", "qrerun", "qdel", "qmgr")}
    qstat = stand_in(bindir, "qstat", log, default=PBS_DATA / "qstat-f-json.json")
    pbsnodes = stand_in(bindir, "pbsnodes", log, {"-av": PBS_DATA / "pbsnodes-av-json-offline.json"})
    jobs_dir = tmp / "jobs"  # 0.pbshost holds 2 of NUMA vnode 0's 4 GPUs: which, only its map says
    write_map(job_map("0.pbshost", "gpuspbs1", 1000, resolve_devices(GpuClaim(indices=(0, 1)), NODE)),
              str(jobs_dir))
    sched = PbsScheduler(qstat=qstat, pbsnodes=pbsnodes, timeout=10, jobs_dir=str(jobs_dir), **names)
    jobs = json.loads((PBS_DATA / "qstat-f-json.json").read_text())["Jobs"]
    running = {k: v for k, v in jobs.items() if v["job_state"] == "R"}
    return Case(sched, "pbshost", HookJob("pbs", "0.pbshost", 1000, "gpuspbs1", "pbshost"), "7",
                {k: 2 if "ngpus=2" in v["exec_vnode"] else 0 for k, v in running.items()},
                {v["session_id"]: k for k, v in running.items()}, None,
                {"PBS_JOBID": "0.pbshost", "GPUSLURM_GPU_UUIDS": NODE.gpus[0].uuid},
                cgroup=(PBS_CGROUP, "0.pbshost"), commands=lambda: read_log(log))


def pbs_hook_case(tmp: Path) -> Case:
    answer = HookAnswer()
    sched = PbsHookActions(answer, ("pbshost[0]",))

    def applied() -> list[list[str]]:  # what the hook will apply, as the "commands" it was given
        doc = answer.to_dict()
        return [["offline", v] for v in doc.get("offline", {})] + \
            ([["reject", doc["message"]]] if not doc["accept"] else [])

    return Case(sched, "pbshost", HookJob("pbs", "0.pbshost", 1000, "gpuspbs1", "pbshost"), "7",
                {}, {}, None, {"PBS_JOBID": "0.pbshost", "GPUSLURM_GPU_UUIDS": NODE.gpus[0].uuid},
                cgroup=(PBS_CGROUP, "0.pbshost"), commands=applied, extra={"answer": answer},
                unsupported=frozenset({"resume_node", "cancel_job", "set_admin_comment", "apply_gpus_out"}))


def recording_case(tmp: Path) -> Case:
    alloc = Allocation("12", "alice", 1000, (NODE.gpus[0].uuid,), None, None, source="test")
    sched = RecordingScheduler(allocations=(alloc,))
    return Case(sched, "n1", HookJob("recording", "12", 1000, "alice", "n1"), "x",
                {"12": 1}, None, None, {"RECORDING_GPUS": NODE.gpus[0].uuid},
                cgroup=("0::/recording:12/task\n", "12"),
                commands=lambda: [[name, *map(str, args)] for name, args in sched.calls])


IMPLEMENTATIONS: dict[str, Callable[[Path], Case]] = {
    **{f"slurm-{r}": (lambda tmp, r=r: slurm_case(tmp, r)) for r in RELEASES},  # type: ignore[misc]
    "pbs-commands": pbs_commands_case,
    "pbs-hook": pbs_hook_case,
    "recording": recording_case,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    yield IMPLEMENTATIONS[request.param](tmp_path)


def protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(Scheduler).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


def cfg_at(root: Path) -> Config:
    return Config(paths=PathsConfig(cgroup_root=str(root / "cgroup"), run_dir=str(root / "run"),
                                    state_dir=str(root / "state"),
                                    slurm_cgroup_conf=str(root / "cgroup.conf")))


# --- the shape -------------------------------------------------------------------------------------

def test_slurm_recordings_are_there_for_every_release_of_the_suite() -> None:
    """One recording per release the cluster tests run (tests/helpers/slurm_roots.py's, and the
    host's 22.05)."""
    from tests.helpers.slurm_roots import HOST_RELEASE
    from tests.helpers.slurm_roots import RELEASES as ROOT_RELEASES

    missing = {HOST_RELEASE, *ROOT_RELEASES} - set(RELEASES)
    assert not missing, f"no Slurm recording in {SLURM_DATA} for {sorted(missing)}: run " \
                        "tests/cluster/test_record_scheduler_e2e.py under each GPUSLURM_SLURM_RELEASE"


def test_every_method_of_the_interface_is_implemented_with_its_parameters(case: Case) -> None:
    assert isinstance(case.sched.name, str) and case.sched.name
    for name, sig in protocol_methods().items():
        method = getattr(case.sched, name, None)
        assert callable(method), f"{type(case.sched).__name__} lacks {name}"
        assert list(inspect.signature(method).parameters)[:len(sig.parameters) - 1] == \
            list(sig.parameters)[1:], name


def test_this_contract_covers_every_method_of_the_interface() -> None:
    """A method added to the interface needs its contract here (the names below are the tests')."""
    tests = " ".join(n for n in globals() if n.startswith("test_"))
    assert {m for m in protocol_methods() if m not in tests and m not in ACTIONS} == set()


# --- what runs here --------------------------------------------------------------------------------

def test_why_no_job_list_and_node_allocations_give_the_recorded_jobs(case: Case) -> None:
    why = case.sched.why_no_job_list()
    assert why is None or (isinstance(why, str) and why and "\n" not in why)
    assert isinstance(case.sched.title, str) and case.sched.title
    found = case.sched.node_allocations(case.node_name, NODE)
    assert all(isinstance(a, Allocation) for a in found)
    assert {a.job_id: len(a.uuids) for a in found} == dict(case.allocations)
    assert all(u in {g.uuid for g in NODE.gpus} for a in found for u in a.uuids)


def test_sessions_after_a_listing(case: Case) -> None:
    case.sched.node_allocations(case.node_name, NODE)
    found = case.sched.sessions()
    assert found is None if case.sessions is None else dict(found or {}) == dict(case.sessions)


def test_running_job_details(case: Case) -> None:
    found = case.sched.running_job_details(case.node_name)
    if case.details is None:
        assert found is None
        return
    assert found is not None and all(isinstance(d, JobDetail) for d in found)
    assert tuple(d.job_id for d in found) == case.details
    assert all(d.on(case.node_name) is not None for d in found)


def test_job_of_sluid(case: Case) -> None:
    sluid, job = case.sluid
    assert case.sched.job_of_sluid(sluid) == job
    assert case.sched.job_of_sluid("s00000000000AB") is None or job is not None


def test_job_of_cgroup(case: Case) -> None:
    """The recorded cgroup of a process of the job names that job; gpuslurm's own job cgroups name
    theirs on every scheduler; the same paths under a user's own systemd slice, where users make
    cgroups, and a path outside every job, name none."""
    if case.cgroup is not None:
        text, names = case.cgroup
        found = case.sched.job_of_cgroup(text)
        assert found is not None and found.label == names, text
        assert (found.job_id is None) != (found.sluid is None)
        user_slice = "/user.slice/user-1000.slice/user@1000.service"
        under_user = "".join(":".join((*line.split(":", 2)[:2], user_slice + line.split(":", 2)[2])) + "\n"
                             for line in text.splitlines())
        assert case.sched.job_of_cgroup(under_user) is None, under_user
    job_id = case.job.job_id
    for own in (f"0::/gpuslurm.mps/mps_{job_id}\n", f"7:devices:/gpuslurm/job_{job_id}\n"):
        found = case.sched.job_of_cgroup(own)
        assert found is not None and found.job_id == job_id and found.sluid is None, own
    for outside in ("0::/\n", "0::/system.slice/sshd.service\n", "0::/init.scope\n", "", "garbage\n",
                    f"0::/user.slice/user-1000.slice/user@1000.service/gpuslurm.mps/mps_{job_id}\n"):
        assert case.sched.job_of_cgroup(outside) is None, outside


def test_job_gpus_from_env(case: Case) -> None:
    assert case.sched.job_gpus_from_env({}, NODE) is None  # outside any job
    inside = case.sched.job_gpus_from_env(case.in_job_env, NODE)
    assert inside is not None and inside and set(inside) <= {g.uuid for g in NODE.gpus}


# --- the job's cgroups -----------------------------------------------------------------------------

def test_constrains_devices(case: Case, tmp_path: Path) -> None:
    cfg = cfg_at(tmp_path)
    assert isinstance(case.sched.constrains_devices(cfg), bool)
    (tmp_path / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    if isinstance(case.sched, SlurmScheduler):  # Slurm's own cgroup.conf decides
        assert case.sched.constrains_devices(cfg)


def test_job_cgroup_v2_and_existing_job_cgroup_v2(case: Case, tmp_path: Path) -> None:
    cfg = cfg_at(tmp_path)
    scope = tmp_path / "cgroup" / "system.slice" / "slurmstepd.scope"
    scope.mkdir(parents=True)  # as slurmd makes it (root's)
    found = case.sched.job_cgroup_v2(case.job, cfg)
    if found is not None:
        assert found and all(p.startswith(str(scope) + "/") for p in found)
    assert case.sched.existing_job_cgroup_v2(case.job, cfg) == ()  # the job made none yet
    if found:
        Path(found[0]).mkdir()
        assert case.sched.existing_job_cgroup_v2(case.job, cfg) == (found[0],)


def test_devices_cgroup_v1_dirs(case: Case) -> None:
    dirs = case.sched.devices_cgroup_v1_dirs(case.job)
    assert all(case.job.job_id in d and not d.startswith("/") and ".." not in d.split("/") for d in dirs)
    for foreign in (case.foreign_job_id, "../7.x", "7.x/../y", "-1"):
        assert case.sched.devices_cgroup_v1_dirs(case.job._replace(job_id=foreign)) == (), foreign


def test_why_no_running_comments_and_set_running_comment(case: Case) -> None:
    """Where the monitor may keep running jobs' comments current, set_running_comment reaches the
    scheduler and says the job had not ended; elsewhere one line says why not."""
    why = case.sched.why_no_running_comments()
    if why is not None:
        assert isinstance(why, str) and why and "\n" not in why
        return
    before = len(case.commands())
    assert case.sched.set_running_comment(case.job.job_id, "gpuslurm: 1 GPU, util mean 50%") is True
    assert len(case.commands()) > before


@pytest.mark.skipif(not RELEASES, reason="no Slurm recordings")
def test_set_running_comment_on_a_finished_slurm_job_is_not_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld refuses to update a job that has just finished (the monitor's last comment stands):
    False, not an error; another refusal is one; a missing scontrol is said before any attempt."""
    data = SLURM_DATA / RELEASES[-1]
    job_id = (data / "job").read_text().split()[0]
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {data / 'squeue-running.json'}\n")
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "slurm_update error: $REFUSAL" >&2\nexit 1\n')
    for script in (squeue, scontrol):
        script.chmod(0o755)
    sched = SlurmScheduler(squeue=str(squeue), scontrol=str(scontrol), timeout=10)
    assert sched.why_no_running_comments() is None
    monkeypatch.setenv("REFUSAL", "Job/step already completing or completed")
    assert sched.set_running_comment(job_id, "gpuslurm: 1 GPU") is False
    monkeypatch.setenv("REFUSAL", "Invalid job id specified")
    with pytest.raises(GpuslurmError, match="Invalid job id"):
        sched.set_running_comment(job_id, "gpuslurm: 1 GPU")
    missing = SlurmScheduler(squeue=str(squeue), scontrol=str(tmp_path / "none"), timeout=10)
    assert "is missing" in (missing.why_no_running_comments() or "")


# --- actions ---------------------------------------------------------------------------------------

def test_why_no_node_actions(case: Case, tmp_path: Path) -> None:
    """None where the stand-ins are there; one line naming the missing command where they are not
    (the monitor logs faults then, and says the scheduler is not told)."""
    assert case.sched.why_no_node_actions() is None
    gone = {"scontrol": str(tmp_path / "no-scontrol"), "qmgr": str(tmp_path / "no-qmgr")}
    for attr, path in gone.items():
        if hasattr(case.sched, attr):
            setattr(case.sched, attr, path)
            why = case.sched.why_no_node_actions()
            assert why is not None and why.startswith(f"{path} is missing") and "\n" not in why



ACTIONS: dict[str, Callable[[Case], object]] = {
    "drain_node": lambda c: c.sched.drain_node(c.node_name, "gpuslurm: a test reason"),
    "resume_node": lambda c: c.sched.resume_node(c.node_name),
    "refuse_job": lambda c: c.sched.refuse_job(c.job.job_id, "gpuslurm refused this job: test"),
    "cancel_job": lambda c: c.sched.cancel_job(c.job.job_id),
    "set_admin_comment": lambda c: c.sched.set_admin_comment(c.job.job_id, "a test comment"),
    "requeue_job": lambda c: c.sched.requeue_job(c.job.job_id, "gpuslurm requeued this job: test"),
    "set_final_comment": lambda c: c.sched.set_final_comment(c.job.job_id, "gpus 2, util 50%"),
    "apply_gpus_out": lambda c: c.sched.apply_gpus_out(c.node_name, NODE, {}),
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_action_acts_through_the_scheduler_or_says_it_cannot(case: Case, action: str) -> None:
    """drain_node resume_node refuse_job cancel_job set_admin_comment requeue_job set_final_comment
    apply_gpus_out: each does something the scheduler sees (a command, the hook's answer) and
    answers a line where it returns one; an action the implementation documents as impossible
    raises a GpuslurmError and does nothing."""
    before = len(case.commands())
    if action in case.unsupported:
        with pytest.raises(GpuslurmError):
            ACTIONS[action](case)
        assert len(case.commands()) == before
        return
    said = ACTIONS[action](case)
    assert said is None or (isinstance(said, str) and said and "\n" not in said)
    if action != "set_final_comment" or not isinstance(case.sched, PbsHookActions):  # the summary has it
        assert len(case.commands()) > before, action


@pytest.mark.parametrize("action", ["refuse_job", "cancel_job", "requeue_job", "set_admin_comment"])
def test_a_job_action_never_runs_a_command_with_an_option_for_a_job_id(case: Case, action: str) -> None:
    """A job id comes from a scheduler's listing or a map; one that reads as an option must be
    refused before any command runs (the hook's answer names no job, so it has nothing to refuse)."""
    if isinstance(case.sched, (PbsHookActions, RecordingScheduler)) or action in case.unsupported:
        pytest.skip("acts on its own job only, never by an id on a command line")
    before = len(case.commands())
    hostile = case.job._replace(job_id="--help")
    with pytest.raises(GpuslurmError):
        ACTIONS[action](Case(**{**case.__dict__, "job": hostile}))
    assert len(case.commands()) == before
