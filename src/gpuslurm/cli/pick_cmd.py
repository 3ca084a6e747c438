"""``gpuslurm pick N``: choose GPUs (or MIG devices) for a command, topology first, then load.

This module is the whole command: its own argument parser, no click (``gpuslurm pick`` starts
here from :mod:`gpuslurm.cli.fast` before click is imported; a placement helper run in front of
every job step must cost little more than the interpreter). It parses the options, asks
:func:`gpuslurm.watch.pick.pick_for_job` (the node, the job's own GPUs through the scheduler
adapters, the live load, the engine), and prints or execs. See docs/pick.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuslurm.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_UNSATISFIED,
    EXIT_WAIT_TIMEOUT,
    InputError,
    run_entry,
)
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # not typing's: see gpuslurm.tuples

if TYPE_CHECKING:
    from typing import Any, NoReturn, TextIO, TypeVar

    from gpuslurm.hw.model.node import Node
    from gpuslurm.place.engine import Placement
    from gpuslurm.place.request import Request

    _T = TypeVar("_T")

MAX_WAIT_S = 366 * 86400.0  # --timeout and --poll
WAIT_MAX_UTIL = 10.0  # --wait: a GPU is free when no one else's process is on it and util <= this
FORMATS = ("env", "json", "explain")

USAGE = """\
usage: gpuslurm pick N [--from DIR] [--mem SIZE] [--min-cc X.Y] [--type TEXT] [--mig PROFILE]
                       [--exclusive] [--max-util PCT] [--format env|json|explain]
                       [--wait [--timeout DUR] [--poll DUR]] [-- CMD ARGS...]

Choose N GPUs (or N MIG devices with --mig) of this node, or of the job's own GPUs inside a
Slurm job: only healthy ones meeting every constraint; the strongest weakest link first
(NV#, PIX, PXB, PHB, NODE, SYS), then fewest NUMA nodes, most NVLinks, most free (memory,
utilisation), lowest index. Prints shell exports (env: one per line; `unset GPUSLURM_CPUS`
when the node facts give no local CPUs), JSON, or the ranking in words; with -- CMD, runs CMD
with CUDA_VISIBLE_DEVICES set and its CPUs narrowed to the GPUs' local CPUs.

  --from DIR|NAME   replay a capture bundle (dgx-h100, l40s-4x, a100-mig) instead of NVML;
                    live load from $GPUSLURM_SCENARIO or the bundle's scenario.json
  --mem SIZE        free memory per device, e.g. 6GiB, 512MiB, 40G
  --min-cc X.Y      minimum compute capability
  --type TEXT       the GPU name contains TEXT (case-insensitive), e.g. h100
  --mig PROFILE     MIG devices of PROFILE (e.g. 1g.10gb), one per rank: env prints rank k's
                    two export lines as lines 2k+2 and 2k+3
  --exclusive       no process of another user or job on a chosen device
  --max-util PCT    utilisation at most PCT percent
  --format F        env (default), json, explain
  --wait            wait until a set is free (no one else's process, util <= --max-util, default
                    10); --timeout DUR (default: forever), --poll DUR (default 5s)

