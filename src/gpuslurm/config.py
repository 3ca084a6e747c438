"""gpuslurm's site configuration: ``/etc/gpuslurm/gpuslurm.toml``, or the file ``$GPUSLURM_CONFIG`` names.

Every key is documented in ``docs/config.md``. The hooks and ``pick`` import this on every job,
so it uses only ``os``, :mod:`gpuslurm.tuples` (typing's NamedTuple without importing typing) and
:mod:`gpuslurm.configfile` (where the file is and its text: all the task prolog needs of it);
``tomllib`` is imported only to parse (the hooks keep a parse in a cache,
:mod:`gpuslurm.hooks.cache`) and ``gpuslurm.errors`` only to raise.
A missing default file means all defaults; a file named by ``$GPUSLURM_CONFIG`` must exist.

Over 500 lines on purpose: it is one schema (a NamedTuple per TOML table, each field with its
:class:`Rule`) and the one small generic parser that reads the schema, so a key, its type, its
bounds and its default are read and changed in one place; split, each half would be unreadable.
"""

from __future__ import annotations

import os

from gpuslurm.configfile import DEFAULT_RUN_DIR, config_path, read_config_text
from gpuslurm.configfile import fail as _fail
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ACTIONS = ("drain", "gpu_out", "log", "off")
MPS_TRIGGERS = ("gres", "comment", "feature")
CGROUP_MODES = ("auto", "always", "never")
QUOTA_SOURCES = ("config", "slurm")
VIOLATION_KINDS = ("rogue", "idle", "over-share")

# NamedTuples, not dataclasses: the hooks import this on every job and a frozen dataclass costs
# about five times as much to create. A key's type is its default's type; lists and ranges are
# constrained by the rules below, keyed by "section.key".


class Rule(NamedTuple):
    item: type | None = None  # element type of a list
    choices: tuple[str, ...] | None = None
    lo: float | None = None
    hi: float | None = None
    abspath: bool = False
    empty_ok: bool = False  # with abspath: "" means "none"
    words: tuple[str, ...] = ()  # with abspath: words accepted instead of a path ("auto")
    mapping: bool = False  # a table of free names → ``item`` values, kept as sorted (name, value) pairs


class FaultCheck(NamedTuple):
    """One health check: what to do when it fails (``drain``, ``log``, or ``off`` to skip it)."""

    action: str = "drain"


class TemperatureCheck(NamedTuple):
    action: str = "drain"
    limit_c: int = 85


class XidCheck(NamedTuple):
    action: str = "drain"
    # The Xids NVIDIA's catalog puts on the application (policy.xid's APPLICATION kind: 13 graphics
    # engine exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive cleanup, ...): any
    # user's program raises them at will, and they say nothing about the GPU's health.
    ignore: tuple[int, ...] = (8, 11, 13, 25, 31, 32, 43, 45, 66, 67, 68, 69, 80, 137)


class EccCheck(NamedTuple):
    action: str = "drain"
    max_uncorrectable: int = 0  # volatile uncorrectable errors tolerated


class MemoryCheck(NamedTuple):
    action: str = "drain"
    max_used_mib: int = 1024  # GPU memory still used once the job's processes are gone


class LeftoverCheck(NamedTuple):
    action: str = "drain"
    ignore_users: tuple[str, ...] = ()  # e.g. a site's monitoring account


class HealthConfig(NamedTuple):
    lost_gpu: FaultCheck = FaultCheck()
    xid: XidCheck = XidCheck()
    ecc: EccCheck = EccCheck()
    row_remap: FaultCheck = FaultCheck()
    temperature: TemperatureCheck = TemperatureCheck()
    # hardware clock slowdown (HW slowdown, thermal, power brake): often passing, so logged
    throttle: FaultCheck = FaultCheck("log")
    leftover_processes: LeftoverCheck = LeftoverCheck()
    memory_released: MemoryCheck = MemoryCheck()


class GpuOutConfig(NamedTuple):
    """How a GPU is held out of service in Slurm (``gpu offline``, the monitor, ``health --act``)."""

    job_on_gpu: str = "leave"  # a job running on the failed GPU: leave | notify | requeue
    holder_mem_mib: int = 64  # memory of the holder job that keeps the failed GPU from new jobs
    sbatch: str = "/usr/bin/sbatch"


