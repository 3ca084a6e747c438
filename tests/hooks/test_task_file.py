"""The task prolog reads the task file the prolog wrote, never the node: same lines, no NVML, no bundle."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cgroup_helpers import NOBODY
from tests.helpers.hook_helpers import HookSite, make_site
from tests.helpers.nvml_replay import REAL, REAL_BUNDLES

from gpuslurm.hooks.log import HookLog
from gpuslurm.hw import source
from gpuslurm.hw.source import builtin_names, load_node
from gpuslurm.slurm.hooks import run_prolog, run_task_prolog, task_prolog_lines
from gpuslurm.state.job import node_devices
from gpuslurm.state.taskinfo import TaskInfo, read_task_info, task_device, tasks_dir, write_task_info

SRC = str(Path(__file__).resolve().parents[2] / "src")


def quiet(name: str) -> HookLog:
    return HookLog(name, stream=io.StringIO(), use_syslog=False)


def forbid_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVML boundary and the bundle reader both raise: nothing may read the node."""
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the task prolog read the node")

    monkeypatch.setattr(source, "_read_bundle", refuse)
    monkeypatch.setattr(source.HardwareSource, "node", refuse)


def prolog(site: HookSite, env: dict[str, str]) -> None:
    assert run_prolog(env, quiet("prolog")) == 0


def _xml_bundles() -> list[Path]:
    """Each real ``nvidia-smi -q -x`` capture alone as a bundle."""
    out = Path(tempfile.gettempdir()) / f"gpuslurm-real-xml-bundles-{os.getuid()}"
    bundles = []
    for xml in sorted((REAL / "nvidia-smi-q-x").glob("*.xml")):
        bundle = out / xml.stem
        bundle.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(xml, bundle / "nvidia-smi-q.xml")
        bundles.append(bundle)
    return bundles


BUNDLES = ([pytest.param(name, id=name) for name in builtin_names()]
           + [pytest.param(str(p), id=f"real-{p.name}") for p in REAL_BUNDLES + _xml_bundles()])


