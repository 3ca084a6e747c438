"""``gpuslurm install --pbs``: import gpuslurm's hooks into PBS with ``qmgr``, idempotently.

:data:`HOOK_FILES` is the one table of PBS hooks gpuslurm ships (name → file under
``plugins/pbs/``, events, order, alarm); a hook is one more row. For each row the plan compares
what the server has (``list hook``, ``export hook ... application/x-python`` and
``application/x-config``) with what is wanted, and only the differences become ``qmgr`` commands:
``create hook``, ``import hook`` (the script, then its JSON config), ``set hook`` for
``event``/``order``/``alarm``/``enabled``. Run again, it finds nothing to change and says so.

The config each hook gets (``application/x-config``, JSON, checked by the server on import) names
the interpreter that runs gpuslurm (absolute: pbs_mom's hooks have no useful PATH), the gpuslurm
config file, a capture bundle to replay (test clusters) and the timeout the hook gives gpuslurm,
below the hook's alarm so that the hook, not PBS, decides what a hang means.
The caller (:mod:`gpuslurm.cli.install_cmd`) checks those paths as the Slurm install does.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gpuslurm.errors import CommandError, InputError

DEFAULT_QMGR = "/opt/pbs/bin/qmgr"
PYTHON_TYPE = "application/x-python"
CONFIG_TYPE = "application/x-config"
TIMEOUT_MARGIN_S = 5  # the hook's own timeout for gpuslurm: its alarm less this


class HookFile(NamedTuple):
    """One PBS hook gpuslurm ships: its script under plugins/pbs/ and how PBS runs it."""

    file: str
    events: tuple[str, ...]
    order: int
    alarm: int  # seconds; PBS rejects the event (and kills the hook) when it is reached


# The PBS hooks of gpuslurm: the job hooks at every pbs_mom, the throttle at pbs_server.
HOOK_FILES: dict[str, HookFile] = {
    "gpuslurm": HookFile("gpuslurm_hook.py",
                         ("exechost_startup", "execjob_begin", "execjob_launch", "execjob_attach",
                          "execjob_end"), order=100, alarm=30),
    "gpuslurm_throttle": HookFile("gpuslurm_throttle.py", ("queuejob", "modifyjob", "movejob", "runjob"),
                                  order=100, alarm=10),
}


class QmgrStep(NamedTuple):
    """One ``qmgr -c`` command and what it does, in words."""

    command: str
    says: str
    content: bytes | None = None  # import: the file's content, written to a temporary file first
    suffix: str = ""  # import: the temporary file's suffix (the server checks a config's)


class HookState(NamedTuple):
    """What the server has of one hook: its attributes, script and config (None: absent)."""

    attributes: dict[str, str] | None
    script: bytes | None
    config: bytes | None


Qmgr = Callable[[str], str]  # runs ``qmgr -c COMMAND``; its stdout, CommandError on failure


def hook_script(name: str) -> bytes:
    """The hook file of ``name`` from the installed package, else from the source checkout."""
    row = HOOK_FILES[name]
    here = os.path.dirname(os.path.abspath(__file__))
    for base in (os.path.join(os.path.dirname(here), "pbs-hooks"),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(here))), "plugins", "pbs")):
        path = os.path.join(base, row.file)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                return handle.read()
    raise InputError("PBS hook file not found (broken installation?)", f"plugins/pbs/{row.file}")


def hook_config(name: str, python: str, config: str = "", capture: str = "", *,
                package_dir: str = "", throttle_file: str = "", contact: str = "") -> bytes:
    """The JSON config imported beside hook ``name``. The job hooks run gpuslurm with ``python``;
    the throttle hook imports it in pbs_server's own interpreter from ``package_dir`` (the
    directory holding the gpuslurm package ``python`` runs) and reads ``throttle_file``."""
    row = HOOK_FILES[name]
    doc: dict[str, object]
    if name == "gpuslurm_throttle":
        doc = {"python_path": [package_dir] if package_dir else [], "throttle_file": throttle_file,
               "contact": contact}
    else:
        doc = {"python": python, "config": config, "capture": capture,
               "timeout": max(1, row.alarm - TIMEOUT_MARGIN_S)}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def parse_list_hook(text: str) -> dict[str, str]:
    """``qmgr -c "list hook NAME"`` → its attributes (``event``, ``order``, ``alarm``, ...).

    qmgr wraps a long value onto indented lines without `` = ``: they continue the last one."""
    attributes: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        key, eq, value = line.strip().partition(" = ")
        if line.startswith("Hook ") or not line.strip():
            continue
        if eq and key:
            last = key.strip()
            attributes[last] = value.strip()
        elif last is not None and line[:1].isspace():
            attributes[last] += line.strip()
    return attributes


def read_state(qmgr: Qmgr, name: str) -> HookState:
    """What the server has of hook ``name``."""
    try:
        listed = qmgr(f"list hook {name}")
    except CommandError as exc:
        if "not found" in f"{exc} {exc.stderr}".lower() or "unknown" in f"{exc} {exc.stderr}".lower():
            return HookState(None, None, None)
        raise
    return HookState(parse_list_hook(listed), _export(qmgr, name, PYTHON_TYPE),
                     _export(qmgr, name, CONFIG_TYPE))


def _export(qmgr: Qmgr, name: str, content_type: str) -> bytes | None:
    try:
        out = qmgr(f"export hook {name} {content_type} default")
    except CommandError:
        return None  # nothing imported yet
    return out.encode()


def plan_hook(name: str, state: HookState, script: bytes, config: bytes) -> list[QmgrStep]:
    """The qmgr steps that make the server's hook ``name`` what is wanted (none: it already is)."""
    row = HOOK_FILES[name]
    steps = []
    attrs = state.attributes
    if attrs is None:
        steps.append(QmgrStep(f"create hook {name}", f"create hook {name}"))
        attrs = {}
    if _norm(state.script) != _norm(script):
        steps.append(QmgrStep(f"import hook {name} {PYTHON_TYPE} default {{file}}",
                              f"import hook {name}'s script ({HOOK_FILES[name].file})", script, ".py"))
    if _norm(state.config) != _norm(config):
        steps.append(QmgrStep(f"import hook {name} {CONFIG_TYPE} default {{file}}",
                              f"import hook {name}'s config", config, ".json"))
    events = ",".join(row.events)
    if set(attrs.get("event", "").split(",")) != set(row.events):
        steps.append(QmgrStep(f'set hook {name} event = "{events}"', f"set hook {name} event = {events}"))
    for key, value in (("order", str(row.order)), ("alarm", str(row.alarm)), ("enabled", "true")):
        if attrs.get(key, "").lower() != value:
            steps.append(QmgrStep(f"set hook {name} {key} = {value}", f"set hook {name} {key} = {value}"))
    return steps