class PathsConfig(NamedTuple):
    run_dir: str = DEFAULT_RUN_DIR
    state_dir: str = "/var/lib/gpuslurm"
    nvidia_smi: str = "/usr/bin/nvidia-smi"
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    scontrol: str = "/usr/bin/scontrol"
    squeue: str = "/usr/bin/squeue"  # mig apply: jobs still on the node
    sshare: str = "/usr/bin/sshare"  # [detect.share] quota_source = "slurm"
    cgroup_root: str = "/sys/fs/cgroup"
    slurm_cgroup_conf: str = "/etc/slurm/cgroup.conf"
    violations_dir: str = "/var/lib/gpuslurm/violations"  # node monitors write, `throttle sync` reads
    sendmail: str = "/usr/sbin/sendmail"  # [act] alerts by mail (run as `sendmail -t -oi`)
    scancel: str = "/usr/bin/scancel"  # [act.idle] scancel
    sacctmgr: str = "/usr/bin/sacctmgr"  # epilog.admin_comment of a finished job, in slurmdbd
    nvml_library: str = ""  # "": libnvidia-ml.so.1 found by the dynamic loader (hw/live/nvml_lib.py)
    qstat: str = "/opt/pbs/bin/qstat"  # PBS: the jobs on this node (monitor, status)
    pbsnodes: str = "/opt/pbs/bin/pbsnodes"  # PBS: offline / clear a node with a comment
    qmgr: str = "/opt/pbs/bin/qmgr"  # PBS: hooks, max_run_res.ngpus
    qhold: str = "/opt/pbs/bin/qhold"  # PBS: refuse a job (hold, then requeue)
    qrerun: str = "/opt/pbs/bin/qrerun"
    qdel: str = "/opt/pbs/bin/qdel"  # PBS: refuse a job that cannot be requeued
    qalter: str = "/opt/pbs/bin/qalter"

    @property
    def jobs_dir(self) -> str:
        """Where the prolog writes job→GPU maps."""
        return os.path.join(self.run_dir, "jobs")


class MpsConfig(NamedTuple):
    triggers: tuple[str, ...] = ("gres",)
    comment_token: str = "gpuslurm:mps"  # noqa: S105 - a word in --comment, not a secret
    feature: str = "mps"
    active_thread_percentage: int = 100
    pinned_memory_limit_mib: int = 0  # 0: no limit


class CgroupConfig(NamedTuple):
    devices: str = "auto"
    # cgroup v2: the slurmstepd scope in which Slurm's cgroup/v2 plugin makes the job's directory,
    # relative to paths.cgroup_root; "": found (gpuslurm.slurm.cgroup_v2)
    v2_job_parent: str = ""


class EpilogConfig(NamedTuple):
    summary: bool = True
    admin_comment: bool = False
    kill_leftover: bool = True
    kill_grace_s: float = 5.0


class HooksConfig(NamedTuple):
    command_timeout_s: float = 10.0


class MonitorConfig(NamedTuple):
    interval_s: float = 10.0
    db: str = ""  # "": <paths.state_dir>/monitor.db
    db_group: str = ""  # "": the store is root's alone (0600); a group name: 0640 for that group
    raw_window_s: float = 86400.0  # raw samples kept this long, then rolled up per minute
    node_name: str = ""  # "": the host's short name (set it with several slurmd per host)
    squeue_interval_s: float = 60.0  # the squeue fallback runs at most this often
    command_timeout_s: float = 10.0
    admin_comment_interval_s: float = 300.0  # with [epilog] admin_comment: running jobs' AdminComment
    health: bool = True  # check the [health] policy every cycle and act on live faults
    # The kernel log read for Xid lines: "auto" is /dev/kmsg on a live node and none when replaying
    # a bundle (the host's log is not the replayed node's); a path is read either way; "" never.
    kmsg: str = "auto"
    # The metrics server (--prometheus-port): each connection's whole life, and how many at once
    # (lowered to a quarter of RLIMIT_NOFILE), so no client can hold the monitor's descriptors.
    prometheus_timeout_s: float = 10.0
    prometheus_max_connections: int = 64
    # Per-process series (pid and process labels): a series per process and device, so churn
    # that grows with the jobs; off, the exporter gives per-job and per-user process counts.
    prometheus_per_process: bool = False


class RogueDetect(NamedTuple):
    enabled: bool = True
    exempt_users: tuple[str, ...] = ()  # e.g. a monitoring agent's account


HELD_MEMORY = ("idle", "busy")


