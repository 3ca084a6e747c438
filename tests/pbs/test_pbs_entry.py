"""gpuslurm's side of the PBS hook, in-process (gpuslurm.pbs.entry.main): no PBS needed.

Each test replays a copy of a built-in bundle (so that it can write health.json beside it) with a
config of its own under tmp_path; the GPU choice, the job map, the answer and the failure policy
are checked as the hook would receive them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from tests.helpers.mps_helpers import fake_control, live_with_pipe_under, records
from tests.helpers.pbs_site import Site

from gpuslurm.gres.pbs_vnodes import plan_vnodes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the job map and its directories are root's")


@pytest.fixture
def dgx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return Site(tmp_path, "dgx-h100", monkeypatch)


def test_startup_publishes_one_vnode_per_numa_node(dgx: Site) -> None:
    rc, answer, _ = dgx.call("exechost_startup", vnodes=["pbshost"])
    assert rc == 0 and answer is not None and answer["accept"] is True
    want = {"pbshost": {"ncpus": 0, "mem": "0kb", "ngpus": 0}}
    for v in plan_vnodes(dgx.node):
        want[f"pbshost[{v.numa_node}]"] = {"ncpus": len(v.cpus), "mem": f"{v.memory_mib}mb",
                                          "ngpus": len(v.gpu_minors)}
    assert answer["vnodes"] == want


def test_startup_without_meminfo_publishes_no_mem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  real_fixtures: Path) -> None:
    # the real H200 capture has no meminfo: every vnode got mem = 0mb, which no job asking for
    # memory (select=1:ncpus=1:nmigs=1:mem=100mb) could ever fit
    from gpuslurm.hw.replay.importer import import_multi_capture

    site = Site(tmp_path, "dgx-h100", monkeypatch)
    shutil.rmtree(site.bundle)
    import_multi_capture(real_fixtures / "multi" / "h200-mig__590.48.01.txt", site.bundle)
    (site.bundle / "lscpu.csv").write_text("# CPU,Core,Socket,Node\n"
                                           + "".join(f"{c},{c},0,0\n" for c in range(24)))
    rc, answer, lines = site.call("exechost_startup", vnodes=["pbshost"])
    assert rc == 0 and answer is not None and answer["accept"] is True, lines
    assert answer["vnodes"] == {"pbshost": {"ncpus": 0, "ngpus": 0, "nmigs": 0},
                                "pbshost[0]": {"ncpus": 24, "ngpus": 0, "nmigs": 5}}
    assert any("mem left out: the capture has no meminfo" in line for line in lines), lines


def test_begin_chooses_numa_local_gpus_and_a_second_job_gets_others(dgx: Site) -> None:
    rc, answer, lines = dgx.begin("1.pbshost", "(pbshost[1]:ncpus=4:ngpus=2)")
    assert (rc, answer) == (0, {"format": 1, "accept": True}), lines
    first = dgx.mapped("1.pbshost")
    assert len(first) == 2 and {dgx.numa(u) for u in first} == {1}
    rc, answer, _ = dgx.begin("2.pbshost", "(pbshost[1]:ncpus=4:ngpus=2)")
    second = dgx.mapped("2.pbshost")
    assert rc == 0 and {dgx.numa(u) for u in second} == {1} and not set(first) & set(second)
    # vnode 1 is full now: a third job is refused, naming the jobs whose maps hold its GPUs
    rc, answer, _ = dgx.begin("3.pbshost", "(pbshost[1]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"] is False
    assert "1.pbshost, 2.pbshost" in answer["message"] and not (dgx.jobs / "3.pbshost.json").exists()
    # the end frees them
    rc, answer, lines = dgx.call("execjob_end", job_id="1.pbshost", euser="root",
                                 exec_vnode="(pbshost[1]:ncpus=4:ngpus=2)")
    assert rc == 0 and answer == {"format": 1, "accept": True}, lines
    assert not (dgx.jobs / "1.pbshost.json").exists()
    summary = json.loads((dgx.root / "state" / "jobs" / "1.pbshost-summary.json").read_text())
    assert summary["scheduler"] == "pbs" and [g["uuid"] for g in summary["gpus"]] == first
    assert dgx.begin("3.pbshost", "(pbshost[1]:ncpus=1:ngpus=1)")[1] == {"format": 1, "accept": True}


def test_a_chunk_split_across_numa_vnodes_takes_each_vnodes_share_on_its_own_node(dgx: Site) -> None:
    rc, answer, _ = dgx.begin("5.pbshost", "(pbshost[0]:ncpus=2:ngpus=1+pbshost[1]:ncpus=2:ngpus=3)")
    assert rc == 0 and answer is not None and answer["accept"]
    got = [dgx.numa(u) for u in dgx.mapped("5.pbshost")]
    assert sorted(got) == [0, 1, 1, 1]


def test_more_gpus_than_the_vnode_has_is_refused_with_the_reason_and_nothing_written(dgx: Site) -> None:
    rc, answer, _ = dgx.begin("6.pbshost", "(pbshost[0]:ncpus=1:ngpus=5)")
    assert rc == 0 and answer is not None and answer["accept"] is False
    assert "asks for 5 GPU(s) on vnode pbshost[0], but NUMA node 0 has 4" in answer["message"]
    assert not dgx.jobs.exists() or not list(dgx.jobs.iterdir())


def test_a_drain_fault_takes_the_vnode_offline_naming_gpu_and_device_file(dgx: Site) -> None:
    bad = next(g for g in dgx.node.gpus if g.index == 2)
    (dgx.bundle / "health.json").write_text(json.dumps({bad.uuid: {"xid": [79]}}))
    rc, answer, _ = dgx.begin("7.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"] is False
    comment = answer["offline"]["pbshost[0]"]
    assert f"index 2 (/dev/nvidia{bad.minor}, {bad.uuid})" in comment and "Xid 79" in comment
    assert "pbshost[0]" in answer["message"]
    assert not (dgx.jobs / "7.pbshost.json").exists()
    summary = json.loads((dgx.root / "state" / "jobs" / "7.pbshost-summary.json").read_text())
    assert summary["refused_by"] == "prolog" and summary["faults"][0]["check"] == "xid"
    assert summary["start"] is None and [g["uuid"] for g in summary["gpus"]] == [bad.uuid]
    # docs/pbs.md names every key of it (refused_by was documented nowhere)
    doc = Path(__file__).resolve().parents[2] / "docs" / "pbs.md"
    if doc.is_file():
        said = doc.read_text().split("**The summary of a refused job.**", 1)[1].split("\n\n", 1)[0]
        assert [k for k in summary if f"`{k}`" not in said and f'`"{k}"' not in said] == []
    # the other NUMA node's vnode is healthy: a job there starts
    assert dgx.begin("8.pbshost", "(pbshost[1]:ncpus=1:ngpus=1)")[1] == {"format": 1, "accept": True}


def test_launch_sets_the_environment_from_the_map(dgx: Site) -> None:
    dgx.begin("9.pbshost", "(pbshost[0]:ncpus=4:ngpus=2)")
    uuids = dgx.mapped("9.pbshost")
    rc, answer, _ = dgx.call("execjob_launch", job_id="9.pbshost", euser="root", pid=os.getpid(),
                             exec_vnode="(pbshost[0]:ncpus=4:ngpus=2)")
    assert rc == 0 and answer is not None
    env = answer["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids) == env["GPUSLURM_GPU_UUIDS"]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["GPUSLURM_NUMA_NODE"] == "0"


def test_launch_without_a_map_fails_for_a_gpu_job_and_hides_gpus_from_others(dgx: Site) -> None:
    rc, answer, lines = dgx.call("execjob_launch", job_id="10.pbshost", euser="root", pid=os.getpid(),
                                 exec_vnode="(pbshost[0]:ncpus=4:ngpus=2)")
    assert rc == 2 and answer is None and "no map" in lines[-1]
    rc, answer, _ = dgx.call("execjob_launch", job_id="10.pbshost", euser="root", pid=os.getpid(),
                             exec_vnode="(pbshost[0]:ncpus=4)")
    assert rc == 0 and answer is not None and answer["env"] == {"CUDA_VISIBLE_DEVICES": ""}


def test_the_end_is_bookkeeping_a_broken_health_file_only_logs(dgx: Site) -> None:
    dgx.begin("11.pbshost", "(pbshost[0]:ncpus=4:ngpus=2)")
    (dgx.bundle / "health.json").write_text("{not json")
    rc, answer, lines = dgx.call("execjob_end", job_id="11.pbshost", euser="root",
                                 exec_vnode="(pbshost[0]:ncpus=4:ngpus=2)")
    assert rc == 0 and answer == {"format": 1, "accept": True}
    assert any("cannot read GPU health" in line for line in lines)
    assert not (dgx.jobs / "11.pbshost.json").exists()
    # ... while a begin with it fails closed: exit 2 and one line, which the hook turns into a reject
    rc, answer, lines = dgx.begin("12.pbshost", "(pbshost[0]:ncpus=4:ngpus=2)")
    assert rc == 2 and answer is None and "health.json" in lines[-1]


def test_an_unknown_user_is_refused_at_begin(dgx: Site) -> None:
    rc, answer, lines = dgx.begin("13.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)", user="no-such-user-x")
    assert rc == 2 and answer is None and "unknown" in lines[-1]


def test_a_broken_config_is_exit_2_and_one_line(dgx: Site) -> None:
    dgx.config.write_text("[paths\n")
    rc, answer, lines = dgx.begin("14.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 2 and answer is None and len(lines) == 1 and str(dgx.config) in lines[0]


def test_the_best_connected_free_pair_is_chosen_on_a_natural_vnode(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # l40s-4x: GPUs 0-1 share a PCIe switch (PIX), 2-3 a NUMA node (NODE), across is SYS.
    site = Site(tmp_path, "l40s-4x", monkeypatch)
    by_index = {g.index: g.uuid for g in site.node.gpus}
    assert site.begin("1.pbshost", "(pbshost:ncpus=1:ngpus=1)")[1] == {"format": 1, "accept": True}
    assert site.mapped("1.pbshost") == [by_index[0]]  # lowest index among equals
    site.begin("2.pbshost", "(pbshost:ncpus=1:ngpus=2)")
    assert sorted(site.mapped("2.pbshost")) == sorted([by_index[2], by_index[3]])  # NODE, not SYS


def test_the_replayed_node_with_its_links_is_read_once_then_cached(dgx: Site,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuslurm.hooks.cache import placement_node
    from gpuslurm.hw import source

    bundle = source.hardware_source(str(dgx.bundle))

    first = placement_node(bundle, str(dgx.root / "run"))
    assert (dgx.root / "run" / "cache" / "node-placement.json").stat().st_mode & 0o777 == 0o600

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the bundle was parsed again")

    monkeypatch.setattr(source, "_read_bundle", refuse)
    again = placement_node(bundle, str(dgx.root / "run"))
    assert again == first and again.links is not None
    assert dgx.begin("20.pbshost", "(pbshost[0]:ncpus=1:ngpus=2)")[1] == {"format": 1, "accept": True}
    # a changed bundle file is a new key: parsed again
    (dgx.bundle / "hostname").write_text("other\n")
    with pytest.raises(AssertionError, match="parsed again"):
        placement_node(bundle, str(dgx.root / "run"))


def test_begin_starts_the_mps_daemon_launch_names_its_pipe_and_end_stops_it(dgx: Site) -> None:
    """``gpuslurm_mps`` in the request: the neutral prolog's MPS step (the "gres" trigger, the
    config's share), the task prolog's exports in execjob_launch, the epilog's stop at the end."""
    control, calls = fake_control(dgx.root)
    dgx.config.write_text(dgx.config.read_text().replace("[paths]\n", f'[paths]\nmps_control = "{control}"\n')
                          + "[mps]\nactive_thread_percentage = 30\n")
    job = "41.pbshost"
    rc, answer, err = dgx.call("execjob_begin", job_id=job, euser="root", exec_vnode="(pbshost[1]:ngpus=1)",
                               mps="True")
    assert rc == 0 and answer is not None and answer["accept"], err
    pipe = dgx.root / "run" / "mps" / job / "pipe"
    [start] = records(calls, "start")
    assert start["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == dgx.mapped(job)[0]
    assert [r["command"] for r in records(calls, "command")] == ["set_default_active_thread_percentage 30"]
    rc, answer, err = dgx.call("execjob_launch", job_id=job, euser="root", exec_vnode="(pbshost[1]:ngpus=1)",
                               pid=os.getpid())
    assert rc == 0 and answer is not None, err
    assert answer["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert answer["env"]["CUDA_MPS_LOG_DIRECTORY"] == str(pipe.parent / "log")
    rc, answer, err = dgx.call("execjob_end", job_id=job, euser="root", exec_vnode="(pbshost[1]:ngpus=1)")
    assert rc == 0, err
    assert records(calls, "command")[-1]["command"] == "quit"
    assert not pipe.parent.exists() and live_with_pipe_under(str(pipe)) == []
    # a job that did not ask (or asked for false) gets none
    for ask in ({}, {"mps": "False"}):
        rc, answer, err = dgx.call("execjob_begin", job_id="42.pbshost", euser="root",
                                   exec_vnode="(pbshost[1]:ngpus=1)", **ask)
        assert rc == 0 and not (dgx.root / "run" / "mps" / "42.pbshost").exists()
        dgx.call("execjob_end", job_id="42.pbshost", euser="root", exec_vnode="(pbshost[1]:ngpus=1)")
    assert len(records(calls, "start")) == 1


@pytest.fixture
def mig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return Site(tmp_path, "a100-mig", monkeypatch)


def test_mig_instances_are_published_as_nmigs_and_whole_gpus_as_ngpus(mig: Site) -> None:
    """a100-mig: GPU index 0 (NUMA node 3) in MIG mode with 4 instances, GPU index 1 (NUMA node 7)
    whole. The MIG GPU is no ngpus (a job could not use it whole); its instances are nmigs."""
    rc, answer, _ = mig.call("exechost_startup", vnodes=["pbshost"])
    assert rc == 0 and answer is not None
    vnodes = answer["vnodes"]
    assert vnodes["pbshost"] == {"ncpus": 0, "mem": "0kb", "ngpus": 0, "nmigs": 0}
    assert (vnodes["pbshost[3]"]["ngpus"], vnodes["pbshost[3]"]["nmigs"]) == (0, 4)
    assert (vnodes["pbshost[7]"]["ngpus"], vnodes["pbshost[7]"]["nmigs"]) == (1, 0)
    assert sum(v["ngpus"] for v in vnodes.values()) == 1 and sum(v["nmigs"] for v in vnodes.values()) == 4


def test_a_job_asking_for_mig_instances_gets_free_ones_of_its_vnode_named_by_mig_uuid(mig: Site) -> None:
    gpu = next(g for g in mig.node.gpus if g.mig_mode)
    instances = {m.uuid for m in gpu.mig_devices}
    rc, answer, lines = mig.begin("1.pbshost", "(pbshost[3]:ncpus=2:nmigs=1)")
    assert (rc, answer) == (0, {"format": 1, "accept": True}), lines
    [first] = mig.mapped("1.pbshost")
    assert first in instances
    jmap = json.loads((mig.jobs / "1.pbshost.json").read_text())
    assert jmap["gpus"][0]["parent_uuid"] == gpu.uuid
    rc, answer, lines = mig.begin("2.pbshost", "(pbshost[3]:ncpus=2:nmigs=3)")
    assert rc == 0 and answer is not None and answer["accept"], lines
    second = mig.mapped("2.pbshost")
    assert len(second) == 3 and set(second) | {first} == instances
    # all four taken: a fifth is refused naming the jobs that hold them; nothing written
    rc, answer, _ = mig.begin("3.pbshost", "(pbshost[3]:ncpus=1:nmigs=1)")
    assert rc == 0 and answer is not None and answer["accept"] is False
    assert "0 free MIG instance(s) of 4" in answer["message"] and "1.pbshost, 2.pbshost" in answer["message"]
    assert not (mig.jobs / "3.pbshost.json").exists()
    # the task sees its instance by MIG UUID
    rc, answer, _ = mig.call("execjob_launch", job_id="1.pbshost", euser="root", pid=os.getpid(),
                             exec_vnode="(pbshost[3]:ncpus=2:nmigs=1)")
    assert rc == 0 and answer is not None and answer["env"]["CUDA_VISIBLE_DEVICES"] == first
    # a whole GPU and an instance in one job: each from its own vnode
    mig.call("execjob_end", job_id="2.pbshost", euser="root", exec_vnode="(pbshost[3]:ncpus=2:nmigs=3)")
    rc, answer, lines = mig.begin("4.pbshost", "(pbshost[7]:ncpus=1:ngpus=1)+(pbshost[3]:ncpus=1:nmigs=1)")
    assert rc == 0 and answer is not None and answer["accept"], lines
    whole = next(g.uuid for g in mig.node.gpus if not g.mig_mode)
    got = mig.mapped("4.pbshost")
    assert got[0] == whole and got[1] in instances - {first}


def test_more_mig_instances_than_the_vnode_has_is_refused(mig: Site) -> None:
    rc, answer, _ = mig.begin("5.pbshost", "(pbshost[3]:ncpus=1:nmigs=5)")
    assert rc == 0 and answer is not None and answer["accept"] is False
    assert "asks for 5 MIG instance(s) on vnode pbshost[3], but NUMA node 3 has 4" in answer["message"]
    rc, answer, _ = mig.begin("6.pbshost", "(pbshost[0]:ncpus=1:nmigs=1)")  # a NUMA node without MIG
    assert answer is not None and answer["accept"] is False and "NUMA node 0 has 0" in answer["message"]
    assert not mig.jobs.exists() or not list(mig.jobs.iterdir())


@pytest.mark.parametrize("layout", ["pbs-cgroups-hook", "none-yet"])
def test_next_to_pbs_cgroups_hook_the_daemon_joins_its_job_cgroup_else_one_of_its_own(
        dgx: Site, layout: str) -> None:
    """PBS's cgroups hook enabled here (the request says so): gpuslurm makes no job cgroup, and the
    MPS daemon starts in the hook's job cgroup ``pbs_jobs.service/jobid/<id>`` when it exists
    (root's), else in ``gpuslurm/mps_<id>`` of its own, removed at the end. Real v1 cgroups."""
    from gpuslurm.isolate.cgroup_v1 import v1_job_dir
    from gpuslurm.isolate.cgroupfs import cgroup_version

    root = "/sys/fs/cgroup"
    if cgroup_version(root) != 1:
        pytest.skip("no cgroup v1 devices hierarchy here")
    control, calls = fake_control(dgx.root)
    dgx.config.write_text(dgx.config.read_text().replace(f'cgroup_root = "{dgx.root}/no-cgroup"',
                                                         f'cgroup_root = "{root}"')
                          .replace("[paths]\n", f'[paths]\nmps_control = "{control}"\n'))
    job = f"{os.getpid() % 100000 + 500}.pbshost"
    pbs_dir = Path(root) / "devices" / "pbs_jobs.service" / "jobid" / job
    made = []
    if layout == "pbs-cgroups-hook":
        for d in (pbs_dir.parent.parent, pbs_dir.parent, pbs_dir):
            if not d.is_dir():
                d.mkdir()
                made.append(d)
    try:
        rc, answer, err = dgx.call("execjob_begin", job_id=job, euser="root", pbs_cgroups=True,
                                   exec_vnode="(pbshost[1]:ngpus=1)", mps="true")
        assert rc == 0 and answer is not None and answer["accept"], err
        assert not Path(v1_job_dir(root, job)).exists()  # PBS's hook confines the tasks, not gpuslurm
        [daemon] = records(calls, "daemon")
        devices = next(line.split(":", 2)[2] for line in daemon["cgroup"] if line.split(":")[1] == "devices")
        want = f"/pbs_jobs.service/jobid/{job}" if layout == "pbs-cgroups-hook" else f"/gpuslurm/mps_{job}"
        assert devices == want
        rc, _, err = dgx.call("execjob_end", job_id=job, euser="root", exec_vnode="(pbshost[1]:ngpus=1)")
        assert rc == 0, err
        assert records(calls, "command")[-1]["command"] == "quit"
        assert not Path(v1_job_dir(root, job, "mps")).exists()
    finally:
        for d in reversed(made):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:  # the daemon's last process may still be leaving
                    time.sleep(0.1)
