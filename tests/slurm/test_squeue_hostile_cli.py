"""Every command that reads ``squeue --json`` given a malformed answer (issue 18: an IDX range past
the range parser's bound, ``user_id`` 1e999, 5,000-deep nesting), through the real CLI as a process
with stand-in scontrol/squeue/sacctmgr: one line and exit 2 (``throttle auto``, ``placement``,
``gpu offline``), or for the monitor one problem line per cycle while it keeps cycling; never exit 70,
never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.squeue_samples import HOSTILE_SQUEUE

ISSUE_18 = ("IDX past the range parser's bound", "user_id 1e999", "5,000-deep nesting")
NODE_LINE = "NodeName=gpu02 Arch=x86_64 Gres=gpu:h100:8(S:0-1) State=MIXED Reason=(null) Comment=(null)"


def _site(tmp_path: Path, answer: str) -> dict[str, str]:
    """Stand-in commands: scontrol shows one node, squeue prints ``answer``, sacctmgr lists users."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "squeue.json").write_text(answer)
    scripts = {"scontrol": f"echo '{NODE_LINE}'", "squeue": f"cat {tmp_path / 'squeue.json'}",
               "sacctmgr": 'printf "alice|\\n"', "sbatch": "exit 1", "scancel": "exit 1"}
    for name, body in scripts.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(
        "[paths]\n" + "".join(f'{name} = "{bindir / name}"\n' for name in scripts if name != "sbatch")
        + f'qstat = "{tmp_path / "no-qstat"}"\nrun_dir = "{tmp_path / "run"}"\n'
        f'state_dir = "{tmp_path / "state"}"\nviolations_dir = "{tmp_path / "violations"}"\n'
        '[scheduler]\nkind = "slurm"\n[monitor]\nsqueue_interval_s = 1\n'
        f'[gpu_out]\nsbatch = "{bindir / "sbatch"}"\n')
    return {**os.environ, "GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": "dgx-h100"}


def _gpuslurm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


COMMANDS = {
    "throttle auto": ("throttle", "auto", "--once"),
    "placement": ("placement", "--from", "dgx-h100", "--node", "gpu02"),
    "gpu offline": ("gpu", "offline", "index:1", "--reason", "ECC", "--node-name", "gpu02",
                    "--from", "dgx-h100"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", ISSUE_18)
def test_each_command_refuses_a_malformed_answer_in_one_line_exit_2(tmp_path: Path, command: str,
                                                                    name: str) -> None:
    env = _site(tmp_path, HOSTILE_SQUEUE[name])
    args = COMMANDS[command]
    if command == "throttle auto":
        args = (*args, "--state-dir", str(tmp_path / "state"))
    done = _gpuslurm(env, *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "squeue --json: " in lines[0] and "Traceback" not in done.stderr, lines
    if command == "gpu offline":  # what was recorded stays: the GPU is out, Slurm is told next time
        listed = json.loads(_gpuslurm(env, "gpu", "list", "--json", "--from", "dgx-h100").stdout)["gpus"]
        assert [r["in_service"] for r in listed if r["index"] == 1] == [False]


def test_the_monitor_records_one_problem_line_and_keeps_cycling(tmp_path: Path) -> None:
    """No prolog here (no job maps), so every cycle asks squeue; each answer is malformed in
    another way. The monitor records each as one ``squeue-error`` problem and cycles on; a
    stop (SIGTERM) ends it with exit 0."""
    env = _site(tmp_path, HOSTILE_SQUEUE[ISSUE_18[0]])
    answers = [HOSTILE_SQUEUE[name] for name in ISSUE_18]
    proc = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor", "--json", "--interval", "0.2",
                             "--db", str(tmp_path / "state" / "monitor.db"), "--from", "dgx-h100"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for count, line in enumerate(proc.stdout):
            assert count < 1000, f"1000 cycles and only {len(seen)} squeue problem(s): {seen}"
            problems = [p for p in json.loads(line)["problems"] if p["kind"] == "squeue-error"]
            if not problems:
                continue  # a cycle within squeue_interval_s of the last ask
            assert len(problems) == 1 and "\n" not in problems[0]["detail"], problems
            seen.append(problems[0]["detail"])
            if len(seen) == len(answers):
                break
            (tmp_path / "squeue.json").write_text(answers[len(seen)])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "Traceback" not in err, err
    assert [d.split(": ", 1)[0] for d in seen] == ["squeue --json"] * 3, seen
    assert "IDX" in seen[0] or "beyond" in seen[0], seen
    # 5,000 levels pass the recursion limit of 3.11's json and parse on 3.13's and 3.14's (their C
    # recursion is bounded by the stack, not sys.getrecursionlimit()): the list is then a name
    # that is not a string; one line either way
    assert "user_id" in seen[1], seen
    assert "nested deeper" in seen[2] or "name is not a string" in seen[2], seen