def _norm(content: bytes | None) -> bytes | None:
    """Content as compared: qmgr's export may differ in line endings and the final newline."""
    if content is None:
        return None
    return content.replace(b"\r\n", b"\n").rstrip(b"\n")


# The server resources gpuslurm needs: name → (qmgr type and flags, flags it must have, in words).
# ``m``: PBS sends the job's value to pbs_mom (its hooks see ``None`` without it); ``nh``:
# consumable, per vnode.
RESOURCES: dict[str, tuple[str, str, str]] = {
    "ngpus": ("type=long, flag=nh", "", "type long, consumable per vnode"),
    "nmigs": ("type=long, flag=nh", "", "type long, consumable per vnode: MIG instances"),
    "gpuslurm_mps": ("type=boolean, flag=m", "m",
                     "type boolean, job-wide, sent to pbs_mom: qsub -l gpuslurm_mps=true asks for MPS"),
}


def plan_resources(qmgr: Qmgr) -> list[QmgrStep]:
    """The server resources of :data:`RESOURCES` the server lacks (one ``create resource`` each),
    and the flags one it has lacks (``set resource``); its type is left as it is."""
    steps = []
    for name, (spec, needs, says) in RESOURCES.items():
        try:
            listed = qmgr(f"list resource {name}")
        except CommandError:
            steps.append(QmgrStep(f"create resource {name} {spec}", f"create resource {name} ({says})"))
            continue
        flags = parse_list_hook(listed).get("flag", "")
        if missing := "".join(f for f in needs if f not in flags):
            steps.append(QmgrStep(f"set resource {name} flag = {flags}{missing}",
                                  f"set resource {name} flag = {flags}{missing} (flag {missing} missing)"))
    return steps