exit: 0 picked; 2 bad input; 3 hardware; 5 nothing satisfies; 6 --wait timed out; 130 Ctrl-C"""


class PickArgs(NamedTuple):
    n: int
    source: str | None = None
    mem: str | None = None
    min_cc: str | None = None
    type_text: str | None = None
    mig: str | None = None
    exclusive: bool = False
    max_util: str | None = None
    fmt: str = "env"
    wait: bool = False
    timeout: str | None = None
    poll: str | None = None
    command: tuple[str, ...] = ()


_VALUED = {"--from": "source", "--mem": "mem", "--min-cc": "min_cc", "--type": "type_text",
           "--mig": "mig", "--max-util": "max_util", "--format": "fmt", "--timeout": "timeout",
           "--poll": "poll"}
_FLAGS = {"--exclusive": "exclusive", "--wait": "wait"}
OPTION_NAMES = (*_VALUED, *_FLAGS, "--help")  # what shell completion offers after `gpuslurm pick`


class HelpRequested(Exception):  # noqa: N818 - a signal, not an error
    pass


def parse_args(argv: Sequence[str]) -> PickArgs:
    """Parse pick's command line; InputError (exit 2) names the option at fault."""
    values: dict[str, Any] = {}  # each option's own type, checked by PickArgs
    positional: list[str] = []
    command: tuple[str, ...] = ()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            command = tuple(argv[i + 1:])
            if not command:
                raise InputError("'--' must be followed by a command")
            break
        if arg in ("-h", "--help"):
            raise HelpRequested
        name, eq, inline = arg.partition("=")
        if name in _VALUED:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise InputError("needs a value", name)
            values[_VALUED[name]] = value
        elif arg in _FLAGS:
            values[_FLAGS[arg]] = True
        elif arg.startswith("-") and not arg.lstrip("-").isdigit():
            raise InputError(f"no such option {arg!r} (see 'gpuslurm pick --help')")
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 1:
        raise InputError("expects exactly one N, the number of GPUs (see 'gpuslurm pick --help')")
    text = positional[0]
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise InputError(f"N must be a whole number of at least 1, not {text!r}")
    args = PickArgs(int(text), command=command, **values)
    if args.fmt not in FORMATS:
        raise InputError(f"must be one of {', '.join(FORMATS)}, not {args.fmt!r}", "--format")
    if not args.wait and (args.timeout is not None or args.poll is not None):
        raise InputError("--timeout and --poll need --wait")
    if args.command and args.mig is not None and args.n != 1:
        raise InputError("with --mig, -- CMD takes N = 1: one CUDA process uses one MIG device "
                         "(run one pick per rank)")
    return args


def build_request(args: PickArgs) -> Request:
    """The engine's request from the options; each bad value is an InputError naming its option."""
    from gpuslurm.hw.model.node import MIG_PROFILE_RE
    from gpuslurm.place.request import Request, parse_cc, parse_percent, parse_size_mib

    def parsed(option: str, fn: Callable[[str], _T], text: str | None) -> _T | None:
        if text is None:
            return None
        try:
            return fn(text)
        except ValueError as exc:
            raise InputError(str(exc), option) from None

    if args.mig is not None and not MIG_PROFILE_RE.match(args.mig):
        raise InputError(f"not a MIG profile: {args.mig!r} (e.g. 1g.10gb, 3g.40gb)", "--mig")
    if args.type_text is not None and not args.type_text.strip():
        raise InputError("must not be empty", "--type")
    max_util = parsed("--max-util", parse_percent, args.max_util)
    if max_util is None and args.wait:
        max_util = WAIT_MAX_UTIL
    return Request(args.n, mem_mib=parsed("--mem", parse_size_mib, args.mem),
                   min_cc=parsed("--min-cc", parse_cc, args.min_cc), type_text=args.type_text,
                   mig_profile=args.mig, exclusive=args.exclusive or args.wait, max_util=max_util)