class IdleDetect(NamedTuple):
    enabled: bool = True
    threshold_pct: float = 5.0
    # GPU memory a job holds at low utilisation: "idle" counts it idle (held, not used), "busy"
    # calls a GPU holding at least held_min_mib not idle (Princeton jobstats' reading)
    held_memory: str = "idle"
    held_min_mib: float = 1024.0
    window_s: float = 1800.0
    grace_s: float = 600.0
    min_samples: int = 3
    min_coverage: float = 0.8


class ShareDetect(NamedTuple):
    enabled: bool = True
    threshold_pct: float = 80.0
    duration_s: float = 600.0
    min_samples: int = 3
    min_coverage: float = 0.8
    quota_source: str = "config"
    slurm_cluster_gpus: int = 0  # the GPUs Slurm's shares divide; 0: read shares as node fractions
    slurm_refresh_s: float = 300.0  # sshare runs at most this often
    default_quota: float = 1.0  # 1.0: nobody is over quota unless users/accounts/Slurm say so
    users: tuple[tuple[str, float], ...] = ()
    accounts: tuple[tuple[str, float], ...] = ()


class DefensiveDetect(NamedTuple):
    enabled: bool = True
    fraction: float = 0.3
    window_s: float = 600.0
    lookback_s: float = 7200.0
    kinds: tuple[str, ...] = VIOLATION_KINDS
    idle_threshold_factor: float = 2.0
    idle_window_factor: float = 0.5
    share_threshold_factor: float = 0.75
    share_duration_factor: float = 0.5


class DetectConfig(NamedTuple):
    rogue: RogueDetect = RogueDetect()
    idle: IdleDetect = IdleDetect()
    share: ShareDetect = ShareDetect()
    defensive: DefensiveDetect = DefensiveDetect()


THROTTLE_MODES = ("reject", "cap", "priority")


class AutoThrottleConfig(NamedTuple):
    """``gpuslurm throttle auto``: per-user GrpTRES limits from the load (docs/throttle.md)."""

    backoff_s: float = 300.0  # the load stays low this long before a limit eases
    backoff_max_s: float = 3600.0  # the back-off doubles on each flap, up to this
    exempt_users: tuple[str, ...] = ("root",)
    utilisation_source: str = ""  # "": none; "prometheus:URL": the node monitors' exporters
    band_low: float = 0.6  # the utilisation band the controller holds
    band_high: float = 0.8
    band_gain: float = 0.5  # how far a limit moves per unit of relative error


class ThrottleConfig(NamedTuple):
    file: str = "/etc/slurm/gpuslurm-throttle"  # read by plugins/job_submit.lua on the controller
    contact: str = ""  # whom a throttled user should ask; "" lets the plugin say "your administrators"
    cap_gpus: int = 1
    nice: int = 10000
    sync_kinds: tuple[str, ...] = ("rogue",)
    sync_mode: str = "reject"
    sync_minutes: float = 120.0  # fractions allowed (tests use seconds)
    auto: AutoThrottleConfig = AutoThrottleConfig()


class ActRogue(NamedTuple):
    log: bool = True
    alert: bool = True
    alert_user: bool = False
    kill: bool = False  # also needs [act] dry_run = false
    kill_root: bool = False
    kill_grace_s: float = 10.0


class ActIdle(NamedTuple):
    log: bool = True
    alert: bool = True
    alert_user: bool = False
    scancel: bool = False  # also needs [act] dry_run = false
    warnings: int = 3
    warning_interval_s: float = 900.0


class ActShare(NamedTuple):
    log: bool = True
    alert: bool = True
    alert_user: bool = False


class ActConfig(NamedTuple):
    dry_run: bool = True  # kill and scancel only say what they would do
    log_file: str = ""  # "": <paths.state_dir>/actions.jsonl
    syslog: str = "/dev/log"  # the syslog socket; "": no syslog
    log_interval_s: float = 600.0  # an ongoing violation is logged again this often
    alert_interval_s: float = 3600.0  # at most one alert per violation this often
    mail_to: tuple[str, ...] = ()
    mail_from: str = ""
    user_domain: str = ""  # a user's address: <user>@<user_domain>, or the bare name when ""
    webhook: str = ""
    timeout_s: float = 10.0
    exempt_users: tuple[str, ...] = ()  # never killed, never cancelled
    rogue: ActRogue = ActRogue()
    idle: ActIdle = ActIdle()
    share: ActShare = ActShare()


