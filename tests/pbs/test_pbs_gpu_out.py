"""A GPU out of service on PBS without PBS: execjob_begin and exechost_startup in-process, and the
vnode counts and commands :func:`gpuslurm.pbs.gpu_out.reconcile` derives from the record.

The real-PBS test is tests/pbs_cluster/test_pbs_gpu_out_e2e.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.pbs_site import Site

from gpuslurm.errors import CommandError
from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import BUILTIN_DIR, load_node
from gpuslurm.pbs.gpu_out import PbsGpuOut, clean_value, plan, reconcile
from gpuslurm.pbs.qstat import PbsNode
from gpuslurm.samples import Allocation
from gpuslurm.state.out_of_service import GPU_OUT_REASON, OutOfService, OutOfServiceStore, take_out

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the job map and its directories are root's")
DGX = load_node(str(BUILTIN_DIR / "dgx-h100"))


@pytest.fixture
def dgx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return Site(tmp_path, "dgx-h100", monkeypatch)


def _out(site: Site, *indices: int, reason: str = "fan failed") -> None:
    store = OutOfServiceStore(str(site.root / "state"))
    for i in indices:
        gpu = next(g for g in site.node.gpus if g.index == i)
        take_out(store, site.node.gpus, gpu, reason, "admin", now=time.time())


def _index(site: Site, uuid: str) -> int:
    return next(g.index for g in site.node.gpus if g.uuid == uuid)


@root_only
def test_begin_never_chooses_a_gpu_out_of_service_even_the_one_it_would_choose_first(dgx: Site) -> None:
    rc, answer, _ = dgx.begin("1.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"], answer
    first = _index(dgx, dgx.mapped("1.pbshost")[0])
    (dgx.jobs / "1.pbshost.json").unlink()
    _out(dgx, first)
    rc, answer, _ = dgx.begin("2.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"], answer
    assert _index(dgx, dgx.mapped("2.pbshost")[0]) != first


@root_only
def test_begin_refuses_a_job_that_would_need_the_gpu_out_naming_it(dgx: Site) -> None:
    _out(dgx, 3, reason="fan failed")
    rc, answer, _ = dgx.begin("3.pbshost", "(pbshost[0]:ncpus=1:ngpus=4)")
    assert rc == 0 and answer is not None and not answer["accept"]
    assert "out of service: fan failed" in answer["message"], answer
    assert not (dgx.jobs / "3.pbshost.json").exists()


@root_only
def test_begin_with_a_corrupt_record_fails_closed(dgx: Site) -> None:
    (dgx.root / "state").mkdir(mode=0o755, exist_ok=True)
    (dgx.root / "state" / "out-of-service.json").write_text("{broken")
    rc, answer, err = dgx.begin("4.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 2 and answer is None and "out-of-service.json" in err[-1], err
    assert not (dgx.jobs / "4.pbshost.json").exists()


@root_only
def test_startup_publishes_each_numa_vnode_without_its_gpus_out(dgx: Site) -> None:
    _out(dgx, 3)
    rc, answer, _ = dgx.call("exechost_startup", vnodes=["pbshost"])
    assert rc == 0 and answer is not None
    numa3 = next(g.numa_node for g in dgx.node.gpus if g.index == 3)
    for v in plan_vnodes(dgx.node):
        want = len(v.gpu_minors) - (1 if v.numa_node == numa3 else 0)
        assert answer["vnodes"][f"pbshost[{v.numa_node}]"]["ngpus"] == want


# --- reconcile: the commands from the record and pbsnodes' view ---------------------------------

def _rec(index: int, reason: str = "fan failed") -> tuple[str, OutOfService]:
    g = next(g for g in DGX.gpus if g.index == index)
    return g.uuid, OutOfService(g.uuid, reason, 0.0, "admin", g.index, g.minor)


def _vnodes(ngpus: dict[str, int], comments: dict[str, str] | None = None,
            offline: bool = False) -> list[PbsNode]:
    comments = comments or {}
    out = [PbsNode("pbshost", "pbshost", ("offline",) if offline else ("free",),
                   comments.get("pbshost", ""), 0, 0, ())]
    out += [PbsNode(n, "pbshost", ("free",), comments.get(n, ""), c, 0, ()) for n, c in ngpus.items()]
    return out


class Recorder:
    def __init__(self, vnodes: list[PbsNode], allocations: tuple[Allocation, ...] = (),
                 job_on_gpu: str = "leave") -> None:
        self.calls: list[tuple[str, ...]] = []
        self.cmds = PbsGpuOut(
            read_vnodes=lambda: vnodes, qmgr=lambda d: self.calls.append(("qmgr", d)),  # type: ignore
            offline=lambda h, c: self.calls.append(("offline", h, c)),  # type: ignore
            online=lambda h: self.calls.append(("online", h)),  # type: ignore
            allocations=lambda: allocations, notify=lambda j, t: self.calls.append(("notify", j, t)),  # type: ignore
            requeue=self.requeue, job_on_gpu=job_on_gpu)

    def requeue(self, job: str, why: str) -> str:
        self.calls.append(("requeue", job, why))
        return "requeued"


def test_only_the_vnode_holding_the_gpu_changes_and_repeating_changes_nothing() -> None:
    out = dict([_rec(3)])
    rec = Recorder(_vnodes({"pbshost[0]": 4, "pbshost[1]": 4}))
    line = reconcile(DGX, "pbshost", out, rec.cmds)
    (comment,) = [c for c in plan(DGX, "pbshost", out, True) if c.out]
    assert rec.calls == [("qmgr", f"set node {comment.vnode} resources_available.ngpus = 3"),
                         ("qmgr", f'set node {comment.vnode} comment = "{comment.comment}"')]
    assert "ngpus 3 of 4" in line
    again = Recorder(_vnodes({comment.vnode: 3, "pbshost[1]": 4}, {comment.vnode: comment.comment}))
    reconcile(DGX, "pbshost", out, again.cmds)
    assert again.calls == []


def test_back_in_service_restores_the_count_and_clears_only_gpuslurms_comment() -> None:
    rec = Recorder(_vnodes({"pbshost[0]": 3, "pbshost[1]": 4},
                           {"pbshost[0]": "gpuslurm: out of service: index 3", "pbshost[1]": "site's own"}))
    reconcile(DGX, "pbshost", {}, rec.cmds)
    assert rec.calls == [("qmgr", "set node pbshost[0] resources_available.ngpus = 4"),
                         ("qmgr", "unset node pbshost[0] comment")]


def test_a_site_comment_is_not_overwritten() -> None:
    rec = Recorder(_vnodes({"pbshost[0]": 4, "pbshost[1]": 4}, {"pbshost[0]": "rack 7 maintenance"}))
    reconcile(DGX, "pbshost", dict([_rec(0)]), rec.cmds)
    assert rec.calls == [("qmgr", "set node pbshost[0] resources_available.ngpus = 3")]


def test_the_natural_vnode_when_the_site_has_no_numa_vnodes() -> None:
    rec = Recorder([PbsNode("pbshost", "pbshost", ("free",), "", 8, 0, ())])
    reconcile(DGX, "pbshost", dict([_rec(5)]), rec.cmds)
    assert rec.calls[0] == ("qmgr", "set node pbshost resources_available.ngpus = 7")


def test_the_last_gpu_out_takes_the_host_offline_and_one_back_online() -> None:
    out = dict(_rec(i) for i in range(8))
    rec = Recorder(_vnodes({"pbshost[0]": 4, "pbshost[1]": 4}))
    reconcile(DGX, "pbshost", out, rec.cmds)
    (offline,) = [c for c in rec.calls if c[0] == "offline"]
    assert offline[2].startswith(GPU_OUT_REASON) and "no GPU left in service" in offline[2]
    back = Recorder(_vnodes({"pbshost[0]": 0, "pbshost[1]": 0}, {"pbshost": offline[2]}, offline=True))
    reconcile(DGX, "pbshost", dict(_rec(i) for i in range(7)), back.cmds)
    assert ("online", "pbshost") in back.calls
    # a host an admin took offline for another reason stays offline
    theirs = Recorder(_vnodes({"pbshost[0]": 0, "pbshost[1]": 0}, {"pbshost": "reboot"}, offline=True))
    reconcile(DGX, "pbshost", {}, theirs.cmds)
    assert not [c for c in theirs.calls if c[0] == "online"]


@pytest.mark.parametrize("policy, verb", [("leave", None), ("notify", "notify"), ("requeue", "requeue")])
def test_a_job_on_the_failed_gpu_is_handled_as_configured(policy: str, verb: str | None) -> None:
    uuid, rec3 = _rec(3)
    other = next(g.uuid for g in DGX.gpus if g.index == 0)
    jobs = (Allocation("7.pbshost", "alice", 1000, (uuid.lower(),), 0.0),
            Allocation("8.pbshost", "bob", 1001, (other,), 0.0))
    rec = Recorder(_vnodes({"pbshost[0]": 3, "pbshost[1]": 4}), jobs, job_on_gpu=policy)
    reconcile(DGX, "pbshost", {uuid: rec3}, rec.cmds)
    acted = [c for c in rec.calls if c[0] in ("notify", "requeue")]
    if verb is None:
        assert acted == []
    else:
        assert [(c[0], c[1]) for c in acted] == [(verb, "7.pbshost")] and "fan failed" in acted[0][2]


def test_a_job_that_ended_meanwhile_is_not_an_error() -> None:
    uuid, rec3 = _rec(3)
    rec = Recorder(_vnodes({"pbshost[0]": 3, "pbshost[1]": 4}),
                   (Allocation("7.pbshost", "alice", 1000, (uuid,), 0.0),), job_on_gpu="requeue")

    def gone(job: str, why: str) -> str:
        raise CommandError("qrerun: Unknown Job Id")

    reconcile(DGX, "pbshost", {uuid: rec3}, rec.cmds._replace(requeue=gone))


@given(st.text(max_size=300))
def test_a_reason_can_never_end_the_quoted_qmgr_value(reason: str) -> None:
    value = clean_value(reason)
    assert '"' not in value and "\n" not in value and value.isprintable()


@root_only
def test_a_gpu_out_fault_at_begin_takes_only_that_gpu_out_and_the_job_gets_another(dgx: Site) -> None:
    import json

    first = next(g for g in sorted(dgx.node.gpus, key=lambda g: g.index) if g.numa_node == 0)
    dgx.config.write_text(dgx.config.read_text() + '[health.xid]\naction = "gpu_out"\n')
    (dgx.bundle / "health.json").write_text(json.dumps({first.uuid: {"xid": [79]}}))
    rc, answer, _ = dgx.begin("5.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"], answer
    assert dgx.mapped("5.pbshost") != [first.uuid] and "offline" not in answer
    assert answer["vnodes"] == {"pbshost[0]": {"ngpus": 3}}
    out = OutOfServiceStore(str(dgx.root / "state")).read()
    assert list(out) == [first.uuid] and out[first.uuid].by == "prolog" and "79" in out[first.uuid].reason


@root_only
def test_a_gpu_already_out_of_service_keeps_its_fault_without_taking_the_vnode_offline(dgx: Site) -> None:
    import json

    first = next(g for g in sorted(dgx.node.gpus, key=lambda g: g.index) if g.numa_node == 0)
    (dgx.bundle / "health.json").write_text(json.dumps({first.uuid: {"xid": [79]}}))  # action drain
    rc, answer, _ = dgx.begin("6.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert answer is not None and not answer["accept"] and "pbshost[0]" in answer["offline"]
    _out(dgx, first.index, reason="Xid 79")  # the admin takes only that GPU out, the vnode back online
    rc, answer, _ = dgx.begin("7.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert rc == 0 and answer is not None and answer["accept"] and "offline" not in answer, answer
    assert dgx.mapped("7.pbshost") != [first.uuid]


@root_only
def test_a_drain_fault_at_begin_still_takes_the_other_faulty_gpu_out(dgx: Site) -> None:
    """The one fault response (docs/health.md): the vnode goes offline for GPU A's drain fault, and
    GPU B's gpu_out fault still takes B out (begin used to skip it on a vnode it took offline)."""
    import json

    a, b = sorted((g for g in dgx.node.gpus if g.numa_node == 0), key=lambda g: g.index)[:2]
    dgx.config.write_text(dgx.config.read_text() + '[health.xid]\naction = "gpu_out"\n'
                          '[health.ecc]\naction = "drain"\n')
    (dgx.bundle / "health.json").write_text(json.dumps({a.uuid: {"ecc_uncorrectable": 2},
                                                        b.uuid: {"xid": [79]}}))
    _, answer, _ = dgx.begin("8.pbshost", "(pbshost[0]:ncpus=1:ngpus=1)")
    assert answer is not None and not answer["accept"], answer
    offline = answer["offline"]["pbshost[0]"]
    assert "2 uncorrectable" in offline and "79" not in offline
    assert list(OutOfServiceStore(str(dgx.root / "state")).read()) == [b.uuid]
