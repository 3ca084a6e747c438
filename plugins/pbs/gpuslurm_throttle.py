"""gpuslurm throttle hook for PBS (pbs_server; events queuejob, modifyjob, movejob, runjob).

Failure policy first: this hook FAILS OPEN. In PBS an unhandled exception or an alarm rejects the
event, so everything here is caught and the job is accepted: a missing, unreadable, oversized or
broken throttle file, a junk line naming the user, gpuslurm not importable, or any error in this
file lets the job through, logged to the server log. Only a decision of gpuslurm's own throttle
(``gpuslurm throttle add|sync``) refuses a job.

What it does (the same throttle file and rules as plugins/job_submit.lua; logic in
``gpuslurm.pbs.throttle``): a throttled user's job that asks for GPUs (``ngpus`` in its select or
job-wide resources) is refused (``reject``), refused above the cap (``cap``), or given a lower
Priority (``priority``, at queuejob). Jobs without GPUs pass. queuejob sees the request before
queue defaults (``default_chunk.ngpus``), so runjob checks again: a reject there leaves the job
queued (backpressure) with the message as its comment. modifyjob checks what the job's owner
asks to change (``qalter``); managers and operators pass.

Configuration: the hook's config file (``qmgr -c "import hook gpuslurm_throttle
application/x-config default FILE"``), JSON:
    {"python_path": ["<dir holding the gpuslurm package>"],
     "throttle_file": "/etc/slurm/gpuslurm-throttle", "contact": "hpc-help@example.org"}
``python_path`` lets pbs_server's interpreter find the installed gpuslurm without PATH or a venv;
``throttle_file`` must be the ``[throttle] file`` that ``gpuslurm throttle`` writes.
"""

import sys
import time

import pbs

DEFAULT_FILE = "/etc/slurm/gpuslurm-throttle"
MAX_CONFIG_BYTES = 65536
SERVICE_USERS = ("root", "PBS_Server", "Scheduler", "pbs_mom")


def _log(message):
    pbs.logmsg(pbs.LOG_WARNING, "gpuslurm_throttle: " + message)


def _config():
    path = getattr(pbs, "hook_config_filename", None)
    if not path:
        return {}
    import json

    with open(path, "rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError("hook config larger than %d bytes" % MAX_CONFIG_BYTES)
    doc = json.loads(data.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("hook config is not a JSON object")
    return doc


def _user(job):
    for value in (job.euser, str(job.Job_Owner or "").split("@", 1)[0]):
        if value:
            return str(value)
    return ""


def _resources(job, fallback=None):
    """(select text or None, job-wide ngpus or None), from ``job``, else from ``fallback``."""
    select = job.Resource_List["select"]
    ngpus = job.Resource_List["ngpus"]
    if fallback is not None:
        select = select if select is not None else fallback.Resource_List["select"]
        ngpus = ngpus if ngpus is not None else fallback.Resource_List["ngpus"]
    return (str(select) if select is not None else None), (int(ngpus) if ngpus is not None else None)


def _decide(e, cfg):
    """(action, message, priority) for this event; ("pass", "", None) when nothing applies."""
    for path in reversed(cfg.get("python_path") or []):
        if isinstance(path, str) and path not in sys.path:
            sys.path.insert(0, path)
    from gpuslurm.pbs import throttle as t

    now = time.time()
    job = e.job
    user = _user(job)
    select, ngpus = _resources(job)
    if e.type == pbs.QUEUEJOB:
        user = user or str(e.requestor or "")
    elif e.type == pbs.MODIFYJOB:
        old = e.job_o
        owner = _user(old)
        if str(e.requestor or "") != owner or owner in SERVICE_USERS:
            return "pass", "", None  # a manager's or the scheduler's change
        if job.Resource_List["select"] is None and job.Resource_List["ngpus"] is None:
            return "pass", "", None  # the change leaves the GPU request alone
        user = owner
        select, ngpus = _resources(job, old)
    elif e.type == pbs.RUNJOB:
        schedselect = job.schedselect
        if schedselect is not None:  # after queue and server defaults: what the job really gets
            select = str(schedselect)
    if not user:
        return "pass", "", None
    tf = t.read_throttles(str(cfg.get("throttle_file") or DEFAULT_FILE))
    throttle = t.throttle_for(tf, user, now)
    if throttle is None:
        return "pass", "", None
    gpus = t.job_gpus(select, ngpus)
    priority = None
    if throttle.mode == "priority" and job.Priority is not None:
        text = str(job.Priority).strip()  # a pbs.priority value, which int() does not take
        priority = int(text) if text.lstrip("-").isdigit() and len(text) < 8 else None
    decision = t.decide(throttle, gpus, priority=priority, contact=str(cfg.get("contact") or ""))
    if decision.action == "priority" and e.type != pbs.QUEUEJOB:
        return "pass", "", None  # Priority is set once, at submission
    return decision.action, decision.message, decision.priority


def main():
    e = pbs.event()
    try:
        action, message, priority = _decide(e, _config())
        if action == "priority":
            e.job.Priority = priority
            _log("lowered the Priority of a GPU job of a throttled user to %d" % priority)
    except SystemExit:
        raise
    except BaseException as exc:  # fail open, whatever went wrong
        _log("internal error, job let through: %s: %s" % (type(exc).__name__, str(exc)[:300]))
        action, message = "pass", ""
    if action == "reject":
        _log("refused a GPU job (%s)" % message[:200])
        e.reject(message)
    e.accept()


main()