class JobstatsConfig(NamedTuple):
    """``gpuslurm jobstats`` (docs/jobstats.md): who sees every job, and the site's words."""

    admin_groups: tuple[str, ...] = ()  # members see every job; root always does
    # where the monitor leaves each job's figures for its owner: "": <paths.state_dir>/jobstats
    dir: str = ""
    write_interval_s: float = 300.0  # a running job's file is refreshed this often
    keep_days: float = 30.0  # an ended job's file is removed this long after its last write; 0: never
    offers: tuple[tuple[str, float], ...] = ()  # smaller GPUs / MIG profiles here: name -> GiB
    notes: tuple[tuple[str, str], ...] = ()  # note kind (idle, busy-then-idle, smaller, all) -> text
    links: tuple[str, ...] = ()


class NotifyConfig(NamedTuple):
    """End-of-job messages to a job's user (docs/notify.md): off unless ``enabled``."""

    enabled: bool = False
    verdicts: tuple[str, ...] = ("idle GPUs",)  # jobstats verdicts that get a message
    below_util_pct: float = 0.0  # also a job whose GPUs' mean utilisation is below this; 0: off
    min_job_s: float = 1800.0  # shorter jobs get none
    channels: tuple[str, ...] = ("mail",)  # mail, webhook
    mail_domain: str = ""  # the user's address: <name of the job's uid>@mail_domain ...
    addresses: tuple[tuple[str, str], ...] = ()  # ... unless this table names one: user -> address
    mail_from: str = ""
    mail_template: str = ""  # "": the built-in text (packaging/notify/mail.txt.j2 is the same)
    webhook_url: str = ""  # the config is readable by users (pick reads it): a secret URL goes in ...
    webhook_url_file: str = ""  # ... this file instead, root's and readable by root alone
    webhook_template: str = ""  # a jinja2 file rendering the JSON body (packaging/notify/)
    per_user_max: int = 2  # messages per user ...
    per_user_window_s: float = 3600.0  # ... in this window, kept across restarts
    timeout_s: float = 10.0  # sendmail's run, the webhook's POST
    queue: int = 100  # messages waiting for the sender thread; more are dropped, each logged


SCHEDULER_KINDS = ("auto", "slurm", "pbs")


class SchedulerConfig(NamedTuple):
    kind: str = "auto"  # auto: PBS when paths.qstat runs and squeue does not, else Slurm


class Config(NamedTuple):
    """The whole configuration; every section has defaults."""

    health: HealthConfig = HealthConfig()
    gpu_out: GpuOutConfig = GpuOutConfig()
    paths: PathsConfig = PathsConfig()
    mps: MpsConfig = MpsConfig()
    cgroup: CgroupConfig = CgroupConfig()
    epilog: EpilogConfig = EpilogConfig()
    hooks: HooksConfig = HooksConfig()
    monitor: MonitorConfig = MonitorConfig()
    detect: DetectConfig = DetectConfig()
    throttle: ThrottleConfig = ThrottleConfig()
    act: ActConfig = ActConfig()
    jobstats: JobstatsConfig = JobstatsConfig()
    notify: NotifyConfig = NotifyConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    source: str | None = None  # the file read; None when all defaults


