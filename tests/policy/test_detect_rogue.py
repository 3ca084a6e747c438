from __future__ import annotations

from tests.helpers.detect_helpers import GPUS, alloc, cycle, detect_cfg, gpu, proc, utils

from gpuslurm.policy.detect import Detector
from gpuslurm.samples import ScanProblem

ONLY_ROGUE = "[detect.idle]\nenabled = false\n[detect.share]\nenabled = false\n"
G0, G1, G2 = GPUS[0], GPUS[1], GPUS[2]
PARENT = "GPU-aaaa"
MIG_A, MIG_B = "MIG-aaaa-1", "MIG-aaaa-2"


def _one(procs, allocs, toml: str = ONLY_ROGUE, gpus=None, problems=()):
    det = Detector(detect_cfg(toml))
    return det.feed(cycle(100.0, gpus if gpus is not None else utils(50.0), procs, allocs, problems))


def _mig_gpus():
    return [gpu(PARENT, None), gpu(PARENT, None, MIG_A), gpu(PARENT, None, MIG_B)]


def test_process_in_no_job_is_rogue() -> None:
    (v,) = _one([proc(4242, G1, job=None, user="bob", name="sshd-python")], [alloc("17", "alice", G1)])
    assert (v.kind, v.user, v.job_id, v.pid, v.process, v.gpu_uuid) == (
        "rogue", "bob", None, 4242, "sshd-python", G1)
    assert v.node == "node1" and v.severity == "critical"
    assert v.start == 100.0 and v.duration_s == 0.0
    assert v.evidence == "sshd-python (PID 4242) of bob on GPU-0001, but it is in no job (seen for 0 s)"


def test_process_on_a_gpu_its_job_was_not_given() -> None:
    found = _one([proc(10, G0, job="17", user="alice"), proc(11, G2, job="17", user="alice")],
                 [alloc("17", "alice", G0, G1), alloc("18", "bob", G2)])
    (v,) = found
    assert (v.pid, v.gpu_uuid, v.job_id, v.user) == (11, G2, "17", "alice")
    assert "python (PID 11, job 17) of alice on GPU-0002, but job 17 was given GPU-0000 and GPU-0001" \
        in v.evidence


def test_process_on_its_own_gpus_is_fine() -> None:
    assert _one([proc(10, G0, job="17"), proc(11, G1, job="17"), proc(12, G2, job="18", user="bob")],
                [alloc("17", "alice", G0, G1), alloc("18", "bob", G2)]) == ()


def test_job_without_gpus_on_this_node() -> None:
    (v,) = _one([proc(10, G0, job="99")], [alloc("17", "alice", G1)])
    assert "job 99 was given no GPU on this node" in v.evidence
    (v,) = _one([proc(10, G0, job="99")], [alloc("99", "alice")])  # an allocation with no GPU
    assert "job 99 was given no GPU on this node" in v.evidence


def test_exempt_users_by_name_and_by_uid() -> None:
    toml = ONLY_ROGUE + '[detect.rogue]\nexempt_users = ["dcgm", "990"]\n'
    assert _one([proc(5, G0, user="dcgm", name="nv-hostengine")], [], toml) == ()
    nameless = proc(6, G0, user=None)._replace(uid=990)
    assert _one([nameless], [], toml) == ()
    # the exemption is not a blanket one
    (v,) = _one([proc(7, G0, user="bob")], [], toml)
    assert v.user == "bob"
    # a user that is not exempt but whose name is unknown is reported with the uid
    (v,) = _one([proc(8, G0, user=None)._replace(uid=4000)], [], toml)
    assert v.user == "4000"


def test_user_falls_back_to_the_jobs_user() -> None:
    (v,) = _one([proc(10, G2, job="17", user=None)], [alloc("17", "carol", G0)])
    assert v.user == "carol"


def test_mig_process_on_the_jobs_own_mig_device_is_fine() -> None:
    assert _one([proc(10, PARENT, job="17", mig=MIG_A)], [alloc("17", "alice", MIG_A)],
                gpus=_mig_gpus()) == ()


def test_mig_process_on_the_other_instance_of_the_same_gpu_is_rogue() -> None:
    (v,) = _one([proc(10, PARENT, job="17", mig=MIG_B)], [alloc("17", "alice", MIG_A)], gpus=_mig_gpus())
    assert v.gpu_uuid == MIG_B
    assert "on MIG-aaaa-2, but job 17 was given MIG-aaaa-1" in v.evidence


def test_mig_process_of_a_job_given_the_whole_gpu_is_fine() -> None:
    assert _one([proc(10, PARENT, job="17", mig=MIG_B)], [alloc("17", "alice", PARENT)],
                gpus=_mig_gpus()) == ()


def test_unnamed_mig_device_is_not_called_rogue_when_the_job_holds_one_on_that_gpu() -> None:
    assert _one([proc(10, PARENT, job="17")], [alloc("17", "alice", MIG_A)], gpus=_mig_gpus()) == ()
    # ...but it is when the job's MIG devices are all on another GPU
    others = [*_mig_gpus(), gpu("GPU-bbbb", None, "MIG-bbbb-1")]
    (v,) = _one([proc(10, PARENT, job="17")], [alloc("17", "alice", "MIG-bbbb-1")], gpus=others)
    assert v.gpu_uuid == PARENT


def test_violation_keeps_its_start_while_it_lasts_and_is_forgotten_after() -> None:
    det = Detector(detect_cfg(ONLY_ROGUE))
    rogue = proc(4242, G1, user="bob")
    allocs = [alloc("17", "alice", G1)]
    for ts in (10.0, 20.0, 130.0):
        (v,) = det.feed(cycle(ts, utils(90.0), [rogue], allocs))
        assert v.start == 10.0 and v.duration_s == ts - 10.0
    assert v.evidence.endswith("(seen for 2 min)")
    assert det.feed(cycle(140.0, utils(90.0), [], allocs)) == ()
    (v,) = det.feed(cycle(150.0, utils(90.0), [rogue], allocs))
    assert v.start == 150.0  # a new occurrence, not the old one


def test_scan_problems_do_not_hide_rogues() -> None:
    (v,) = _one([proc(10, G0)], [], problems=[ScanProblem(100.0, "proc-unreadable", "11")])
    assert v.pid == 10


def test_disabled() -> None:
    assert _one([proc(10, G0)], [], ONLY_ROGUE + "[detect.rogue]\nenabled = false\n") == ()


def test_a_process_listed_twice_is_one_finding() -> None:
    assert len(_one([proc(10, G0), proc(10, G0)], [])) == 1


def test_a_process_of_another_uid_in_a_jobs_cgroup_is_rogue() -> None:
    # e.g. a cgroup a user made under their own systemd slice, named like a Slurm job's
    from gpuslurm.policy.rogue import why_rogue
    from gpuslurm.policy.usage import view

    job = alloc("812", "alice", "GPU-aaaa")
    intruder = proc(9, "GPU-aaaa", "812", user="bob")
    why = why_rogue(intruder, view(cycle(0.0, {"GPU-aaaa": 50.0}, [intruder], [job])))
    assert why is not None and "uid" in why and "812" in why
    owner = intruder._replace(uid=job.uid, user="alice")
    assert why_rogue(owner, view(cycle(0.0, {"GPU-aaaa": 50.0}, [owner], [job]))) is None
