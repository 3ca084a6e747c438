# gpuslurm's PBS hook: pbs_mom runs it in PBS's own Python (pbs_python) at exechost_startup,
# execjob_begin, execjob_launch, execjob_attach and execjob_end. It cannot import gpuslurm: it turns
# the event into a small JSON request, runs
#     <python> -I -c 'from gpuslurm.pbs.entry import run; run()' <event>
# with it on stdin (absolute paths, no shell, a minimal environment, a timeout below the hook's
# alarm) and applies the JSON answer: accept or reject with a message, the task's environment,
# vnode resources, vnodes to take offline with a comment.
#
# Its config is imported beside it (`qmgr -c "import hook gpuslurm application/x-config default
# FILE.json"`; `gpuslurm install --pbs` does all of it):
#     {"python": "/abs/python", "config": "/etc/gpuslurm/gpuslurm.toml", "capture": "", "timeout": 20}
#
# Failure policy: when gpuslurm cannot answer (the config is broken, it crashes, it times out, its
# answer does not parse), execjob_begin, execjob_launch and execjob_attach are rejected (fail
# closed: the job does not start, or the task does not run, with GPUs nobody checked or confined);
# exechost_startup and execjob_end are accepted and the failure is logged (bookkeeping must never
# stop a node or a job's end). Every exception is caught here: an unhandled one or the alarm
# would make PBS reject even the bookkeeping events.
#
# Written for any Python 3 PBS may embed (3.6 and later): no walrus, no gpuslurm, stdlib only.

import json
import os
import signal
import subprocess
import time

import pbs

CODE = "from gpuslurm.pbs.entry import run; run()"
FORMAT = 1
FAIL_CLOSED = ("execjob_begin", "execjob_launch", "execjob_attach")
EVENT_NAMES = {}
for _name in ("exechost_startup", "execjob_begin", "execjob_launch", "execjob_attach", "execjob_end"):
    if hasattr(pbs, _name.upper()):
        EVENT_NAMES[getattr(pbs, _name.upper())] = _name
MAX_CONFIG = 1 << 16
MAX_ANSWER = 1 << 20
MAX_TEXT = 1 << 16
MAX_LOG_LINES = 40
DEFAULT_TIMEOUT = 20.0
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class NoAnswerError(Exception):
    """gpuslurm could not answer; the message says why, in one line."""


def log(message, error=False):
    try:
        pbs.logmsg(pbs.EVENT_ERROR if error else pbs.EVENT_DEBUG, "gpuslurm hook: %s" % message)
    except Exception:
        pass


def one_line(text, limit=500):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_config():
    """The hook's config (see the top of this file); NoAnswerError when it is missing or broken."""
    path = getattr(pbs, "hook_config_filename", None)
    if not path:
        raise NoAnswerError("no hook config: import one with `gpuslurm install --pbs`")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG + 1)
    except (IOError, OSError) as exc:
        raise NoAnswerError("cannot read the hook config %s: %s" % (path, exc)) from None
    if len(raw) > MAX_CONFIG:
        raise NoAnswerError("the hook config is larger than %d bytes" % MAX_CONFIG)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise NoAnswerError("the hook config is not JSON: %s" % one_line(exc)) from None
    if not isinstance(doc, dict):
        raise NoAnswerError("the hook config must be a JSON object")
    python = doc.get("python")
    if not isinstance(python, str) or not os.path.isabs(python):
        raise NoAnswerError("the hook config's python must be an absolute path, not %r" % (python,))
    for key in ("config", "capture"):
        value = doc.get(key, "")
        if not isinstance(value, str) or (value and not os.path.isabs(value)):
            raise NoAnswerError("the hook config's %s must be an absolute path or empty" % key)
    timeout = doc.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise NoAnswerError("the hook config's timeout must be a number of seconds")
    return doc


def text(value):
    """A PBS attribute as a bounded one-line string, or None."""
    if value is None:
        return None
    value = str(value)
    if not value or len(value) > MAX_TEXT or "\n" in value:
        return None
    return value