_ACTION = Rule(choices=ACTIONS)
RULES: dict[str, Rule] = {
    **{f"health.{name}.action": _ACTION for name in HealthConfig._fields},
    "health.temperature.limit_c": Rule(lo=1, hi=200),
    "health.xid.ignore": Rule(item=int, lo=0),
    "health.ecc.max_uncorrectable": Rule(lo=0),
    "health.memory_released.max_used_mib": Rule(lo=0),
    "health.leftover_processes.ignore_users": Rule(item=str),
    **{f"paths.{name}": Rule(abspath=True) for name in PathsConfig._fields},
    "monitor.kmsg": Rule(abspath=True, empty_ok=True, words=("auto",)),
    "gpu_out.job_on_gpu": Rule(choices=("leave", "notify", "requeue")),
    "gpu_out.holder_mem_mib": Rule(lo=1, hi=1 << 20),
    "gpu_out.sbatch": Rule(abspath=True),
    "paths.nvml_library": Rule(abspath=True, empty_ok=True),
    "mps.triggers": Rule(item=str, choices=MPS_TRIGGERS),
    "mps.active_thread_percentage": Rule(lo=1, hi=100),
    "mps.pinned_memory_limit_mib": Rule(lo=0),
    "cgroup.devices": Rule(choices=CGROUP_MODES),
    "scheduler.kind": Rule(choices=SCHEDULER_KINDS),
    "epilog.kill_grace_s": Rule(lo=0, hi=600),
    "hooks.command_timeout_s": Rule(lo=0.1, hi=600),
    "monitor.interval_s": Rule(lo=0.05, hi=3600),
    "monitor.raw_window_s": Rule(lo=60, hi=366 * 86400),
    "monitor.squeue_interval_s": Rule(lo=1, hi=86400),
    "monitor.command_timeout_s": Rule(lo=0.1, hi=600),
    "monitor.admin_comment_interval_s": Rule(lo=1, hi=7 * 86400),
    "monitor.prometheus_timeout_s": Rule(lo=0.1, hi=300),
    "monitor.prometheus_max_connections": Rule(lo=1, hi=4096),
    "throttle.file": Rule(abspath=True),
    "throttle.cap_gpus": Rule(lo=1, hi=1_000_000),
    "throttle.nice": Rule(lo=1, hi=2147483645),
    "throttle.sync_kinds": Rule(item=str, choices=("rogue", "idle", "over-share")),
    "throttle.sync_mode": Rule(choices=THROTTLE_MODES),
    "throttle.sync_minutes": Rule(lo=0.1, hi=366 * 24 * 60),
    "throttle.auto.backoff_s": Rule(lo=1, hi=7 * 86400),
    "throttle.auto.backoff_max_s": Rule(lo=1, hi=30 * 86400),
    "throttle.auto.exempt_users": Rule(item=str),
    "throttle.auto.band_low": Rule(lo=0, hi=1),
    "throttle.auto.band_high": Rule(lo=0, hi=1),
    "throttle.auto.band_gain": Rule(lo=0, hi=10),
    "detect.rogue.exempt_users": Rule(item=str),
    "act.log_interval_s": Rule(lo=1, hi=7 * 86400),
    "act.alert_interval_s": Rule(lo=0, hi=30 * 86400),
    "act.mail_to": Rule(item=str),
    "act.timeout_s": Rule(lo=0.1, hi=600),
    "act.exempt_users": Rule(item=str),
    "act.rogue.kill_grace_s": Rule(lo=0, hi=600),
    "act.idle.warnings": Rule(lo=0, hi=1000),
    "act.idle.warning_interval_s": Rule(lo=0, hi=7 * 86400),
    **{f"detect.{s}.threshold_pct": Rule(lo=0, hi=100) for s in ("idle", "share")},
    **{f"detect.{s}.min_samples": Rule(lo=1, hi=100000) for s in ("idle", "share")},
    **{f"detect.{s}.min_coverage": Rule(lo=0, hi=1) for s in ("idle", "share")},
    "detect.idle.window_s": Rule(lo=1, hi=7 * 86400),
    "detect.idle.held_memory": Rule(choices=HELD_MEMORY),
    "detect.idle.held_min_mib": Rule(lo=0, hi=1 << 24),
    "detect.idle.grace_s": Rule(lo=0, hi=7 * 86400),
    "detect.share.duration_s": Rule(lo=1, hi=7 * 86400),
    "detect.share.quota_source": Rule(choices=QUOTA_SOURCES),
    "detect.share.slurm_cluster_gpus": Rule(lo=0, hi=10_000_000),
    "detect.share.slurm_refresh_s": Rule(lo=10, hi=86400),
    "detect.share.default_quota": Rule(lo=0, hi=1),
    **{f"detect.share.{k}": Rule(item=float, lo=0, hi=1, mapping=True) for k in ("users", "accounts")},
    "jobstats.admin_groups": Rule(item=str),
    "jobstats.dir": Rule(abspath=True, empty_ok=True),
    "jobstats.write_interval_s": Rule(lo=10, hi=86400),
    "jobstats.keep_days": Rule(lo=0, hi=3650),
    "jobstats.offers": Rule(item=float, lo=0.1, hi=1 << 20, mapping=True),
    "jobstats.notes": Rule(item=str, mapping=True),
    "jobstats.links": Rule(item=str),
    "notify.verdicts": Rule(item=str, choices=("idle GPUs", "room to improve")),
    "notify.below_util_pct": Rule(lo=0, hi=100),
    "notify.min_job_s": Rule(lo=0, hi=366 * 86400),
    "notify.channels": Rule(item=str, choices=("mail", "webhook")),
    "notify.addresses": Rule(item=str, mapping=True),
    "notify.mail_template": Rule(abspath=True, empty_ok=True),
    "notify.webhook_template": Rule(abspath=True, empty_ok=True),
    "notify.webhook_url_file": Rule(abspath=True, empty_ok=True),
    "notify.per_user_max": Rule(lo=0, hi=1000),
    "notify.per_user_window_s": Rule(lo=60, hi=30 * 86400),
    "notify.timeout_s": Rule(lo=0.1, hi=120),
    "notify.queue": Rule(lo=1, hi=10000),
    "detect.defensive.fraction": Rule(lo=0, hi=1),
    "detect.defensive.window_s": Rule(lo=1, hi=7 * 86400),
    "detect.defensive.lookback_s": Rule(lo=1, hi=30 * 86400),
    "detect.defensive.kinds": Rule(item=str, choices=VIOLATION_KINDS),
    "detect.defensive.idle_threshold_factor": Rule(lo=1, hi=100),
    **{f"detect.defensive.{k}_factor": Rule(lo=0.01, hi=1)
       for k in ("idle_window", "share_threshold", "share_duration")},
}


