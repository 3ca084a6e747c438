"""plugins/pbs/gpuslurm_hook.py under a stand-in ``pbs`` module: its failure policy and how it
applies gpuslurm's answer, without PBS (the real pbs_mom runs it in tests/pbs_cluster/test_pbs_hooks_e2e.py).

The stand-in gives the hook what pbs_python gives it (``pbs.event()``, ``pbs.vnode``, ``pbs.size``,
``pbs.logmsg``, ``pbs.hook_config_filename``) and records what the hook does with them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

HOOK = Path(__file__).resolve().parents[2] / "plugins" / "pbs" / "gpuslurm_hook.py"
EVENTS = ("exechost_startup", "execjob_begin", "execjob_launch", "execjob_attach", "execjob_end")


class Vnode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.resources_available: dict[str, Any] = {}
        self.state: int | None = None
        self.comment: str | None = None


class Job:
    id = "12.pbshost"
    euser = "root"
    exec_vnode = "(pbshost[0]:ncpus=4:ngpus=2)"
    exec_host = None  # what pbs_mom gives its hooks: exec_host2 only
    exec_host2 = "pbshost:15002/0*4"

    def __init__(self) -> None:
        self.Resource_List: dict[str, Any] = {"ngpus": 2}


class Event:
    def __init__(self, name: str) -> None:
        self.type = EVENTS.index(name) + 1
        self.job = Job()
        self.vnode_list: dict[str, Vnode] = {"pbshost[0]": Vnode("pbshost[0]")}
        self.env: dict[str, str] = {"PATH": "/bin"}
        self.pid = os.getpid()
        self.outcome: str | None = None
        self.message = ""

    def accept(self) -> None:
        self.outcome = self.outcome or "accept"
        raise SystemExit(0)

    def reject(self, message: str = "") -> None:
        self.outcome, self.message = "reject", message
        raise SystemExit(255)


def run_hook(tmp_path: Path, name: str, config: dict[str, Any] | None,
             resources: dict[str, Any] | None = None) -> tuple[Event, list[str]]:
    """Run the hook file for event ``name`` with ``config`` as its hook config (``resources``: the
    job's Resource_List, default ngpus only); the event and logs."""
    event = Event(name)
    if resources is not None:
        event.job.Resource_List = resources
    logs: list[str] = []
    conf = tmp_path / "hook-config.json"
    if config is not None:
        conf.write_text(json.dumps(config))
    pbs = types.ModuleType("pbs")
    for i, event_name in enumerate(EVENTS):
        setattr(pbs, event_name.upper(), i + 1)
    pbs.EVENT_ERROR, pbs.EVENT_DEBUG, pbs.ND_OFFLINE = 1, 2, 99  # type: ignore[attr-defined]
    pbs.event = lambda: event  # type: ignore[attr-defined]
    pbs.vnode = Vnode  # type: ignore[attr-defined]
    pbs.size = lambda text: f"size({text})"  # type: ignore[attr-defined]
    pbs.logmsg = lambda level, message: logs.append(message)  # type: ignore[attr-defined]
    pbs.get_local_nodename = lambda: "pbshost"  # type: ignore[attr-defined]
    pbs.hook_config_filename = str(conf) if config is not None else None  # type: ignore[attr-defined]
    pbs.pbs_conf = {"PBS_HOME": str(tmp_path / "nohome"), "PBS_EXEC": str(tmp_path / "noexec")}  # type: ignore[attr-defined]
    saved = sys.modules.get("pbs")
    sys.modules["pbs"] = pbs
    try:
        with pytest.raises(SystemExit):
            exec(compile(HOOK.read_text(), str(HOOK), "exec"), {"__name__": "__main__"})
    finally:
        if saved is None:
            del sys.modules["pbs"]
        else:
            sys.modules["pbs"] = saved
    return event, logs


def fake_gpuslurm(tmp_path: Path, body: str) -> dict[str, Any]:
    """A hook config whose "python" is a shell script doing ``body`` (it receives the request)."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return {"python": str(script), "config": "", "capture": "", "timeout": 2}


def answering(tmp_path: Path, answer: dict[str, Any]) -> dict[str, Any]:
    return fake_gpuslurm(tmp_path, f"cat > {tmp_path}/request.json\ncat <<'EOF'\n{json.dumps(answer)}\nEOF")


@pytest.mark.parametrize("name", ["execjob_begin", "execjob_launch", "execjob_attach"])
@pytest.mark.parametrize("failure", ["crash", "hang", "garbage", "no-config", "bad-config"])
def test_gates_fail_closed(tmp_path: Path, name: str, failure: str) -> None:
    config: dict[str, Any] | None = {  # one script path: only the chosen one is written
        "crash": lambda: fake_gpuslurm(tmp_path, "echo 'gpuslurm pbs: it broke' >&2; exit 3"),
        "hang": lambda: fake_gpuslurm(tmp_path, "exec sleep 30"),
        "garbage": lambda: fake_gpuslurm(tmp_path, "echo '{not json'"),
        "no-config": lambda: None,
        "bad-config": lambda: {"python": "relative/python"},
    }[failure]()
    started = time.monotonic()
    event, logs = run_hook(tmp_path, name, config)
    assert event.outcome == "reject", logs
    assert event.message.startswith(f"gpuslurm {name}: ") and "\n" not in event.message
    assert time.monotonic() - started < 10  # the hang was killed at the hook config's timeout
    if failure == "crash":
        assert "exit 3" in event.message and "it broke" in event.message


@pytest.mark.parametrize("name", ["exechost_startup", "execjob_end"])
@pytest.mark.parametrize("failure", ["crash", "hang", "no-config"])
def test_bookkeeping_events_only_log(tmp_path: Path, name: str, failure: str) -> None:
    config = {"crash": lambda: fake_gpuslurm(tmp_path, "exit 70"),
              "hang": lambda: fake_gpuslurm(tmp_path, "exec sleep 30"), "no-config": lambda: None}[failure]()
    event, logs = run_hook(tmp_path, name, config)
    assert event.outcome == "accept"
    assert any(f"gpuslurm {name}:" in line for line in logs), logs


def test_a_hang_is_killed_with_what_it_started(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    config = fake_gpuslurm(tmp_path, f"sleep 30 & echo $! > {marker}; wait")
    event, _ = run_hook(tmp_path, "execjob_begin", config)
    assert event.outcome == "reject" and "did not answer within 2s" in event.message
    pid = int(marker.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_request_names_the_job_and_the_answer_is_applied(tmp_path: Path) -> None:
    answer = {"format": 1, "accept": True, "env": {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
              "offline": {"pbshost[1]": "gpuslurm: GPU index 4 (/dev/nvidia4, GPU-x): Xid 79"}}
    event, _ = run_hook(tmp_path, "execjob_launch", answering(tmp_path, answer))
    assert event.outcome == "accept"
    assert event.env["CUDA_VISIBLE_DEVICES"] == "GPU-a\\,GPU-b"  # pbs_env's escaped comma
    assert event.vnode_list["pbshost[1]"].state == 99
    assert event.vnode_list["pbshost[1]"].comment.endswith("Xid 79")
    request = json.loads((tmp_path / "request.json").read_text())
    assert request == {"format": 1, "event": "execjob_launch", "hostname": "pbshost",
                       "vnodes": ["pbshost[0]"], "job_id": "12.pbshost", "euser": "root",
                       "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=2)", "exec_host": "pbshost:15002/0*4",
                       "pbs_cgroups": False, "pid": os.getppid()}  # launch: the hook's parent


@pytest.mark.parametrize(("resources", "sent"), [
    ({"gpuslurm_mps": True}, "True"), ({"gpuslurm_mps": False}, "False"), ({}, None), (None, None)])
def test_begin_sends_the_jobs_mps_resource(tmp_path: Path, resources: dict[str, Any] | None,
                                           sent: str | None) -> None:
    """``-l gpuslurm_mps=true`` reaches gpuslurm as the text of PBS's boolean; a job without it,
    or a server without the resource (Resource_List raising), sends none and still starts."""
    class NoSuchResource(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise KeyError(key)

    answer = {"format": 1, "accept": True}
    event, _ = run_hook(tmp_path, "execjob_begin", answering(tmp_path, answer),
                        resources=NoSuchResource() if resources is None else resources)
    assert event.outcome == "accept"
    request = json.loads((tmp_path / "request.json").read_text())
    assert request.get("mps") == sent


def test_a_refusal_is_passed_on_with_its_message(tmp_path: Path) -> None:
    answer = {"format": 1, "accept": False, "message": "gpuslurm: vnode pbshost[0] has 0 free GPU(s)"}
    event, _ = run_hook(tmp_path, "execjob_begin", answering(tmp_path, answer))
    assert (event.outcome, event.message) == ("reject", answer["message"])


def test_startup_publishes_vnode_resources(tmp_path: Path) -> None:
    answer = {"format": 1, "accept": True,
              "vnodes": {"pbshost": {"ncpus": 0, "mem": "0kb", "ngpus": 0},
                         "pbshost[1]": {"ncpus": 112, "mem": "1031928mb", "ngpus": 4}}}
    event, _ = run_hook(tmp_path, "exechost_startup", answering(tmp_path, answer))
    assert event.outcome == "accept"
    assert event.vnode_list["pbshost[1]"].resources_available == {
        "ncpus": 112, "ngpus": 4, "mem": "size(1031928mb)"}
    request = json.loads((tmp_path / "request.json").read_text())
    assert request == {"format": 1, "event": "exechost_startup", "hostname": "pbshost",
                       "vnodes": ["pbshost[0]"]}


def test_startup_publishes_mig_instances_as_nmigs(tmp_path: Path) -> None:
    answer = {"format": 1, "accept": True,
              "vnodes": {"pbshost[3]": {"ncpus": 32, "mem": "1mb", "ngpus": 0, "nmigs": 4}}}
    event, _ = run_hook(tmp_path, "exechost_startup", answering(tmp_path, answer))
    assert event.outcome == "accept"
    assert event.vnode_list["pbshost[3]"].resources_available == {
        "ncpus": 32, "ngpus": 0, "mem": "size(1mb)", "nmigs": 4}


def test_gpuslurm_runs_with_a_minimal_environment_and_absolute_paths(tmp_path: Path) -> None:
    config = fake_gpuslurm(tmp_path, f"env > {tmp_path}/env; pwd > {tmp_path}/cwd; "
                                     f"echo \"$@\" > {tmp_path}/args; "
                                     "echo '{\"format\": 1, \"accept\": true}'")
    config.update(config="/etc/gpuslurm/x.toml", capture="/b")
    run_hook(tmp_path, "execjob_end", config)
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines())
    assert {k: v for k, v in env.items() if k not in ("PWD", "SHLVL", "_")} == {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
        "GPUSLURM_CONFIG": "/etc/gpuslurm/x.toml", "GPUSLURM_CAPTURE": "/b"}
    assert (tmp_path / "cwd").read_text().strip() == "/"
    assert (tmp_path / "args").read_text().split() == ["-I", "-c", "from", "gpuslurm.pbs.entry", "import",
                                                       "run;", "run()", "execjob_end"]


class StubbornVnode(Vnode):
    """A vnode whose state the event refuses to change."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "state" and value is not None:
            raise ValueError("read-only here")
        super().__setattr__(name, value)


def test_offline_falls_back_to_qmgr_when_the_event_refuses(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    qmgr = tmp_path / "noexec" / "bin" / "qmgr"
    qmgr.parent.mkdir(parents=True)
    qmgr.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/qmgr-args\n")
    qmgr.chmod(0o755)
    monkeypatch.setattr(sys.modules[__name__], "Vnode", StubbornVnode)
    answer = {"format": 1, "accept": False, "message": "no",
              "offline": {"pbshost[0]": 'gpuslurm: GPU index 0 (/dev/nvidia0, GPU-x): "Xid" 79'}}
    event, _ = run_hook(tmp_path, "execjob_begin", answering(tmp_path, answer))
    assert event.outcome == "reject"
    assert (tmp_path / "qmgr-args").read_text().splitlines() == [
        "-c", "set node pbshost[0] state += offline, comment = \"gpuslurm: GPU index 0 (/dev/nvidia0, "
        "GPU-x): 'Xid' 79\""]