@pytest.mark.parametrize("bundle", BUNDLES)
def test_the_lines_are_those_read_from_the_node(bundle: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """For every device layout: the job's every device, then a step of its last two, by index
    and by UUID, for every task rank up to twice the devices: the task file gives the lines
    reading the node gave."""
    node = load_node(bundle, links=False)
    devices = node_devices(node) or tuple(())
    if not devices:
        pytest.skip("a node without devices")
    run_dir = str(tmp_path / "run")
    env = {"GPUSLURM_CAPTURE": bundle, "SLURM_JOB_ID": "77",
           "SLURM_JOB_GPUS": ",".join(str(d.gres_index) for d in devices)}
    claims = [{}, {"SLURM_STEP_GPUS": ",".join(str(d.gres_index) for d in devices[-2:])},
              {"CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in reversed(devices))}]
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{run_dir}"\n')
    env["GPUSLURM_CONFIG"] = str(config)
    ranks = range(2 * len(devices) + 1)
    before = {(i, r): task_prolog_lines({**env, **claim, "SLURM_LOCALID": str(r)})
              for i, claim in enumerate(claims) for r in ranks}
    assert before[0, 0]  # the old path gave hints
    write_task_info(run_dir, TaskInfo("77", os.getuid(), tuple(task_device(d) for d in devices)), os.getgid())
    forbid_the_node(monkeypatch)
    after = {(i, r): task_prolog_lines({**env, **claim, "SLURM_LOCALID": str(r)})
             for i, claim in enumerate(claims) for r in ranks}
    assert after == before


def test_the_prolog_writes_it_and_the_task_prolog_reads_only_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_site(tmp_path)
    env = site.environ("31", gpus="4,5", SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_GID="4321")
    expected = task_prolog_lines({**env, "SLURM_LOCALID": "1"})
    prolog(site, env)
    path = Path(tasks_dir(str(site.root / "run"))) / "31.task"
    st = path.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o400, 0, 0)  # root's job: no ACL
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    forbid_the_node(monkeypatch)
    out = io.StringIO()
    # and no bundle at all: a live node's task prolog would have opened NVML here
    assert run_task_prolog({**env, "SLURM_LOCALID": "1", "GPUSLURM_CAPTURE": str(tmp_path / "gone")},
                           out, quiet("task-prolog")) == 0
    assert out.getvalue().splitlines() == expected
    assert f"export GPUSLURM_GPU_UUID={site.uuids[5]}" in expected


def test_the_epilog_removes_it(tmp_path: Path) -> None:
    from gpuslurm.slurm.hooks import run_epilog

    site = make_site(tmp_path)
    env = site.environ("32", SLURM_JOB_UID=str(os.getuid()))
    prolog(site, env)
    path = Path(tasks_dir(str(site.root / "run"))) / "32.task"
    old = path.with_suffix(".json")  # version 1, from a prolog before the upgrade
    old.write_text("{}")
    assert path.exists()
    assert run_epilog(env, quiet("epilog")) == 0
    assert not path.exists() and not old.exists()


def test_a_job_started_before_the_task_file_reads_the_node(tmp_path: Path) -> None:
    """An older prolog wrote no task file: the task prolog falls back to reading the node."""
    site = make_site(tmp_path)
    env = site.environ("33", gpus="6", SLURM_JOB_UID=str(os.getuid()))
    lines = task_prolog_lines(env)
    assert f"export GPUSLURM_GPU_UUID={site.uuids[6]}" in lines


def test_a_step_naming_a_device_outside_its_job_gets_no_hints(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    env = site.environ("34", gpus="0,1", SLURM_JOB_UID=str(os.getuid()))
    prolog(site, env)
    err = io.StringIO()
    out = io.StringIO()
    forged = {**env, "SLURM_STEP_GPUS": "7"}  # edited into the task's environment
    assert run_task_prolog(forged, out, HookLog("task-prolog", stream=err, use_syslog=False)) == 0
    assert out.getvalue() == ""
    assert "GPU index 7 is not one of job 34's devices" in err.getvalue()
    forged = {**env, "CUDA_VISIBLE_DEVICES": site.uuids[7]}
    assert task_prolog_lines({**env, "SLURM_STEP_GPUS": "1"})  # its own step still gets them
    with pytest.raises(Exception, match="is not one of job 34's devices"):
        task_prolog_lines(forged)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A 0755 directory in /tmp that the user ``nobody`` can reach (pytest's are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="gpuslurm-taskfile-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


ATTACK = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from gpuslurm.state.taskinfo import read_task_info
run, mine, theirs = sys.argv[2], sys.argv[3], sys.argv[4]
tasks = os.path.join(run, "tasks")
done = []
for what, act in [
    ("write", lambda: open(os.path.join(tasks, mine + ".task"), "r+").write("{}")),
    ("replace", lambda: os.rename(os.path.join(tasks, mine + ".task"), os.path.join(tasks, "x"))),
    ("plant", lambda: open(os.path.join(tasks, "99.task"), "w")),
    ("chmod", lambda: os.chmod(os.path.join(tasks, mine + ".task"), 0o666)),
]:
    try:
        act()
        done.append(what)
    except OSError:
        pass
try:
    read_task_info(run, theirs, os.getuid())
    done.append("read theirs")
except Exception as exc:
    print("refused:", exc)
evil = sys.argv[5]  # a run_dir of nobody's own, as a GPUSLURM_CONFIG of theirs would name
os.makedirs(os.path.join(evil, "tasks"))
with open(os.path.join(evil, "tasks", mine + ".task"), "w") as fh:
    fh.write("gpuslurm-tasks 2\njob %s\nuid %d\ndevice GPU-forged 7 1 0 -\n" % (mine, os.getuid()))
try:
    read_task_info(evil, mine, os.getuid())
    done.append("read forged")
except Exception as exc:
    print("forged refused:", exc)
print("mine:", ",".join(d.uuid for d in read_task_info(run, mine, os.getuid()).devices))
print("done:", ",".join(done))
"""


def test_a_user_cannot_change_their_own_or_anothers_task_file(reachable: Path) -> None:
    """As ``nobody``, whose job 41 has GPU 0 and who shares the group of root's job 42 on GPU 7:
    nobody's writes, renames, plants and chmods all fail, job 42's file cannot be read, and so is a
    forged file for job 41 in a run directory of nobody's own."""
    node = load_node("dgx-h100", links=False)
    devices = node_devices(node)
    run = str(reachable / "run")
    os.mkdir(run, 0o755)
    write_task_info(run, TaskInfo("41", NOBODY, (task_device(devices[0]),)), 65534)
    write_task_info(run, TaskInfo("42", 0, (task_device(devices[7]),)), 65534)  # of nobody's group
    evil = reachable / "nobodys"
    evil.mkdir()
    os.chown(evil, NOBODY, 65534)
    done = subprocess.run(["/usr/bin/python3", "-I", "-c", ATTACK, SRC, run, "41", "42", str(evil)],
                          user=NOBODY, group=65534, extra_groups=[], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    assert f"mine: {devices[0].uuid}" in done.stdout
    assert "done: \n" in done.stdout
    assert "refused:" in done.stdout and "Permission denied" in done.stdout  # root's, 0400
    assert "forged refused:" in done.stdout and "directory owned by uid 65534, not root" in done.stdout
    assert read_task_info(run, "41", NOBODY) == TaskInfo("41", NOBODY, (task_device(devices[0]),))


def test_a_file_not_roots_or_linked_twice_is_refused(tmp_path: Path) -> None:
    from gpuslurm.safedir import UnsafePathError

    run = tmp_path / "run"
    run.mkdir()
    devices = node_devices(load_node("dgx-h100", links=False))
    write_task_info(str(run), TaskInfo("51", 0, (task_device(devices[1]),)), 0)
    path = run / "tasks" / "51.task"
    os.link(path, tmp_path / "copy.json")  # a second name where someone else could reach it
    with pytest.raises(UnsafePathError, match="2 links"):
        read_task_info(str(run), "51", 0)
    os.unlink(tmp_path / "copy.json")
    os.chown(path, NOBODY, -1)
    with pytest.raises(UnsafePathError, match="owned by uid 65534, not root"):
        read_task_info(str(run), "51", 0)
    os.chown(path, 0, -1)
    path.chmod(0o662)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        read_task_info(str(run), "51", 0)
    path.chmod(0o640)
    os.chown(path.parent, NOBODY, -1)
    with pytest.raises(UnsafePathError, match="owned by uid 65534"):
        read_task_info(str(run), "51", 0)


def test_the_task_prolog_with_a_task_file_parses_nothing(tmp_path: Path) -> None:
    """The installed entry point, as slurmd starts it per task: no config parse (tomllib), no
    node (the hardware source, the bundle's parsers, NVML), no typing, no config schema
    (``gpuslurm.config``, ~3 ms of CPU a start here), no ``collections`` (1.5-2 ms; the hooks'
    ``collections.abc`` names are for type checkers alone)."""
    site = make_site(tmp_path)
    env = site.environ("35", gpus="2", SLURM_JOB_UID=str(os.getuid()))
    prolog(site, env)
    code = ("import sys; from gpuslurm.slurm.entry import main; rc = main(); "
            "print(' '.join(sorted(sys.modules))); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, "task-prolog"], env={**env, "PYTHONPATH": SRC},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"export GPUSLURM_GPU_UUID={site.uuids[2]}" in lines
    loaded = set(lines[-1].split())
    for heavy in ("tomllib", "typing", "gpuslurm.hw.source", "gpuslurm.hw.replay.bundle",
                  "gpuslurm.hw.live.nvml", "pynvml", "xml.etree.ElementTree", "json", "re", "enum",
                  "collections", "gpuslurm.config"):
        assert heavy not in loaded, heavy


GROUP_READ = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from gpuslurm.state.taskinfo import read_task_info
try:
    with open(os.path.join(sys.argv[2], "tasks", sys.argv[3] + ".task")) as fh:
        print("read:", fh.read())
except OSError as exc:
    print("open refused:", exc.strerror)
try:
    print("read:", read_task_info(sys.argv[2], sys.argv[3], None))
except Exception as exc:
    print("reader refused:", exc)
"""


def test_another_member_of_the_jobs_group_cannot_read_its_task_file(reachable: Path) -> None:
    """The task file names the job's devices and their CPUs. It was 0640 to the job's primary
    group, so every other member of that group read it. Now it is root's 0400 with read for the
    job's uid alone (a POSIX ACL): ``nobody`` (group nogroup) cannot read the file of a job of
    uid 12345 in group nogroup, and the job's own uid can."""
    from gpuslurm.safedir import ACL_GROUP_OBJ, ACL_OTHER, ACL_USER, ACL_XATTR, acl_entries

    devices = node_devices(load_node("dgx-h100", links=False))
    run = str(reachable / "run")
    os.mkdir(run, 0o755)
    owner = 12345
    path = write_task_info(run, TaskInfo("43", owner, (task_device(devices[3]),)), 65534)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (0, 0)
    entries = {(tag, ident): perm for tag, perm, ident in acl_entries(os.getxattr(path, ACL_XATTR))}
    assert entries[(ACL_USER, owner)] == 0o4
    assert [perm for (tag, _), perm in entries.items() if tag in (ACL_GROUP_OBJ, ACL_OTHER)] == [0, 0]
    assert [ident for (tag, ident) in entries if tag == ACL_USER] == [owner]  # no one else named
    as_member = subprocess.run(["/usr/bin/python3", "-I", "-c", GROUP_READ, SRC, run, "43"], user=NOBODY,
                               group=65534, extra_groups=[], capture_output=True, text=True, timeout=60,
                               check=False, cwd="/")
    assert "open refused: Permission denied" in as_member.stdout, as_member.stdout + as_member.stderr
    assert "reader refused:" in as_member.stdout and devices[3].uuid not in as_member.stdout
    as_owner = subprocess.run(["/usr/bin/python3", "-I", "-c", GROUP_READ, SRC, run, "43"], user=owner,
                              group=65534, extra_groups=[], capture_output=True, text=True, timeout=60,
                              check=False, cwd="/")
    assert as_owner.stdout.count(devices[3].uuid) == 2, as_owner.stdout + as_owner.stderr

