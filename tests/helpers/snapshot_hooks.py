"""The snapshot's hook cases: the Slurm prolog, epilog and task prolog, the PBS hook and the
classic PBS scripts in the fault cases, each on a site of its own.

The Slurm hooks run through ``gpuslurm <hook>`` on tests/hooks' sites (a replayed bundle, a
stand-in scontrol that records its calls); the PBS hook through gpuslurm.pbs.entry.main and the
classic scripts through gpuslurm.pbs.classic.main, as tests/pbs drives them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from tests.helpers.hook_helpers import make_site
from tests.helpers.snapshot_env import TESTS, environ, normalise

QSTAT_JOB = TESTS / "pbs" / "data" / "qstat-f-json.json"  # real qstat -f -F json: 0.pbshost, 2 GPUs


SLURM_ENTRY = "from gpuslurm.slurm.entry import run; run()"  # what prolog/gpuslurm-prolog runs
PBS_ENTRY = "from gpuslurm.pbs.entry import run; run()"  # what the PBS hook file runs
_as_processes: list[bool] = [False]


@contextlib.contextmanager
def hooks_as_processes() -> Iterator[None]:
    """Within: the Slurm hooks and the PBS hook run as the installed hooks start them, each a
    process of its own (``python -I -c ENTRY HOOK``) with only the hook's environment."""
    _as_processes[0] = True
    try:
        yield
    finally:
        _as_processes[0] = False


def _hook_process(entry: str, event: str, env: dict[str, str], data: bytes = b"") -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-I", "-c", entry, event], env=env, input=data,
                          capture_output=True, timeout=120, check=False, cwd="/")
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def _slurm_hook(hook: str, env: dict[str, str], site: Any, world_root: Path) -> dict[str, Any]:
    from gpuslurm.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    if _as_processes[0]:
        code, stdout, stderr = _hook_process(SLURM_ENTRY, hook, env)
        out.write(stdout)
        err.write(stderr)
    else:
        with environ(env, clear=True), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([hook])
    return {"exit": code, "stdout": normalise(out.getvalue(), site.root, world_root).splitlines(),
            "stderr": [normalise(line, site.root, world_root) for line in err.getvalue().splitlines()]}


def _after(rec: dict[str, Any], site: Any, world_root: Path, job: str = "1234") -> dict[str, Any]:
    """What the hook left: the scheduler calls (drain, requeue, comment), the job's map, the
    out-of-service record's GPUs, the summary's faults."""
    oos = site.root / "state" / "out-of-service.json"
    summary = site.summaries / f"{job}-summary.json"
    calls = [[normalise(a, site.root, world_root) for a in c] for c in site.scontrol_calls()]
    return {**rec, "scontrol": calls, "map": (site.jobs_dir / f"{job}.json").exists(),
            "out_of_service": _uuids(oos),
            "summary_faults": sorted(f["check"] for f in json.loads(summary.read_text())["faults"])
            if summary.exists() else None}


def _uuids(record: Path) -> list[str] | str | None:
    """The out-of-service record's GPUs (None: no record; a record that is not JSON: as it is)."""
    if not record.exists():
        return None
    try:
        return sorted(g["uuid"] for g in json.loads(record.read_text())["gpus"])
    except ValueError:
        return record.read_text()


def _site(world_root: Path, builtin: str = "dgx-h100", config: str = "") -> Any:
    root = Path(tempfile.mkdtemp(prefix="hook-", dir=world_root))
    site = make_site(root, builtin=builtin)
    if config:
        site.write_config(config)
    return site


def _out_of_service(site: Any, uuids: list[str]) -> None:
    (site.root / "state").mkdir(exist_ok=True)
    recs = [{"uuid": u, "reason": "earlier", "since": 1.0, "by": "admin", "index": i, "minor": i}
            for i, u in enumerate(uuids)]
    (site.root / "state" / "out-of-service.json").write_text(json.dumps({"version": 1, "gpus": recs}))