def cgroups_hook_enabled():
    """Whether PBS's own cgroups hook is enabled on this host (its .HK file in mom_priv/hooks)."""
    home = pbs.pbs_conf.get("PBS_HOME") if hasattr(pbs, "pbs_conf") else None
    if not home:
        return False
    try:
        with open(os.path.join(home, "mom_priv", "hooks", "pbs_cgroups.HK")) as handle:
            lines = handle.read(MAX_CONFIG).splitlines()
    except (IOError, OSError):
        return False
    return any(line.replace(" ", "").lower() == "enabled=true" for line in lines)


def job_resource(job, name):
    """The job's Resource_List[name] as text, or None (unset, or no such resource on the server)."""
    try:
        value = job.Resource_List[name]
    except Exception as exc:
        log("job %s: no Resource_List.%s (%s)" % (job.id, name, one_line(exc)))
        return None
    log("job %s: Resource_List.%s = %r" % (job.id, name, value))
    return text(value)


def make_request(event, name):
    """The JSON request for gpuslurm.pbs.request (format 1)."""
    req = {"format": FORMAT, "event": name, "hostname": pbs.get_local_nodename()}
    try:
        req["vnodes"] = sorted(event.vnode_list.keys())[:4096]
    except Exception:
        pass
    if name != "exechost_startup":
        job = event.job
        req["job_id"] = text(job.id)
        req["euser"] = text(job.euser)
        req["exec_vnode"] = text(job.exec_vnode)
        req["exec_host"] = text(job.exec_host) or text(getattr(job, "exec_host2", None))  # mom: only 2
        req["pbs_cgroups"] = cgroups_hook_enabled()
        if name == "execjob_begin":  # qsub -l gpuslurm_mps=true: the job's own MPS daemon
            req["mps"] = job_resource(job, "gpuslurm_mps")
        if name == "execjob_launch":
            req["pid"] = os.getppid()  # pbs_mom's child that becomes the task runs this hook
        elif name == "execjob_attach":
            req["pid"] = int(event.pid)
    return {key: value for key, value in req.items() if value is not None}