def load_config(path: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the config file (``path``, else ``$GPUSLURM_CONFIG``, else the default)."""
    explicit = path is not None
    if path is None:
        path, explicit = config_path(environ)
    text = read_config_text(path, explicit)
    return Config() if text is None else parse_config(text, path)


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse TOML text into a Config; any mistake is one InputError naming ``source``."""
    return config_from_doc(parse_toml(text, source), source)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document in ``text``; InputError naming ``source`` when it is not TOML."""
    import tomllib  # only here: the hooks usually find the parse in their cache

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _fail(f"not valid TOML: {str(exc).splitlines()[0]}", source)


def config_from_doc(doc: Mapping[str, Any], source: str) -> Config:
    """A Config from a parsed TOML document, every key checked."""
    cfg: Config = _build(Config, doc, "", source)
    return cfg._replace(source=source)


def _build(cls: Any, table: Mapping[str, Any], where: str, source: str) -> Any:
    defaults: dict[str, Any] = cls._field_defaults
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in defaults or (not where and key == "source"):
            _fail(f"unknown key {key!r} in [{where}]" if where else f"unknown section [{key}]", source)
        name = f"{where}.{key}" if where else key
        default = defaults[key]
        if hasattr(default, "_fields"):
            if not isinstance(value, dict):
                _fail(f"[{name}] must be a table, not {_describe(value)}", source)
            values[key] = _build(type(default), value, name, source)
            continue
        rule = RULES.get(name, Rule())
        label = f"{key} in [{where}]"
        if rule.mapping:
            if not isinstance(value, dict):
                _fail(f"{label} must be a table, not {_describe(value)}", source)
            assert rule.item is not None, name
            values[key] = tuple(sorted((k, _scalar(rule.item, rule, v, f"{k!r} in [{name}]", source))
                                       for k, v in value.items()))
            continue
        if isinstance(default, tuple):
            if not isinstance(value, list):
                _fail(f"{label} must be a list, not {_describe(value)}", source)
            assert rule.item is not None, name
            values[key] = tuple(_scalar(rule.item, rule, item, f"{label} (item {i + 1})", source)
                                for i, item in enumerate(value))
        else:
            values[key] = _scalar(type(default), rule, value, label, source)
    return cls(**values)


_INT_LIMIT = 2**63 - 1  # what a C long holds: sqlite, time_t and Slurm all stop there


def _scalar(kind: type, rule: Rule, value: Any, label: str, source: str) -> Any:
    if kind is bool:
        ok = isinstance(value, bool)
        want = "true or false"
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        want = "an integer"
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        want = "a number"
    else:
        ok = isinstance(value, str)
        want = "a string"
    if not ok:
        _fail(f"{label} must be {want}, not {_describe(value)}", source)
    if kind is float:
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):  # NaN slips past every bound
            _fail(f"{label} must be a finite number, not {value!r}", source)
    elif kind is int and not -_INT_LIMIT <= value <= _INT_LIMIT:
        _fail(f"{label} must be between {-_INT_LIMIT} and {_INT_LIMIT}, not {value!r}", source)
    if rule.choices is not None and value not in rule.choices:
        _fail(f"{label} must be one of {', '.join(rule.choices)}, not {value!r}", source)
    lo, hi = rule.lo, rule.hi
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        _fail(f"{label} must be {bounds}, not {value!r}", source)
    if rule.abspath and not value.startswith("/") and not (rule.empty_ok and value == "") \
            and value not in rule.words:
        _fail(f"{label} must be an absolute path, not {value!r}", source)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)