GPU_OUT = '[health.xid]\naction = "gpu_out"\n'


def _prolog(builtin: str = "dgx-h100", config: str = "", gpus: str | None = "0,1",
            health: Callable[[list[str]], dict[str, Any]] | None = None,
            prepare: Callable[[Any], object] | None = None, patch: str | None = None,
            **env: str) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        site = _site(world_root, builtin, config)
        if health:
            site.set_health(health(site.uuids))
        if prepare:
            prepare(site)
        environ_ = site.environ(gpus=gpus, **env)
        for k in [k for k, v in env.items() if v == "<unset>"]:
            del environ_[k]
        with _bug(patch):
            rec = _slurm_hook("prolog", environ_, site, world_root)
        return _after(rec, site, world_root, environ_.get("SLURM_JOB_ID", "1234"))
    return run


@contextlib.contextmanager
def _bug(target: str | None) -> Iterator[None]:
    """A bug inside the hook: ``target`` raises ZeroDivisionError (as tests/hooks plant one)."""
    if target is None:
        yield
        return
    try:
        planted = mock.patch(target, side_effect=ZeroDivisionError("a planted bug"))
        planted.start()
    except (AttributeError, ModuleNotFoundError) as exc:
        raise AssertionError(f"the planted bug's target {target} is gone ({exc}): point the case at "
                             "the same step's new home in tests/helpers/snapshot_record.py") from None
    try:
        yield
    finally:
        planted.stop()


def _epilog(gpus: str | None = "0,1", prolog_first: bool = True, config: str = "",
            after_prolog: Callable[[Any], None] | None = None, patch: str | None = None,
            **env: str) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        site = _site(world_root, config=config)
        first = None
        if prolog_first:
            first = _slurm_hook("prolog", site.environ(gpus=gpus), site, world_root)["exit"]
        if after_prolog:
            after_prolog(site)
        environ_ = site.environ(gpus=gpus, **env)
        with _bug(patch):
            rec = _slurm_hook("epilog", environ_, site, world_root)
        return {"prolog_exit": first, **_after(rec, site, world_root, environ_["SLURM_JOB_ID"])}
    return run


def _task_prolog(gpus: str = "2,3", broken: bool = False, **env: str) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        site = _site(world_root)
        if broken:
            (site.bundle / "nvidia-smi-q.xml").write_text("<nvidia_smi_log><gpu>")
        return _slurm_hook("task-prolog", site.environ(gpus=gpus, **env), site, world_root)
    return run


def _leftovers(site: Any) -> None:
    site.set_health({site.uuids[1]: {"processes": [{"pid": 99, "user": "alice", "used_mib": 4000}],
                                     "memory_used_mib": 4100}})


def _corrupt_map(site: Any) -> None:
    (site.jobs_dir / "1234.json").write_text("{not json")