def run_gpuslurm(config, name, request):
    """gpuslurm's answer (a dict) and its log lines; NoAnswerError when it has none."""
    env = {"PATH": PATH, "LANG": "C.UTF-8"}
    if config.get("config"):
        env["GPUSLURM_CONFIG"] = config["config"]
    if config.get("capture"):
        env["GPUSLURM_CAPTURE"] = config["capture"]
    timeout = float(config.get("timeout", DEFAULT_TIMEOUT))
    argv = [config["python"], "-I", "-c", CODE, name]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd="/", close_fds=True,
                                start_new_session=True)
    except (IOError, OSError) as exc:
        raise NoAnswerError("cannot run %s: %s" % (config["python"], exc)) from None
    try:
        out, err = proc.communicate(json.dumps(request).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # gpuslurm and whatever it started
        except OSError:
            pass
        proc.communicate()
        raise NoAnswerError("gpuslurm did not answer within %gs (killed)" % timeout) from None
    lines = [one_line(line) for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    if proc.returncode != 0:
        why = lines[-1] if lines else "no message"
        raise NoAnswerError("gpuslurm failed (exit %s): %s" % (proc.returncode, why), lines[:-1])
    if len(out) > MAX_ANSWER:
        raise NoAnswerError("gpuslurm's answer is larger than %d bytes" % MAX_ANSWER, lines)
    try:
        answer = json.loads(out.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise NoAnswerError("gpuslurm's answer is not JSON: %s" % one_line(exc), lines) from None
    if not isinstance(answer, dict) or answer.get("format") != FORMAT:
        raise NoAnswerError("gpuslurm's answer is not format %d" % FORMAT, lines)
    return answer, lines


def offline(event, vnode, comment):
    """Take ``vnode`` offline with ``comment``: through the event, else with qmgr (which needs this
    host's root to be a PBS manager; pbsnodes -o names hosts, not vnodes like HOST[n])."""
    try:
        vnodes = event.vnode_list
        if vnode not in vnodes:
            vnodes[vnode] = pbs.vnode(vnode)
        vnodes[vnode].state = pbs.ND_OFFLINE
        vnodes[vnode].comment = comment
        log("vnode %s offline: %s" % (vnode, comment), error=True)
        return
    except Exception as exc:
        log("cannot take vnode %s offline through the event (%s): trying qmgr" % (vnode, exc),
            error=True)
    qmgr = os.path.join(pbs.pbs_conf.get("PBS_EXEC", "/opt/pbs"), "bin", "qmgr")
    quoted = comment.replace('"', "'")
    try:
        subprocess.run([qmgr, "-c", 'set node %s state += offline, comment = "%s"' % (vnode, quoted)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=10, check=True)
        log("vnode %s offline (qmgr): %s" % (vnode, comment), error=True)
    except Exception as exc:
        log("cannot take vnode %s offline with qmgr either: %s" % (vnode, one_line(exc)), error=True)


def set_resources(event, vnode, resources):
    vnodes = event.vnode_list
    if vnode not in vnodes:
        vnodes[vnode] = pbs.vnode(vnode)
    available = vnodes[vnode].resources_available
    for key in ("ncpus", "ngpus"):
        if isinstance(resources.get(key), int):
            available[key] = resources[key]
    if isinstance(resources.get("mem"), str):
        available["mem"] = pbs.size(resources["mem"])
    if isinstance(resources.get("nmigs"), int):  # last: a server without the resource refuses it
        available["nmigs"] = resources["nmigs"]


def apply(event, name, answer):
    """Apply gpuslurm's answer: vnodes, offline, environment; then accept or reject."""
    for vnode, resources in sorted((answer.get("vnodes") or {}).items()):
        try:
            set_resources(event, vnode, resources)
        except Exception as exc:
            log("cannot publish vnode %s's resources: %s" % (vnode, one_line(exc)), error=True)
    for vnode, comment in sorted((answer.get("offline") or {}).items()):
        offline(event, str(vnode), one_line(comment, 1000))
    env = answer.get("env") or {}
    if env and name == "execjob_launch":
        for key, value in sorted(env.items()):
            # pbs_env separates variables with commas: one inside a value is escaped
            event.env[str(key)] = str(value).replace(",", "\\,")
    if answer.get("accept") is False:
        event.reject(one_line(answer.get("message") or "gpuslurm refused the job on this host", 1000))
    event.accept()


def main():
    event = pbs.event()
    name = EVENT_NAMES.get(event.type)
    if name is None:
        log("not an event gpuslurm handles (type %s): accepted" % event.type)
        event.accept()
    started = time.time()
    try:
        config = read_config()
        answer, lines = run_gpuslurm(config, name, make_request(event, name))
    except NoAnswerError as exc:
        for line in (exc.args[1] if len(exc.args) > 1 else [])[-MAX_LOG_LINES:]:
            log(line)
        message = "gpuslurm %s: %s" % (name, exc.args[0])
        log(message, error=True)
        if name in FAIL_CLOSED:
            event.reject(one_line(message, 1000))
        event.accept()
    except Exception as exc:  # a bug here, or an odd event: the same policy
        message = "gpuslurm %s: hook error: %s: %s" % (name, type(exc).__name__, one_line(exc))
        log(message, error=True)
        if name in FAIL_CLOSED:
            event.reject(message)
        event.accept()
    for line in lines[-MAX_LOG_LINES:]:
        log(line)
    log("%s answered in %.3fs" % (name, time.time() - started))
    try:
        apply(event, name, answer)
    except SystemExit:
        raise  # accept() and reject() end the hook this way
    except Exception as exc:
        message = "gpuslurm %s: cannot apply the answer: %s: %s" % (name, type(exc).__name__, one_line(exc))
        log(message, error=True)
        if name in FAIL_CLOSED:
            event.reject(message)
        event.accept()


main()
