"""``gpuslurm install --pbs``'s plan against a stand-in qmgr: idempotent, only the differences.

The real qmgr of the test cluster runs it in tests/pbs_cluster/test_pbs_hooks_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.errors import CommandError
from gpuslurm.pbs.install import (
    HOOK_FILES,
    HookState,
    QmgrStep,
    apply_steps,
    default_qmgr,
    describe,
    hook_config,
    hook_script,
    parse_list_hook,
    plan_hook,
    plan_install,
    plan_resources,
    read_state,
)

# `qmgr -c "list hook gpuslurm"` of OpenPBS 23.06, long event list wrapped as it prints it
LISTED = """Hook gpuslurm
    type = site
    enabled = true
    event = execjob_begin,execjob_end,execjob_launch,execjob_attach,
\texechost_startup
    user = pbsadmin
    alarm = 30
    order = 100
    debug = false
    fail_action = none

"""


class FakeQmgr:
    """A server with hooks and resources, changed by the commands it is given."""

    def __init__(self) -> None:
        self.hooks: dict[str, dict[str, str]] = {}
        self.files: dict[tuple[str, str], bytes] = {}
        self.resources = {"ncpus", "mem"}
        self.resource_flags: dict[str, str] = {}
        self.commands: list[str] = []

    def __call__(self, command: str) -> str:
        self.commands.append(command)
        words = command.split()
        if command.startswith("list hook "):
            if words[2] not in self.hooks:
                raise CommandError("qmgr failed", stderr=f"qmgr obj={words[2]} svr=default: hook not found")
            return "Hook x\n" + "".join(f"    {k} = {v}\n" for k, v in self.hooks[words[2]].items())
        if command.startswith("export hook "):
            if (words[2], words[3]) not in self.files:
                raise CommandError("qmgr failed")
            return self.files[(words[2], words[3])].decode() + "\n"
        if command.startswith("create hook "):
            self.hooks[words[2]] = {"enabled": "true", "order": "1", "alarm": "30", "event": '""'}
        elif command.startswith("import hook "):
            with open(words[5], "rb") as handle:
                self.files[(words[2], words[3])] = handle.read()
        elif command.startswith("set hook "):
            self.hooks[words[2]][words[3]] = command.split(" = ", 1)[1].strip('"')
        elif command.startswith("list resource "):
            if words[2] not in self.resources:
                raise CommandError("qmgr failed", stderr="Unknown resource")
            flags = self.resource_flags.get(words[2])
            return f"Resource {words[2]}\n" + (f"    flag = {flags}\n" if flags else "")
        elif command.startswith("create resource "):
            self.resources.add(words[2])
            if "flag=" in command:
                self.resource_flags[words[2]] = command.split("flag=", 1)[1]
        elif command.startswith("set resource "):
            self.resource_flags[words[2]] = command.split(" = ", 1)[1]
        return ""


def plan(qmgr: FakeQmgr, python: str = "/usr/bin/python3") -> list[QmgrStep]:
    steps = list(plan_resources(qmgr))
    for name in HOOK_FILES:
        steps += plan_hook(name, read_state(qmgr, name), hook_script(name), hook_config(name, python))
    return steps


def test_plan_install_is_the_resources_then_each_hook_and_describe_says_it() -> None:
    qmgr = FakeQmgr()
    steps = plan_install(qmgr, "/usr/bin/python3")
    assert steps == plan(qmgr)
    lines = describe(steps, dry_run=True)
    assert len(lines) == len(steps)
    assert all(line.startswith("would ") and ": qmgr -c " in line for line in lines)
    apply_steps(qmgr, steps)
    assert describe(plan_install(qmgr, "/usr/bin/python3"), dry_run=False) == \
        [f"nothing to change: PBS has hook(s) {', '.join(HOOK_FILES)} as wanted"]


def test_list_hook_output_with_a_wrapped_event_list() -> None:
    attrs = parse_list_hook(LISTED)
    assert attrs["event"] == "execjob_begin,execjob_end,execjob_launch,execjob_attach,exechost_startup"
    assert (attrs["alarm"], attrs["order"], attrs["enabled"]) == ("30", "100", "true")


def test_first_run_creates_everything_second_run_changes_nothing() -> None:
    qmgr = FakeQmgr()
    steps = plan(qmgr)
    says = [s.says for s in steps]
    assert says[0] == "create resource ngpus (type long, consumable per vnode)"
    mps = next(s for s in steps if "gpuslurm_mps" in s.command)
    assert mps.command == "create resource gpuslurm_mps type=boolean, flag=m"
    assert "create hook gpuslurm" in says and "import hook gpuslurm's config" in says
    apply_steps(qmgr, steps)
    assert qmgr.hooks["gpuslurm"]["event"] == ",".join(HOOK_FILES["gpuslurm"].events)
    assert json.loads(qmgr.files[("gpuslurm", "application/x-config")])["python"] == "/usr/bin/python3"
    assert qmgr.files[("gpuslurm", "application/x-python")] == hook_script("gpuslurm")
    assert plan(qmgr) == []


def test_an_mps_resource_pbs_would_not_send_to_pbs_mom_gets_the_flag() -> None:
    """A site's own gpuslurm_mps without flag m: pbs_mom's hooks would see None for every job."""
    qmgr = FakeQmgr()
    qmgr.resources.add("gpuslurm_mps")
    qmgr.resource_flags["gpuslurm_mps"] = "r"
    steps = plan_resources(qmgr)
    mps = [s.command for s in steps if "gpuslurm_mps" in s.command]
    assert mps == ["set resource gpuslurm_mps flag = rm"]
    apply_steps(qmgr, steps)
    assert plan_resources(qmgr) == []


def test_only_what_differs_is_changed() -> None:
    qmgr = FakeQmgr()
    apply_steps(qmgr, plan(qmgr))
    qmgr.hooks["gpuslurm"]["alarm"] = "5"
    qmgr.hooks["gpuslurm"]["event"] = ",".join(reversed(HOOK_FILES["gpuslurm"].events))  # order: no matter
    steps = plan(qmgr, python="/opt/venv/bin/python")
    assert [s.command for s in steps] == [
        "import hook gpuslurm application/x-config default {file}", "set hook gpuslurm alarm = 30"]


def test_the_config_gives_gpuslurm_less_time_than_the_alarm() -> None:
    doc = json.loads(hook_config("gpuslurm", "/p", "/etc/gpuslurm/gpuslurm.toml", "/b"))
    assert doc == {"python": "/p", "config": "/etc/gpuslurm/gpuslurm.toml", "capture": "/b",
                   "timeout": HOOK_FILES["gpuslurm"].alarm - 5}


def test_a_server_error_other_than_not_found_is_not_taken_for_a_missing_hook() -> None:
    def down(command: str) -> str:
        raise CommandError("qmgr failed", stderr="Connection refused")

    with pytest.raises(CommandError):
        read_state(down, "gpuslurm")
    assert read_state(FakeQmgr(), "gpuslurm") == HookState(None, None, None)


def test_default_qmgr_comes_from_pbs_conf(tmp_path: os.PathLike[str]) -> None:
    conf = os.path.join(tmp_path, "pbs.conf")
    with open(conf, "w") as handle:
        handle.write("PBS_SERVER=x\nPBS_EXEC=/srv/pbs\n")
    assert default_qmgr({"PBS_CONF_FILE": conf}) == "/srv/pbs/bin/qmgr"
    assert default_qmgr({"PBS_CONF_FILE": os.path.join(tmp_path, "absent")}) == "/opt/pbs/bin/qmgr"


def test_the_cli_needs_slurm_etc_or_pbs_and_not_both(tmp_path: os.PathLike[str]) -> None:
    run = [sys.executable, "-m", "gpuslurm", "install"]
    neither = subprocess.run(run, capture_output=True, text=True, check=False)
    assert neither.returncode == 2 and "--slurm-etc" in neither.stderr
    both = subprocess.run([*run, "--pbs", "--slurm-etc", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert both.returncode == 2 and "leave out --slurm-etc" in both.stderr
    bad = subprocess.run([*run, "--pbs", "--qmgr", "qmgr"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--qmgr: must be an absolute path" in bad.stderr


DOC = Path(__file__).resolve().parents[2] / "docs" / "pbs.md"


def _doc_block(after: str) -> list[str]:
    """The lines of the first ``` block after ``after`` in docs/pbs.md."""
    if not DOC.is_file():
        pytest.skip("docs/pbs.md is not in this checkout (sdist)")
    text = DOC.read_text().split(after, 1)[1]
    return text.split("```\n", 2)[1].splitlines()


