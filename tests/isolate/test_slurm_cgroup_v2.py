"""Slurm's cgroup/v2 job directories, found not guessed (gpuslurm.slurm.cgroup_v2), and gpuslurm's
own v2 isolation attached to the one Slurm uses: 26.05's ``s<SLUID>`` or ``job_<id>``.

Issue 19: on 26.05 the prolog attached its program to a ``job_<id>`` it made, which stayed empty
while the job ran in ``s<SLUID>``: every job opened every GPU and the prolog said it succeeded.
The real-cgroup tests make Slurm's layout on this host's cgroup2 mount (a slice of their own,
``CgroupSlice``) and open fake GPU device files as ``nobody`` from where Slurm puts a task.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.cgroup_helpers import (
    NOBODY,
    PROBE,
    SYSTEM_PYTHON,
    UNIFIED,
    make_gpu_files,
    parse_probe,
    v2_unavailable,
)

from gpuslurm.errors import HardwareError, InputError
from gpuslurm.hooks.log import HookLog
from gpuslurm.hw.source import BUILTIN_DIR
from gpuslurm.isolate import bpf
from gpuslurm.slurm.cgroup_v2 import (
    SlurmCgroupConf,
    find_job_cgroup,
    parse_cgroup_conf,
)
from gpuslurm.slurm.hooks import run_epilog, run_prolog

SLUID = "s6Z5M8CB6N7P00"


# --- cgroup.conf ------------------------------------------------------------------------------


def test_cgroup_conf_keys() -> None:
    conf = parse_cgroup_conf("# Debian\nCgroupPlugin=cgroup/v2\ncgroupslice = gpu.slice  # ours\n"
                             "CgroupJobIdPaths=YES\nConstrainDevices=no\nConstrainDevices=yes\n")
    assert conf == SlurmCgroupConf("cgroup/v2", "gpu.slice", True, True)
    assert parse_cgroup_conf(None) == SlurmCgroupConf() == parse_cgroup_conf("")
    assert SlurmCgroupConf().slice == "system.slice" and not SlurmCgroupConf().job_id_paths


@pytest.mark.parametrize("text", ["CgroupSlice=user.slice", "CgroupSlice=a/b.slice", "CgroupSlice=..",
                                  "CgroupSlice=user-1000.slice", "CgroupSlice=", "CgroupJobIdPaths=maybe",
                                  "CgroupSlice=.hidden"])
def test_cgroup_conf_values_slurm_or_gpuslurm_refuses(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_cgroup_conf(text, "/etc/slurm/cgroup.conf")
    assert "\n" not in str(info.value) and "cgroup.conf:1" in str(info.value)


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_cgroup_conf_hostile_text_is_a_value_or_one_line(text: str) -> None:
    try:
        conf = parse_cgroup_conf(text)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert "/" not in conf.slice and conf.slice not in ("", ".", "..", "user.slice")


@settings(max_examples=200)
@given(st.sampled_from(["system.slice", "gpu.slice", "slurm"]), st.booleans(),
       st.sampled_from([SLUID, None]), st.sets(st.sampled_from(["n1_slurmstepd.scope", "slurmstepd.scope"]),
                                             min_size=1),
       st.sampled_from([None, SLUID, "job_9"]))
def test_every_place_slurm_may_use_is_given_until_it_made_one(slice_: str, id_paths: bool, sluid: str | None,
                                                              scopes: set[str], made: str | None) -> None:
    """Property: an ``s<SLUID>`` of the job's that exists is given alone (Slurm made it), as is a
    ``job_<id>`` for a job without a SLUID; else every name the job may have in every scope that
    exists, whatever cgroup.conf says (slurmd may have read another), and nothing else."""
    if os.geteuid() != 0:
        pytest.skip("Slurm's directories are root's: the finder takes only those")
    root = Path(f"/tmp/gpuslurm-v2find-{os.getpid()}")
    for scope in scopes:
        (root / slice_ / scope).mkdir(parents=True, exist_ok=True)
    first = root / slice_ / sorted(scopes)[0]
    if made is not None:
        (first / made).mkdir()
    try:
        conf = SlurmCgroupConf(slice=slice_, job_id_paths=id_paths)
        found = find_job_cgroup(str(root), conf, "n1", "9", sluid)
        if made is not None and (made == sluid or (sluid is None and made == "job_9")):
            assert found == ((str(first / made),), True)
        else:
            names = ([sluid] if sluid else []) + ["job_9"]
            assert sorted(found.paths) == sorted(str(root / slice_ / s / n) for s in scopes for n in names)
            assert not found.exists
    finally:
        shutil.rmtree(root)


# --- the finder on directory trees ------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("Slurm's directories are root's: the finder takes only those")
    return tmp_path


@pytest.mark.parametrize("scope", ["node1_slurmstepd.scope", "slurmstepd.scope"])
def test_the_scope_is_found_with_or_without_the_node_prefix(tree: Path, scope: str) -> None:
    (tree / "system.slice" / scope).mkdir(parents=True)
    found = find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", None)
    assert found == ((str(tree / "system.slice" / scope / "job_42"),), False)


def test_no_scope_fails_closed_naming_every_path_looked_for(tree: Path) -> None:
    (tree / "system.slice" / "other_slurmstepd.scope").mkdir(parents=True)  # another node's
    with pytest.raises(HardwareError) as info:
        find_job_cgroup(str(tree), SlurmCgroupConf(slice="gpu.slice"), "node1", "42", SLUID)
    text = str(info.value)
    assert f"{tree}/gpu.slice/node1_slurmstepd.scope" in text and f"{tree}/gpu.slice/slurmstepd.scope" in text
    assert "\n" not in text


def test_cgroup_slice_is_where_the_scope_is_looked_for(tree: Path) -> None:
    (tree / "system.slice" / "node1_slurmstepd.scope").mkdir(parents=True)
    (tree / "gpu.slice" / "node1_slurmstepd.scope").mkdir(parents=True)
    conf = parse_cgroup_conf("CgroupSlice=gpu.slice")
    found = find_job_cgroup(str(tree), conf, "node1", "42", None)
    assert found.paths == (str(tree / "gpu.slice" / "node1_slurmstepd.scope" / "job_42"),)


@pytest.mark.parametrize(("existing", "sluid"), [(SLUID, SLUID), ("job_42", None)])
def test_the_directory_slurm_made_already_is_used(tree: Path, existing: str, sluid: str | None) -> None:
    """``PrologFlags=Contain``: the extern step is there before the prolog, in either layout (both
    on one node after an upgrade with jobs running)."""
    scope = tree / "system.slice" / "node1_slurmstepd.scope"
    (scope / existing / "step_extern").mkdir(parents=True)
    (scope / "job_41").mkdir()  # another job of the old layout beside it
    found = find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", sluid)
    assert found == ((str(scope / existing),), True)


@pytest.mark.parametrize("conf_text", ["CgroupJobIdPaths=yes\n", ""])
def test_a_job_id_directory_of_a_job_with_a_sluid_proves_nothing(tree: Path, conf_text: str) -> None:
    """A ``job_<id>`` may be an earlier job's of that id, and cgroup.conf may not be slurmd's: both
    names are given."""
    scope = tree / "system.slice" / "slurmstepd.scope"
    (scope / "job_42").mkdir(parents=True)
    found = find_job_cgroup(str(tree), parse_cgroup_conf(conf_text), "node1", "42", SLUID)
    assert found == ((str(scope / SLUID), str(scope / "job_42")), False)


def test_an_explicit_v2_job_parent_overrides_the_search(tree: Path) -> None:
    (tree / "custom" / "scope").mkdir(parents=True)
    found = find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", SLUID, "custom/scope")
    assert found.paths == (str(tree / "custom" / "scope" / SLUID), str(tree / "custom" / "scope" / "job_42"))
    with pytest.raises(HardwareError, match="custom/none"):
        find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", None, "custom/none")
    for bad in ("/abs", "a/../b"):
        with pytest.raises(InputError):
            find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", None, bad)


@pytest.mark.parametrize(("job_id", "sluid"), [("4a", None), ("../1", None), ("1", "s6Z5M8CB6N7P0O"),
                                               ("1", "../../x"), ("1_2", None)])
def test_only_slurms_names_become_paths(tree: Path, job_id: str, sluid: str | None) -> None:
    (tree / "system.slice" / "slurmstepd.scope").mkdir(parents=True)
    with pytest.raises(InputError):
        find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", job_id, sluid)


def test_a_job_directory_not_roots_is_refused(tree: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    scope = tree / "system.slice" / "slurmstepd.scope"
    (scope / SLUID).mkdir(parents=True)
    os.chown(scope / SLUID, NOBODY, -1)
    with pytest.raises(HardwareError, match="not a cgroup directory of root's"):
        find_job_cgroup(str(tree), SlurmCgroupConf(), "node1", "42", SLUID)


# --- real cgroup2: the prolog attaches to Slurm's own directory ---------------------------------

_REASON = v2_unavailable("cgroup v2 isolation tests")
needs_v2 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
JOB = "8642"
NODE = "node1"


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.slice = UNIFIED_PATH / f"gpuslurm-test-{os.getpid()}.slice"
        self.scope = self.slice / f"{NODE}_slurmstepd.scope"


UNIFIED_PATH = Path(UNIFIED)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Layout, dict[str, str]]]:
    layout = Layout(tmp_path)
    layout.scope.mkdir(parents=True)
    bundle = tmp_path / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    scontrol.chmod(0o755)
    conf = tmp_path / "cgroup.conf"
    conf.write_text(f"CgroupPlugin=cgroup/v2\nConstrainDevices=no\nCgroupSlice={layout.slice.name}\n")
    config = tmp_path / "gpuslurm.toml"
    config.write_text("[paths]\n"
                      f'run_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'scontrol = "{scontrol}"\ncgroup_root = "{UNIFIED}"\n'
                      f'slurm_cgroup_conf = "{conf}"\n'
                      "[hooks]\ncommand_timeout_s = 5\n[epilog]\nkill_grace_s = 0.5\n"
                      '[cgroup]\ndevices = "auto"\n')
    env = {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": str(bundle), "SLURM_JOB_ID": JOB,
           "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_USER": "nobody", "SLURM_JOB_GID": "65534",
           "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_SLUID": SLUID}
    try:
        yield layout, env
    finally:
        dirs = sorted((p for p in layout.slice.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for path in [*dirs, layout.slice]:
            for pid in (path / "cgroup.procs").read_text().split():
                os.kill(int(pid), 9)
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    subprocess.run(["/bin/sleep", "0.02"], check=True)


def _quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


def _programs(path: Path) -> tuple[int, ...]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpf.attached_program_ids(fd)
    finally:
        os.close(fd)


def _probe_as_nobody(cgroup: Path, minors: range = range(8)) -> dict[str, str]:
    """Fake GPU files opened by nobody from ``cgroup`` (root moves the shell in, as slurmstepd
    moves a task): ENXIO let through, EPERM refused."""
    for gpu_dir in make_gpu_files(minors):
        script = f'echo $$ > {cgroup}/cgroup.procs && exec setpriv --reuid={NOBODY} --regid=65534 ' \
                 f'--clear-groups {SYSTEM_PYTHON} -c "$0" "$@"'
        out = subprocess.run(["/bin/sh", "-c", script, PROBE, *(str(gpu_dir / f"nvidia{m}") for m in minors)],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return parse_probe(out)
    raise AssertionError("unreachable")


@needs_v2
def test_on_the_sluid_layout_the_prolog_limits_the_directory_the_job_runs_in(
        site: tuple[Layout, dict[str, str]]) -> None:
    """26.05 with ``PrologFlags=Contain``: ``s<SLUID>`` exists with its extern step; the prolog
    attaches there (not to a ``job_<id>`` of its own), and a task of the job in
    ``s<SLUID>/step_0/user/task_0`` opens its GPUs 2 and 3 only. The epilog leaves Slurm's
    directory to Slurm while it is in use."""
    layout, env = site
    job_dir = layout.scope / SLUID
    (job_dir / "step_extern").mkdir(parents=True)
    log = _quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines
    assert not (layout.scope / f"job_{JOB}").exists()
    assert len(_programs(job_dir)) == 1
    task = job_dir / "step_0" / "user" / "task_0"
    task.mkdir(parents=True)
    assert _probe_as_nobody(task) == {f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM" for m in range(8)}
    assert any(str(job_dir) in line for line in log.lines)


@needs_v2
def test_without_contain_the_prolog_makes_the_directory_slurm_will_use(
        site: tuple[Layout, dict[str, str]]) -> None:
    """No job directory yet: the prolog makes ``s<SLUID>`` and ``job_<id>`` (slurmstepd will make
    its steps in one of them), each with the program before any task is there; a job without a
    SLUID (before 25.11) gets ``job_<id>`` alone."""
    layout, env = site
    log = _quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines
    job_dir = layout.scope / SLUID
    assert len(_programs(job_dir)) == 1 and len(_programs(layout.scope / f"job_{JOB}")) == 1
    job_dir.rmdir()
    (layout.scope / f"job_{JOB}").rmdir()
    assert run_prolog({k: v for k, v in env.items() if k != "SLURM_JOB_SLUID"}, _quiet("prolog")) == 0
    assert len(_programs(layout.scope / f"job_{JOB}")) == 1 and not job_dir.exists()


@needs_v2
def test_no_scope_fails_the_prolog_closed(site: tuple[Layout, dict[str, str]]) -> None:
    layout, env = site
    layout.scope.rmdir()
    log = _quiet("prolog")
    assert run_prolog(env, log) != 0
    text = "\n".join(log.lines)
    assert f"{layout.slice}/{NODE}_slurmstepd.scope" in text and f"{layout.slice}/slurmstepd.scope" in text


@needs_v2
def test_a_bad_sluid_from_slurmd_fails_the_prolog_with_exit_2(site: tuple[Layout, dict[str, str]]) -> None:
    _, env = site
    log = _quiet("prolog")
    assert run_prolog({**env, "SLURM_JOB_SLUID": "s../../../x"}, log) == 2
    assert any("SLURM_JOB_SLUID" in line for line in log.lines)


@needs_v2
def test_a_task_cannot_escape_the_job_program_through_a_child_cgroup(
        site: tuple[Layout, dict[str, str]]) -> None:
    """The attacker's account. Slurm makes the job's directories root's (nothing is delegated);
    even if a site delegated the step to the user, nobody making a child cgroup and moving into
    it, and root (as Slurm's ConstrainDevices does per step) attaching an allow-all program with
    BPF_F_ALLOW_OVERRIDE below, leaves gpuslurm's job-level denial in force: it is attached with
    BPF_F_ALLOW_MULTI, which the kernel runs for every descendant."""
    layout, env = site
    job_dir = layout.scope / SLUID
    (job_dir / "step_extern").mkdir(parents=True)
    assert run_prolog(env, _quiet("prolog")) == 0
    step_user = job_dir / "step_0" / "user"
    step_user.mkdir(parents=True)
    # root's below: nobody cannot make a cgroup there (Slurm's own layout)
    made = subprocess.run(["setpriv", f"--reuid={NOBODY}", "--regid=65534", "--clear-groups",
                           "/bin/mkdir", str(step_user / "escape")], capture_output=True, timeout=30)
    assert made.returncode != 0 and not (step_user / "escape").exists()
    # the worst case: the step handed to nobody, who makes a child and moves into it
    os.chown(step_user, NOBODY, 65534)
    os.chown(step_user / "cgroup.procs", NOBODY, 65534)
    os.chown(step_user / "cgroup.subtree_control", NOBODY, 65534)
    escape = step_user / "escape"
    subprocess.run(["setpriv", f"--reuid={NOBODY}", "--regid=65534", "--clear-groups", "/bin/mkdir",
                    str(escape)], check=True, timeout=30)
    allow_all = bpf.load_device_program(bpf.deny_program([]))
    fd = os.open(escape, os.O_RDONLY | os.O_DIRECTORY)
    try:  # as Slurm attaches at a non-leaf step level
        from gpuslurm.isolate.bpf import BPF_CGROUP_DEVICE, _AttachAttr, _bpf

        _bpf(8, _AttachAttr(target_fd=fd, attach_bpf_fd=allow_all, attach_type=BPF_CGROUP_DEVICE,
                            attach_flags=1), "attaching an allow-all program below")  # BPF_F_ALLOW_OVERRIDE
    finally:
        os.close(fd)
        os.close(allow_all)
    move = f"import os\nopen('{escape}/cgroup.procs', 'w').write(str(os.getpid()))\n"
    for gpu_dir in make_gpu_files(range(8)):
        script = (f'echo $$ > {step_user}/cgroup.procs && exec setpriv --reuid={NOBODY} --regid=65534 '
                  f'--clear-groups {SYSTEM_PYTHON} -c "$0" "$@"')
        files = [str(gpu_dir / f"nvidia{m}") for m in range(8)]
        out = subprocess.run(["/bin/sh", "-c", script, move + PROBE, *files], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        assert parse_probe(out.stdout) == {f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM"
                                           for m in range(8)}
    assert (escape / "cgroup.procs").read_text() == ""  # it had moved there, and exited


@needs_v2
def test_the_epilog_finds_the_sluid_directory_too(site: tuple[Layout, dict[str, str]]) -> None:
    """An empty ``s<SLUID>`` left when the epilog runs (Slurm removes its own otherwise) goes with
    the epilog; slurmd -V is not asked by the epilog."""
    layout, env = site
    assert run_prolog(env, _quiet("prolog")) == 0
    job_dir = layout.scope / SLUID
    assert job_dir.is_dir()
    log = _quiet("epilog")
    assert run_epilog(env, log) == 0, log.lines
    assert not job_dir.exists()


@needs_v2
@pytest.mark.parametrize(("slurm_uses", "stale_scope"), [
    (f"job_{JOB}", False),  # slurmd -V said 26.05 (upgraded on disk), 25.11's slurmd still running
    (SLUID, False),  # slurmd -V said 25.11 (rolled back on disk), 26.05's slurmd still running
    (SLUID, True),  # <node>_slurmstepd.scope left by another build, slurmstepd.scope in use
])
def test_without_contain_no_guess_leaves_the_job_open(site: tuple[Layout, dict[str, str]], slurm_uses: str,
                                                      stale_scope: bool) -> None:
    """The attacker's account: without ``PrologFlags=Contain`` the prolog runs before Slurm makes
    the job's directory, so which name and which scope slurmstepd will use is not on disk. The
    slurmd on disk is not the one running (between ``dnf upgrade`` and a restart), or a scope of
    an earlier build is still there: a guess attached the program to a directory the job never
    ran in, and nobody's task, where Slurm put it, opened every GPU (the guess was ``slurmd -V``
    and the first scope found). Every place Slurm may use gets the program, and the epilog removes
    the ones left empty."""
    layout, env = site
    scope = layout.scope
    if stale_scope:
        scope = layout.slice / "slurmstepd.scope"  # the live one; the stale one is layout.scope
        scope.mkdir()
    log = _quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines
    task = scope / slurm_uses / "step_0" / "user" / "task_0"
    task.mkdir(parents=True)
    assert _probe_as_nobody(task) == {f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM" for m in range(8)}
    for path in (task, task.parent, task.parent.parent):
        path.rmdir()  # slurmstepd removes its steps; the job's directory is the epilog's
    elog = _quiet("epilog")
    assert run_epilog(env, elog) == 0, elog.lines
    assert not [d for s in (layout.scope, scope) for d in s.iterdir() if d.is_dir()], elog.lines
