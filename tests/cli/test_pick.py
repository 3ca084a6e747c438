"""``gpuslurm pick``: in-process for formats and errors, as a real process for -- CMD, --wait and Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.pick_helpers import GPUSLURM, JOB_VARS, scenario, uuids

from gpuslurm.cli.pick_cmd import (
    EXIT_UNSATISFIED,
    EXIT_WAIT_TIMEOUT,
    HelpRequested,
    main,
    parse_args,
)
from gpuslurm.errors import InputError
from gpuslurm.hw.source import builtin_names, load_node
from gpuslurm.ranges import format_ranges
from gpuslurm.watch.pick import cache_dir

DATA = Path(__file__).resolve().parents[1] / "place" / "data"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in JOB_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # not the tester's own


def test_cache_dir_rule() -> None:
    assert cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == "/c/gpuslurm"
    assert cache_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == "/h/.cache/gpuslurm"  # XDG: absolute only
    assert cache_dir({"HOME": "/h"}) == "/h/.cache/gpuslurm"
    assert cache_dir({"HOME": ""}) is None and cache_dir({}) is None


def test_pick_keeps_the_parsed_bundle_in_the_callers_cache(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    first = pick(capsys, "4", "--from", "dgx-h100", "--format", "json")
    cache = tmp_path / "xdg-cache" / "gpuslurm"
    assert cache.stat().st_mode & 0o777 == 0o700
    assert (cache / "bundle-node.json").stat().st_mode & 0o777 == 0o600
    assert pick(capsys, "4", "--from", "dgx-h100", "--format", "json") == first


def pick(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_env_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = pick(capsys, "2", "--from", "l40s-4x")
    u = uuids("l40s-4x")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["export CUDA_DEVICE_ORDER=PCI_BUS_ID",
                                f"export CUDA_VISIBLE_DEVICES={u[0]},{u[1]}",
                                "export GPUSLURM_CPUS=" + ",".join(str(c) for c in range(0, 128, 2))]


def test_json_format_node_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = pick(capsys, "2", "--from", "l40s-4x", "--format", "json")
    doc = json.loads(out)
    assert code == 0
    assert [(g["index"], g["minor"], g["numa_node"]) for g in doc["gpus"]] == [(0, 2, 0), (1, 3, 0)]
    assert doc["weakest_link"] == "PIX" and doc["numa_nodes"] == [0]
    assert doc["score"] == 2.0 and doc["cpus"].startswith("0,2,4")
    _, out, _ = pick(capsys, "1", "--from", "dgx-h100", "--format", "json")
    assert json.loads(out)["weakest_link"] is None


def test_explain_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = pick(capsys, "2", "--from", str(DATA / "nvl-pairs-4x"), "--format", "explain")
    assert code == 0
    assert out.splitlines()[0].startswith("picked {GPU 0, GPU 1}: weakest link NV4")
    assert "runner-up {GPU 0, GPU 2} lost on weaker weakest link (PXB vs NV4)" in out


def test_mig_one_export_per_line_a_block_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    # as whole GPUs: one export per line (it printed both of a rank's on one line); rank k's
    # block is lines 2k + 2 and 2k + 3
    code, out, err = pick(capsys, "2", "--from", "a100-mig", "--mig", "1g.10gb")
    lines = out.splitlines()
    assert (code, err) == (0, "") and len(lines) == 5 and lines[0] == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"
    assert all(line.startswith("export CUDA_VISIBLE_DEVICES=MIG-") for line in lines[1::2])
    assert all(line.startswith("export GPUSLURM_CPUS=") and len(line) > 21 for line in lines[2::2])
    assert all(line.count("export ") == 1 and " " not in line.split("=", 1)[1] for line in lines)
    code, one, _ = pick(capsys, "1", "--from", "a100-mig", "--mig", "1g.10gb")
    assert one.splitlines() == lines[:3]  # N = 1: the same three lines as one whole GPU


UNCONFINED = pytest.mark.skipif(len(os.sched_getaffinity(0)) < (os.cpu_count() or 0),
                                reason="confined (taskset/cpuset): pick prints the allowed CPUs instead")


def _real_bundle(real_fixtures: Path, tmp_path: Path, xml: str) -> str:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text((real_fixtures / "nvidia-smi-q-x" / xml).read_text())
    return str(bundle)


@UNCONFINED
def test_no_cpu_list_unsets_gpuslurm_cpus_with_a_note(capsys: pytest.CaptureFixture[str],
                                                       real_fixtures: Path, tmp_path: Path) -> None:
    # the real dual A5000's XML has no CPU affinity: `export GPUSLURM_CPUS=` made
    # `taskset -c $GPUSLURM_CPUS` fail, and kept no earlier value from being used
    code, out, err = pick(capsys, "1", "--from", _real_bundle(real_fixtures, tmp_path, "dual_a5000-v13.xml"))
    assert code == 0
    assert out.splitlines() == ["export CUDA_DEVICE_ORDER=PCI_BUS_ID",
                                "export CUDA_VISIBLE_DEVICES=GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
                                "unset GPUSLURM_CPUS"]
    assert err.count("\n") == 1 and "GPUSLURM_CPUS is unset" in err
    shell = subprocess.run(["/bin/sh", "-c", 'GPUSLURM_CPUS=0-3; eval "$1"; echo "[${GPUSLURM_CPUS-unset}]"',
                            "sh", out], capture_output=True, text=True, timeout=30)
    assert shell.stdout == "[unset]\n", shell.stderr


@UNCONFINED
def test_mig_without_a_cpu_list_keeps_each_ranks_block(capsys: pytest.CaptureFixture[str],
                                                      real_fixtures: Path, tmp_path: Path) -> None:
    from gpuslurm.hw.replay.importer import import_multi_capture

    bundle = tmp_path / "h200"
    import_multi_capture(real_fixtures / "multi" / "h200-mig__590.48.01.txt", bundle)
    (bundle / "nvidia-smi-topo.txt").unlink()  # the text -q and -L: no CPU affinity
    code, out, err = pick(capsys, "2", "--from", str(bundle), "--mig", "1g.18gb")
    assert code == 0 and out.splitlines() == [
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "export CUDA_VISIBLE_DEVICES=MIG-00000003-0000-0000-0000-000000000003", "unset GPUSLURM_CPUS",
        "export CUDA_VISIBLE_DEVICES=MIG-00000004-0000-0000-0000-000000000004", "unset GPUSLURM_CPUS"]
    assert err.count("\n") == 1 and "GPUSLURM_CPUS is unset" in err


def test_scenario_load_and_exclusive(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    u = uuids("l40s-4x")
    monkeypatch.setenv("GPUSLURM_SCENARIO", scenario(tmp_path, {
        "gpus": {u[0]: {"util": 95, "mem_mib": 40000}},
        "procs": [{"pid": 999999, "gpu": u[0], "mem_mib": 40000}]}))
    code, out, _ = pick(capsys, "2", "--from", "l40s-4x", "--exclusive", "--format", "explain")
    assert code == 0 and out.startswith("picked {GPU 2, GPU 3}")
    assert f"excluded GPU 0 ({u[0]}): --exclusive: 1 process of others" in out
    code, out, err = pick(capsys, "4", "--from", "l40s-4x", "--mem", "10GiB")
    assert code == EXIT_UNSATISFIED and out == ""
    assert err.count("\n") == 1 and "--mem excludes GPU 0 (5.9 GiB free)" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["2", "--from", "a100-mig", "--mig", "9g.99gb"], "no MIG device of profile '9g.99gb'"),
    (["2", "--from", "a100-mig", "--mig", "big"], "not a MIG profile"),
    (["1", "--from", "dgx-h100", "--mem", "6Gx"], "--mem: not a size"),
    (["1", "--from", "dgx-h100", "--min-cc", "nine"], "--min-cc: not a compute capability"),
    (["9", "--from", "dgx-h100"], "9 GPUs wanted but dgx-h100-01 has 8"),
    (["0", "--from", "dgx-h100"], "at least 1"),
    (["1", "--from", "dgx-h100", "--format", "xml"], "--format"),
    (["1", "--from", "dgx-h100", "--bogus"], "no such option"),
    (["1", "--from", "dgx-h100", "--timeout", "5s"], "need --wait"),
    (["1", "--from", "dgx-h100", "--wait", "--poll", "0"], "--poll"),
    (["2", "--from", "a100-mig", "--mig", "1g.10gb", "--", "true"], "N = 1"),
    (["1", "--from", "nosuchbundle"], "nosuchbundle"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                      needle: str) -> None:
    code, out, err = pick(capsys, *args)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and needle in err, err


def test_malformed_scenario_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_SCENARIO", scenario(tmp_path, {"gpus": {"GPU-nope": {"util": 5}}}))
    code, _, err = pick(capsys, "1", "--from", "dgx-h100")
    assert code == 2 and err.count("\n") == 1 and "unknown GPU 'GPU-nope'" in err


def test_inside_a_job_only_its_gpus(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = str(DATA / "nvl-pairs-4x")
    u = [g.uuid for g in load_node(bundle).gpus]
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_GPUS", "1,2")
    code, out, _ = pick(capsys, "2", "--from", bundle, "--format", "json")
    assert code == 0 and [g["uuid"] for g in json.loads(out)["gpus"]] == [u[1], u[2]]
    code, _, err = pick(capsys, "3", "--from", bundle)
    assert code == 2 and "3 GPUs wanted but the job holds 2" in err
    monkeypatch.setenv("GPUSLURM_GPU_UUIDS", f"{u[3]}")  # the task prolog's record wins
    code, out, _ = pick(capsys, "1", "--from", bundle, "--format", "json")
    assert [g["uuid"] for g in json.loads(out)["gpus"]] == [u[3]]


def test_job_without_gpus_has_no_candidates(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    code, _, err = pick(capsys, "1", "--from", "dgx-h100")
    assert code == 2 and "the job holds 0" in err


def test_inside_a_pbs_job_only_the_gpus_its_launch_hook_named(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """PBS assigns no physical GPU; gpuslurm's execjob_launch names the job's in GPUSLURM_GPU_UUIDS
    (their device files are all the job can open where gpuslurm isolates)."""
    bundle = str(DATA / "nvl-pairs-4x")
    u = [g.uuid for g in load_node(bundle).gpus]
    monkeypatch.setenv("PBS_JOBID", "12.pbshost")
    code, _, err = pick(capsys, "1", "--from", bundle)  # no GPUs named: the job has none here
    assert code == 2 and "the job holds 0" in err
    monkeypatch.setenv("GPUSLURM_GPU_UUIDS", f"{u[0]},{u[3]}")
    code, out, _ = pick(capsys, "1", "--from", bundle, "--format", "json")
    [chosen] = json.loads(out)["gpus"]
    assert code == 0 and chosen["uuid"] in (u[0], u[3])
    code, _, err = pick(capsys, "3", "--from", bundle)
    assert code == 2 and "3 GPUs wanted but the job holds 2" in err


def run_pick(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (),
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    return subprocess.run([*prefix, *GPUSLURM, *args], capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {})})


SHOW = ["sh", "-c",
        'echo "$CUDA_VISIBLE_DEVICES"; echo "$GPUSLURM_CPUS"; grep Cpus_allowed_list /proc/self/status']


def allowed_list(text: str) -> str:
    return text.split("Cpus_allowed_list:", 1)[1].strip()


def test_command_gets_gpus_and_local_cpus() -> None:
    u = uuids("l40s-4x")
    cpus = sorted(os.sched_getaffinity(0))
    proc = run_pick("1", "--from", "l40s-4x", "--", *SHOW)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == u[0]
    even = [c for c in cpus if c % 2 == 0]  # GPU 0's local CPUs are the even ones
    assert allowed_list(proc.stdout) == format_ranges(even) == lines[1]  # narrowed, never widened


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs")
def test_command_never_widens_affinity() -> None:
    odd = next(c for c in sorted(os.sched_getaffinity(0)) if c % 2 == 1)
    # GPU 0 (l40s-4x) is local to the even CPUs: with only an odd CPU allowed the intersection is
    # empty, so the allowed CPU is kept (not widened to the GPU's) and stderr says so.
    proc = run_pick("1", "--from", "l40s-4x", "--", *SHOW, prefix=("taskset", "-c", str(odd)))
    assert proc.returncode == 0, proc.stderr
    assert allowed_list(proc.stdout) == str(odd)
    assert proc.stderr.count("\n") == 1 and f"keeping the allowed CPUs {odd}" in proc.stderr
    even = next(c for c in sorted(os.sched_getaffinity(0)) if c % 2 == 0)
    proc = run_pick("1", "--from", "l40s-4x", "--", *SHOW,
                    prefix=("taskset", "-c", f"{min(even, odd)},{max(even, odd)}"))
    assert allowed_list(proc.stdout) == str(even) and proc.stderr == ""


def test_wait_times_out_with_its_own_code(tmp_path: Path) -> None:
    u = uuids("l40s-4x")
    env = {"GPUSLURM_SCENARIO": scenario(tmp_path, {"gpus": {x: {"util": 90} for x in u}})}
    proc = run_pick("1", "--from", "l40s-4x", "--wait", "--timeout", "0.6s", "--poll", "0.2s", env=env)
    assert proc.returncode == EXIT_WAIT_TIMEOUT and proc.stdout == ""
    progress = [line for line in proc.stderr.splitlines() if "waiting" in line]
    assert progress and "--max-util excludes GPU 0 (90 % busy)" in progress[0]
    assert proc.stderr.splitlines()[-1].startswith("gpuslurm pick: gave up after 0.6s")


def test_wait_returns_when_a_gpu_frees(tmp_path: Path) -> None:
    u = uuids("l40s-4x")
    env = {"GPUSLURM_SCENARIO": scenario(tmp_path, {"start": time.time(), "steps": [
        {"at": 0, "procs": [{"pid": 999999, "gpu": x} for x in u]},
        {"at": 1.0, "procs": [{"pid": 999999, "gpu": x} for x in u[1:]]}]})}
    proc = run_pick("1", "--from", "l40s-4x", "--wait", "--timeout", "20s", "--poll", "0.3s", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA_VISIBLE_DEVICES={u[0]}" in proc.stdout and "waiting" in proc.stderr


def test_ctrl_c_while_waiting_exits_cleanly(tmp_path: Path) -> None:
    u = uuids("l40s-4x")
    env = {**{k: v for k, v in os.environ.items() if k not in JOB_VARS},
           "GPUSLURM_SCENARIO": scenario(tmp_path, {"procs": [{"pid": 999999, "gpu": x} for x in u]})}
    child = subprocess.Popen([*GPUSLURM, "1", "--from", "l40s-4x", "--wait", "--poll", "0.2s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert child.stderr is not None
    child.stderr.readline()  # the first progress line: it is waiting
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 130 and out == ""
    assert err.strip().splitlines()[-1] == "gpuslurm pick: interrupted" and "Traceback" not in err


def test_load_window_from_the_monitor_store(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuslurm.samples import Cycle, GpuSample
    from gpuslurm.state.store import Store

    u = uuids("l40s-4x")
    db = tmp_path / "monitor.db"
    now = time.time()
    with Store.open(str(db)) as store:  # GPU 0 and 1 were busy over the last minute, idle now
        for ts in (now - 40, now - 20):
            gpus = tuple(GpuSample(ts, x, None, 90.0 if i < 2 else 0.0, 0.0, 46068.0)
                         for i, x in enumerate(u))
            store.write_cycle(Cycle(ts, "l40s", gpus, (), ()))
    code, out, _ = pick(capsys, "1", "--from", "l40s-4x", "--format", "json")
    assert json.loads(out)["gpus"][0]["uuid"] == u[0]  # one sample: all idle, lowest index
    monkeypatch.setenv("GPUSLURM_DB", str(db))
    code, out, _ = pick(capsys, "1", "--from", "l40s-4x", "--format", "json")
    assert code == 0 and json.loads(out)["gpus"][0]["uuid"] == u[2]  # the window says 0, 1 were busy
    db.chmod(0)  # unreadable (root-only for a user): one sample again, no error
    if not os.access(db, os.R_OK):
        code, out, err = pick(capsys, "1", "--from", "l40s-4x", "--format", "json")
        assert (code, err) == (0, "") and json.loads(out)["gpus"][0]["uuid"] == u[0]


OPTION_VALUES = {"--from": "dgx-h100", "--mem": "6GiB", "--min-cc": "8.0", "--type": "h100",
                 "--mig": "1g.10gb", "--max-util": "50", "--format": "json"}


@given(st.integers(1, 64), st.dictionaries(st.sampled_from(sorted(OPTION_VALUES)), st.booleans()),
       st.booleans(), st.booleans())
def test_argument_parser_round_trip(n: int, options: dict[str, bool], exclusive: bool, inline: bool) -> None:
    argv = [str(n)]
    for name in options:
        argv += [f"{name}={OPTION_VALUES[name]}"] if inline else [name, OPTION_VALUES[name]]
    if exclusive:
        argv.append("--exclusive")
    args = parse_args(argv)
    assert args.n == n and args.exclusive == exclusive and args.command == ()
    assert args.mem == (OPTION_VALUES["--mem"] if "--mem" in options else None)
    assert args.fmt == ("json" if "--format" in options else "env")


@given(st.lists(st.text(max_size=8), max_size=6))
def test_argument_parser_total(argv: list[str]) -> None:
    try:
        parse_args(argv)
    except (InputError, HelpRequested):
        pass


def test_compute_capability_from_nvml_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    doc = json.loads((DATA / "pcie-tree-8x" / "nvml.json").read_text())  # L40S: 8.9 in the table
    doc["gpus"][5]["compute_capability"] = "9.0"  # NVML's word wins over the table
    (bundle / "nvml.json").write_text(json.dumps(doc))
    code, out, _ = pick(capsys, "1", "--from", str(bundle), "--min-cc", "9.0", "--format", "json")
    assert code == 0 and [g["index"] for g in json.loads(out)["gpus"]] == [5]
    doc["gpus"][5]["compute_capability"] = "nine"
    (bundle / "nvml.json").write_text(json.dumps(doc))
    code, _, err = pick(capsys, "1", "--from", str(bundle), "--min-cc", "9.0")
    assert code == 2 and "compute_capability" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_bundle(capsys: pytest.CaptureFixture[str], name: str) -> None:
    node = load_node(name)
    whole = [g for g in node.gpus if not (g.mig_mode and g.mig_devices)]
    code, out, err = pick(capsys, str(len(whole)), "--from", name, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(g["uuid"] for g in doc["gpus"]) == sorted(g.uuid for g in whole)
    assert doc["numa_nodes"] == sorted({g.numa_node for g in whole if g.numa_node is not None})


def test_missing_command_is_bad_input() -> None:
    proc = run_pick("1", "--from", "dgx-h100", "--", "/nonexistent/cmd", "x")
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.splitlines()[-1]
    assert last == "gpuslurm pick: /nonexistent/cmd: cannot run: No such file or directory"