def test_the_docs_show_what_install_pbs_prints_on_a_new_server(tmp_path: Path) -> None:
    # docs/pbs.md showed bare qmgr lines, not "<what>: qmgr -c '...'", and no throttle hook
    qmgr = tmp_path / "qmgr"  # a server with none of it: list and export answer "not found"
    qmgr.write_text('#!/bin/sh\ncase "$2" in list*|export*) echo "qmgr obj= svr=default: not found" >&2; '
                    "exit 1;; esac\nexit 0\n")
    qmgr.chmod(0o755)
    (tmp_path / "site.toml").write_text("")  # the shipped defaults, not this host's config
    env = {"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(tmp_path / "site.toml")}
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "install", "--pbs", "--qmgr", str(qmgr)],
                          capture_output=True, text=True, check=False, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = _doc_block("On a server that has none of\nit yet")
    assert done.stdout.splitlines() == shown
    assert any(line.startswith("create hook gpuslurm_throttle: ") for line in shown)
    dry = subprocess.run([sys.executable, "-m", "gpuslurm", "install", "--pbs", "--dry-run",
                          "--qmgr", str(qmgr)],
                         capture_output=True, text=True, check=False, env=env, timeout=120)
    would = [f"would {line}" if not line.startswith("#") else line for line in shown]
    assert dry.stdout.splitlines() == would