def _pbs_site(world_root: Path, health: Callable[[list[str]], dict[str, Any]] | None
              ) -> tuple[Path, dict[str, str]]:
    """tests/hooks' site (a replayed DGX H100) with a PBS config of its own: node ``pbshost``, a
    stand-in qstat answering the real ``qstat -f -F json`` capture, a stand-in qmgr whose server
    is down, no cgroup hierarchy."""
    site = _site(world_root)
    if health:
        site.set_health(health(site.uuids))
    root = site.root
    qstat = root / "qstat"
    qstat.write_text(f"#!/bin/sh\nexec /bin/cat {QSTAT_JOB}\n")
    qstat.chmod(0o755)
    # a qmgr that cannot reach its server, whether or not this host has PBS (/opt/pbs/bin/qmgr)
    qmgr = root / "qmgr"
    qmgr.write_text("#!/bin/sh\necho 'qmgr obj= svr=default: Connection refused' >&2\nexit 2\n")
    qmgr.chmod(0o755)
    config = root / "gpuslurm-pbs.toml"
    config.write_text(f'[paths]\nrun_dir = "{root}/run"\nstate_dir = "{root}/state"\n'
                      f'cgroup_root = "{root}/no-cgroup"\nqstat = "{qstat}"\nqmgr = "{qmgr}"\n'
                      f'[monitor]\nnode_name = "pbshost"\n')
    return root, {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": str(site.bundle)}


def _maps(root: Path) -> list[str]:
    jobs = root / "run" / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []


def _pbs_event(event: str, doc: dict[str, Any], health: Callable[[list[str]], dict[str, Any]] | None = None,
               before: tuple[tuple[str, dict[str, Any]], ...] = (), raw: bytes | None = None,
               patch: str | None = None) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        from gpuslurm.pbs.entry import main

        root, env = _pbs_site(world_root, health)

        def call(ev: str, fields: dict[str, Any], data: bytes | None = None) -> dict[str, Any]:
            request = {"format": 1, "event": ev, "hostname": "pbshost", **fields}
            stdin = data if data is not None else json.dumps(request).encode()
            out, err = io.StringIO(), io.StringIO()
            if _as_processes[0]:
                rc, stdout, stderr = _hook_process(PBS_ENTRY, ev, env, stdin)
                out.write(stdout)
                err.write(stderr)
            else:
                with environ(env, clear=True):
                    rc = main([ev], io.BytesIO(stdin), out, err)
            return {"exit": rc, "answer": json.loads(out.getvalue()) if out.getvalue().strip() else None,
                    "stderr": [normalise(line, root, world_root) for line in err.getvalue().splitlines()]}

        earlier = [call(ev, fields)["exit"] for ev, fields in before]
        with _bug(patch):
            rec = call(event, doc, raw)
        return {"before": earlier, **json.loads(normalise(json.dumps(rec), root, world_root)),
                "maps": _maps(root)}
    return run


def _classic(kind: str, argv: tuple[str, ...], health: Callable[[list[str]], dict[str, Any]] | None = None,
             config: bool = True) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        from gpuslurm.pbs.classic import main

        root, env = _pbs_site(world_root, health)
        if not config:
            env["GPUSLURM_CONFIG"] = str(root / "missing.toml")
        err = io.StringIO()
        with environ(env, clear=True):
            rc = main(kind, list(argv), environ=dict(os.environ), stderr=err, mom_priv=str(root / "mom_priv"))
        lines = [normalise(line, root, world_root) for line in err.getvalue().splitlines()]
        return {"exit": rc, "stderr": lines, "maps": _maps(root)}
    return run


def _xid(index: int, xid: int = 79) -> Callable[[list[str]], dict[str, Any]]:
    return lambda uuids: {uuids[index]: {"xid": [xid]}}


PBS_JOB = {"job_id": "1.pbshost", "euser": "root", "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=2)",
           "exec_host": "pbshost/0*4"}
HOOK_CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "slurm prolog: healthy job": _prolog(),
    "slurm prolog: job without GPUs": _prolog(gpus=None),
    "slurm prolog: Xid 79 on a job's GPU (drain)": _prolog(gpus="1,2", health=_xid(2)),
    "slurm prolog: hot GPU": _prolog(gpus="0", health=lambda u: {u[0]: {"temperature_c": 99}}),
    "slurm prolog: GPU lost": _prolog(gpus="0", health=lambda u: {u[0]: {"lost": True}}),
    "slurm prolog: Xid 79, gpu_out, not the last GPU": _prolog(config=GPU_OUT, gpus="1,2", health=_xid(2)),
    "slurm prolog: Xid 48, gpu_out, the last GPU in service": _prolog(
        builtin="l40s-4x", config=GPU_OUT, gpus="3", health=_xid(3, 48),
        prepare=lambda s: _out_of_service(s, s.uuids[:-1])),
    "slurm prolog: a GPU already out of service": _prolog(
        config=GPU_OUT, gpus="2,3", prepare=lambda s: _out_of_service(s, [s.uuids[2]])),
    "slurm prolog: invalid job id": _prolog(SLURM_JOB_ID="12;rm -rf /"),
    "slurm prolog: no job id": _prolog(SLURM_JOB_ID="<unset>"),
    "slurm prolog: GPU index beyond the node": _prolog(gpus="8"),
    "slurm prolog: hostile SLURM_JOB_GPUS": _prolog(gpus="0-99999999999"),
    "slurm prolog: corrupt out-of-service record": _prolog(
        prepare=lambda s: ((s.root / "state").mkdir(), (s.root / "state" / "out-of-service.json")
                           .write_text("["))),
    "slurm prolog: bad config": _prolog(prepare=lambda s: s.config.write_text(
        "[health.temperature]\nlimit = 3\n")),
    "slurm prolog: unreadable health facts": _prolog(prepare=lambda s: (s.bundle / "health.json")
                                                     .write_text("{not json")),
    "slurm prolog: internal bug in the gate": _prolog(patch="gpuslurm.policy.health.gate_faults"),
    "slurm epilog: healthy job": _epilog(),
    "slurm epilog: missing map": _epilog(gpus="7", prolog_first=False),
    "slurm epilog: corrupt map": _epilog(gpus="2", after_prolog=_corrupt_map),
    "slurm epilog: leftover processes and memory": _epilog(
        config="[epilog]\nkill_leftover = false\n", after_prolog=_leftovers),
    "slurm epilog: invalid job id": _epilog(prolog_first=False, SLURM_JOB_ID="../../etc"),
    "slurm epilog: internal bug in the summary": _epilog(patch="gpuslurm.hooks.epilog.write_summary"),
    "slurm task-prolog: healthy job": _task_prolog(),
    "slurm task-prolog: unreadable bundle": _task_prolog(broken=True),
    "slurm task-prolog: invalid job id": _task_prolog(SLURM_JOB_ID="x y"),
    "pbs execjob_begin: healthy job": _pbs_event("execjob_begin", PBS_JOB),
    "pbs execjob_begin: Xid 79 on the vnode's GPU": _pbs_event(
        "execjob_begin", PBS_JOB, health=lambda u: {x: {"xid": [79]} for x in u[:4]}),
    "pbs execjob_begin: more GPUs than the vnode has": _pbs_event(
        "execjob_begin", {**PBS_JOB, "exec_vnode": "(pbshost[0]:ncpus=1:ngpus=5)"}),
    "pbs execjob_begin: invalid job id": _pbs_event("execjob_begin", {**PBS_JOB, "job_id": "../x"}),
    "pbs execjob_begin: not JSON": _pbs_event("execjob_begin", {}, raw=b"{not json"),
    "pbs execjob_begin: internal bug in the gate": _pbs_event(
        "execjob_begin", PBS_JOB, patch="gpuslurm.policy.health.gate_faults"),
    "pbs execjob_end: after begin": _pbs_event("execjob_end", PBS_JOB, before=(("execjob_begin", PBS_JOB),)),
    "pbs execjob_end: missing map": _pbs_event("execjob_end", PBS_JOB),
    "pbs classic prologue: healthy job": _classic("prologue", ("0.pbshost", "root", "root")),
    "pbs classic prologue: Xid 79 on the job's GPU": _classic(
        "prologue", ("0.pbshost", "root", "root"), health=lambda u: {x: {"xid": [79]} for x in u[:4]}),
    "pbs classic prologue: invalid job id": _classic("prologue", ("../0", "root", "root")),
    "pbs classic prologue: a job qstat does not list": _classic("prologue", ("9.pbshost", "root", "root")),
    "pbs classic prologue: missing config": _classic("prologue", ("0.pbshost", "root", "root"), config=False),
    "pbs classic epilogue: missing map": _classic(
        "epilogue", ("0.pbshost", "root", "root", "j", "1", "", "", "workq", "null", "0")),
}