def apply_steps(qmgr: Qmgr, steps: Sequence[QmgrStep]) -> None:
    """Run the steps in order; an import's content goes through a private temporary file."""
    work = tempfile.mkdtemp(prefix="gpuslurm-pbs-")
    try:
        for i, step in enumerate(steps):
            command = step.command
            if step.content is not None:
                path = os.path.join(work, f"hook{i}{step.suffix}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(step.content)
                command = command.replace("{file}", path)
            qmgr(command)
    finally:
        for entry in os.listdir(work):
            os.unlink(os.path.join(work, entry))
        os.rmdir(work)


def qmgr_runner(qmgr: str, timeout: float = 60) -> Qmgr:
    """A :data:`Qmgr` running the program ``qmgr`` (no shell; PBS_CONF_FILE as in our environment)."""
    if not os.path.isabs(qmgr):
        raise InputError("must be an absolute path", "--qmgr")
    if not os.access(qmgr, os.X_OK):
        raise InputError("is not an executable qmgr (OpenPBS's bin/qmgr; set --qmgr)", qmgr)

    def run(command: str) -> str:
        from gpuslurm.runner import run_command

        return run_command([qmgr, "-c", command], timeout=timeout).stdout

    return run


def default_qmgr(environ: dict[str, str] | None = None) -> str:
    """``$PBS_EXEC/bin/qmgr`` from the pbs.conf PBS itself reads (``PBS_CONF_FILE``, else
    /etc/pbs.conf), else /opt/pbs/bin/qmgr."""
    env = os.environ if environ is None else environ
    conf = env.get("PBS_CONF_FILE") or "/etc/pbs.conf"
    try:
        with open(conf, encoding="utf-8", errors="replace") as handle:
            for line in handle.read(1 << 16).splitlines():
                key, eq, value = line.partition("=")
                if eq and key.strip() == "PBS_EXEC" and os.path.isabs(value.strip()):
                    return os.path.join(value.strip(), "bin", "qmgr")
    except OSError:
        pass
    return DEFAULT_QMGR


def shown(step: QmgrStep) -> str:
    """The qmgr command line as an admin would type it (imports name the shipped file)."""
    return "qmgr -c " + shlex.quote(step.command.replace("{file}", "FILE"))


def plan_install(qmgr: Qmgr, python: str, config: str = "", capture: str = "", *, package_dir: str = "",
                 throttle_file: str = "", contact: str = "") -> list[QmgrStep]:
    """Every step that brings the server to gpuslurm's resources and every hook of
    :data:`HOOK_FILES` (:func:`hook_config`'s arguments); empty when it has them as wanted."""
    steps = plan_resources(qmgr)
    for name in HOOK_FILES:
        steps += plan_hook(name, read_state(qmgr, name), hook_script(name),
                           hook_config(name, python, config, capture, package_dir=package_dir,
                                       throttle_file=throttle_file, contact=contact))
    return steps


def describe(steps: Sequence[QmgrStep], dry_run: bool) -> list[str]:
    """What the install does (``dry_run``: would do), one line a step, or that nothing changes."""
    would = "would " if dry_run else ""
    if not steps:
        return [f"nothing to change: PBS has hook(s) {', '.join(HOOK_FILES)} as wanted"]
    return [f"{would}{step.says}: {shown(step)}" for step in steps]


SCHEDULER_NOTE = ("# the scheduler places ngpus only when sched_config's resources line names it "
                  '(resources: "ncpus, mem, arch, host, vnode, aoe, eoe, ngpus, nmigs": nmigs for MIG '
                  "instances); then kill -HUP pbs_sched. Each pbs_mom publishes its NUMA vnodes when it "
                  "starts or is HUPed.")