def write_result(node: Node, placement: Placement, fmt: str, out: TextIO, err: TextIO) -> None:
    """Print the chosen set in ``fmt`` (the placement has a chosen set)."""
    from gpuslurm.place.explain import explain_lines, local_cpus
    from gpuslurm.ranges import format_ranges

    win = placement.chosen
    assert win is not None
    cpus = local_cpus(node, win.devices)
    if fmt == "explain":
        out.write("\n".join(explain_lines(node, placement)) + "\n")
    elif fmt == "json":
        import json

        gpus = []
        for d in win.devices:
            item: dict[str, object] = {"index": d.gpu.index, "minor": d.gpu.minor, "uuid": d.uuid,
                                    "numa_node": d.gpu.numa_node, "name": d.gpu.name}
            if d.mig is not None:
                item.update(gpu_uuid=d.gpu.uuid, mig_index=d.mig.index, profile=d.mig.profile)
            gpus.append(item)
        from gpuslurm.jsondoc import document

        doc = document("pick", {"gpus": gpus, "cpus": format_ranges(within_allowed(cpus.os_cpus)),
               "numa_nodes": list(cpus.numa_nodes),
               "slurm_cores": None if cpus.slurm_cores is None else format_ranges(cpus.slurm_cores),
               "weakest_link": win.weakest_link, "score": round(win.availability, 4),
               "runners_up": [{"uuids": [d.uuid for d in r.devices], "weakest_link": r.weakest_link,
                               "score": round(r.availability, 4)} for r in placement.runners_up]},
                       node.hostname)
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        if win.devices[0].mig is None:
            values = env_values(node, placement)
        else:  # a block of two lines per rank: rank k evaluates lines 2k + 2 and 2k + 3
            values = [("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
            for d in win.devices:
                values += [("CUDA_VISIBLE_DEVICES", d.uuid),
                           ("GPUSLURM_CPUS", format_ranges(within_allowed(d.gpu.cpu_affinity)))]
        for name, value in values:
            # no CPU list: `taskset -c $GPUSLURM_CPUS` must not get an empty (or an earlier) one
            out.write(f"export {name}={value}\n" if value else f"unset {name}\n")
        if any(not value for _, value in values):
            err.write("gpuslurm pick: the node facts give no local CPUs for the chosen GPU(s): "
                      "GPUSLURM_CPUS is unset (nvidia-smi-topo.txt or NVML's affinity gives them)\n")


def within_allowed(cpus: Iterable[int]) -> tuple[int, ...]:
    """``cpus`` cut to those this process may use when it is confined (a Slurm or PBS cpuset,
    taskset), so a printed list never widens a task; all of them when nothing confines it.
    An empty cut keeps the allowed CPUs, as ``-- CMD`` does."""
    allowed = os.sched_getaffinity(0)
    wanted = tuple(cpus)
    if len(allowed) >= (os.cpu_count() or 0):
        return wanted
    return tuple(sorted(set(wanted) & allowed)) or tuple(sorted(allowed))


def env_values(node: Node, placement: Placement) -> list[tuple[str, str]]:
    """The environment for the chosen set (MIG: its first device; -- CMD with --mig takes N = 1)."""
    from gpuslurm.place.explain import local_cpus
    from gpuslurm.ranges import format_ranges

    win = placement.chosen
    assert win is not None
    values = [("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if win.devices[0].mig is None:
        values.append(("CUDA_VISIBLE_DEVICES", ",".join(d.uuid for d in win.devices)))
        values.append(("GPUSLURM_CPUS",
                       format_ranges(within_allowed(local_cpus(node, win.devices, False).os_cpus))))
        return values
    first = win.devices[0]
    return [*values, ("CUDA_VISIBLE_DEVICES", first.uuid),
            ("GPUSLURM_CPUS", format_ranges(within_allowed(first.gpu.cpu_affinity)))]


def exec_command(node: Node, placement: Placement, command: Sequence[str], err: TextIO) -> NoReturn:
    """Exec ``command`` with the placement's environment and CPUs (never wider than allowed)."""
    from gpuslurm.place.explain import local_cpus
    from gpuslurm.ranges import format_ranges

    win = placement.chosen
    assert win is not None
    env = dict(os.environ)
    env.update(env_values(node, placement))
    allowed = set(os.sched_getaffinity(0))
    near = set(local_cpus(node, win.devices, False).os_cpus)
    chosen = near & allowed
    if chosen:
        os.sched_setaffinity(0, chosen)
    else:
        what = "the GPUs' local CPUs are unknown" if not near else \
            f"none of the GPUs' local CPUs ({format_ranges(near)}) is allowed"
        err.write(f"gpuslurm pick: {what}; keeping the allowed CPUs {format_ranges(allowed)}\n")
    env["GPUSLURM_CPUS"] = format_ranges(chosen or allowed)
    err.flush()
    sys.stdout.flush()
    import signal

    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: CMD
    # would then see `yes | head -1` fail with EPIPE instead of ending quietly. subprocess
    # restores both for its children; exec must do it by hand.
    restored = [getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n)]
    for sig in restored:
        signal.signal(sig, signal.SIG_DFL)
    try:
        # exec, not a subprocess: pick becomes CMD (same pid, so Slurm's and PBS's accounting,
        # signals and cgroup follow), which is what `pick -- CMD` promises; no shell is involved.
        os.execvpe(command[0], list(command), env)  # noqa: S606
    except OSError as exc:
        for sig in restored:  # still gpuslurm: a closed stderr must not kill it silently
            signal.signal(sig, signal.SIG_IGN)
        raise InputError(f"cannot run: {exc.strerror}", command[0]) from None


def run_pick(argv: Sequence[str], out: TextIO, err: TextIO,
             environ: Mapping[str, str] | None = None) -> int:
    """The command; its exit code (or no return when it execs CMD)."""
    from gpuslurm.cli.schedulers import job_gpus_from_env
    from gpuslurm.hw.source import hardware_source
    from gpuslurm.watch.pick import Wait, pick_for_job

    args = parse_args(argv)
    req = build_request(args)
    wait = None
    if args.wait:
        from gpuslurm.times import parse_duration

        # the one duration parser (units as every other option; more than 0), bounded by what
        # time.sleep() takes: it overflows near 2**63 ns, and a year is plenty
        wait = Wait(5.0 if args.poll is None else
                    parse_duration(args.poll, "--poll", max_s=MAX_WAIT_S, max_words="366 days"),
                    None if args.timeout is None else
                    parse_duration(args.timeout, "--timeout", max_s=MAX_WAIT_S, max_words="366 days"))

    def say(line: str) -> None:
        err.write(f"gpuslurm pick: {line}\n")
        err.flush()

    picked = pick_for_job(req, hardware_source(args.source), os.environ if environ is None else environ,
                          job_gpus_from_env, wait, progress=say, warn=say)
    node, placement = picked
    if placement.chosen is None:
        if wait is not None:
            err.write(f"gpuslurm pick: gave up after {args.timeout}: nothing free for the request\n")
            return EXIT_WAIT_TIMEOUT
        from gpuslurm.place.explain import unsatisfied_line

        err.write(f"gpuslurm pick: {unsatisfied_line(placement, req.n)}\n")
        return EXIT_UNSATISFIED
    if args.command:
        exec_command(node, placement, args.command, err)
    write_result(node, placement, args.fmt, out, err)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``gpuslurm pick``: errors become one line on stderr and their exit code."""
    args = list(sys.argv[1:] if argv is None else argv)

    def step() -> int:
        try:
            return run_pick(args, sys.stdout, sys.stderr)
        except HelpRequested:
            print(USAGE)
            return 0

    try:  # the one entry-point policy, as cli.main's; BrokenPipeError: cli.fast.quiet_on_closed_pipe's
        return run_entry(step, lambda message: sys.stderr.write(f"gpuslurm pick: {message}\n"),
                         bug_hint=" (set GPUSLURM_DEBUG=1 for a traceback)",
                         reraise_bugs=bool(os.environ.get("GPUSLURM_DEBUG")), let_through=(BrokenPipeError,))
    except KeyboardInterrupt:
        sys.stderr.write("gpuslurm pick: interrupted\n")
        return EXIT_INTERRUPTED


__all__ = ["EXIT_BAD_INPUT", "EXIT_UNSATISFIED", "EXIT_WAIT_TIMEOUT", "main", "run_pick"]
