"""What Slurm itself understood of a gres.conf: the output of ``slurmd -G``.

Facts about ``slurmd -G -f DIR/slurm.conf [-N NODE]`` (Slurm 22.05.8, Debian's slurm-wlm), learnt by
running it and reading its source:

* It needs neither munge nor a running slurmctld, and writes nothing to disk. gres.conf is read
  from the directory of slurm.conf. It prints everything on **stderr**, one line per record after
  all plugins merged slurm.conf and gres.conf: ``slurmd-NODE: Gres Name=gpu Type=h100 Count=1
  Index=0 ID=7696487 File=/dev/nvidia0 Cores=0-55 CoreCnt=224 Links=-1,18``. The line ends in
  ``(null)`` instead of ``Links=...`` when no Links were given; ``Type=(null)`` means untyped;
  Cores/CoreCnt are absent when no Cores were given, and Index/File when there is no File.
* ``Index`` is *not* the GRES index: it is the number formed by the trailing digits of File (0 when
  File ends in another character, e.g. ``nvidia[0-1]``). ``Cores`` is echoed as written, even
  when invalid. ``CoreCnt`` is the node's CPU count (Sockets*CoresPerSocket*ThreadsPerCore).
  Flags are not printed, and 22.05 has no ``UniqueId`` key (gres.conf with it is fatal).
* ``-N NODE`` makes slurmd take the NodeName= line of NODE, so no local host name is needed.
  With ``SlurmdParameters=config_overrides`` the node line wins over the machine's real CPUs;
  without it Cores beyond the real machine give errors. Cores are Slurm's abstract *core* ids
  (0..Sockets*CoresPerSocket-1), not CPU ids.
* Problems mostly do **not** change the exit status. Exit 0 with ``error:`` lines: Cores beyond
  the node (``xcpuinfo_abs_to_mac: failed`` and ``Invalid GRES data for gpu, Cores=...``; the
  record is kept), a File that is not a character or block device (the line is repeated once per
  GRES plugin; the record is kept), invalid Links (dropped), an unknown Name. Exit 0 with
  ``WARNING:``: more gres.conf devices of a type than slurm.conf has, or a Type missing from the
  node line (the extras are dropped). Exit 1 with ``fatal:``: a File that does not exist (after
  waiting about 19 s for it), an unknown key, MultipleFiles with one file.
* Fewer gres.conf devices than the node line has is **silent** with GresTypes=gpu (the rest are
  dropped as file-less); with mps/shard in GresTypes it shows as ``SHARING configuration lacks
  "File" specification``. Compare counts yourself.
* With mps or shard in GresTypes, every gpu record is split into one record per file: a File range
  and, through Slurm bug 17482 (fixed in 23.02.7), a MultipleFiles MIG record too, which then
  counts as one GPU per file. mps/shard records inherit Type and Cores from their GPU; a shared
  Count on a File range is the total, divided evenly among the files.
* Any character-device major is accepted (MIG caps files need not use the real nvidia-caps major),
  and block devices too. Debian's build has no gpu/nvml plugin: ``AutoDetect=nvml`` only prints a
  note and goes on.

What changed in later releases (Debian's 24.11.5 and 26.05.5, recorded in tests/slurm/slurmd_g/):

* 24.11 writes ``warning:`` in lower case, and appends ``Flags=HAS_FILE,HAS_TYPE,ENV_NVML,...`` to
  every record.
* 26.05 starts every line with a timestamp, ``[2026-11-26T18:19:07.210] ``, and no ``slurmd-NODE:``.
* Both need munged (at the socket slurm.conf's AuthInfo names) even for ``-G``: without it slurmd
  exits 1 after ``error: Munge encode failed: ... (Did you start munged?)``.
* Both print ``Node configuration differs from hardware: ...`` (a note) when the node line is not
  this machine's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuslurm.errors import CommandError
from gpuslurm.ranges import MAX_CPUS, parse_ranges
from gpuslurm.runner import run_command
from gpuslurm.topo.hostlist import expand_hostlist

SLURMD = "/usr/sbin/slurmd"

# slurmd prefixes its log lines with "slurmd: " until it knows its node name, then "slurmd-NODE: "
# (22.05, 24.11); 26.05 puts a timestamp in brackets there instead.
_PREFIX = re.compile(r"^(?:\[[^\]\s]{1,64}\] )?(?:slurmd(?:-\S+)?: )?")
# "WARNING:" until 24.11, "warning:" since
_PROBLEM = re.compile(r"^(error|fatal|WARNING|warning): (.*)$")
_NULL = "(null)"
# slurmd -G of 24.11 and later fails without munged (22.05 never asks for it)
_NO_MUNGE = re.compile(r"Munge encode failed|Did you start munged|auth/munge")


@dataclass(frozen=True)
class SlurmGres:
    """One GRES record as slurmd -G printed it."""

    name: str
    type: str | None
    count: int
    plugin_id: int | None
    index: int | None  # trailing digits of File, as slurmd prints it; not the GRES index
    file: str | None  # File as printed: one path, a hostlist range or a MultipleFiles list
    files: tuple[str, ...]  # ``file`` expanded into paths
    cores: str | None  # as written in gres.conf
    core_count: int | None
    links: str | None
    # printed since 24.11 (HAS_FILE, HAS_TYPE, ENV_NVML...); not part of what the record is
    flags: tuple[str, ...] = field(default=(), compare=False)
    line: str = field(default="", compare=False, repr=False)

    @property
    def core_ids(self) -> tuple[int, ...]:
        """The abstract core ids of ``cores``, sorted."""
        return expand_ranges(self.cores) if self.cores else ()


@dataclass(frozen=True)
class SlurmdReport:
    """Everything slurmd -G said: its records, its complaints and any other lines."""

    records: tuple[SlurmGres, ...]
    problems: tuple[str, ...]  # "error: ...", "fatal: ...", "WARNING: ..." as printed, duplicates dropped
    notes: tuple[str, ...]


def parse_slurmd_report(text: str) -> SlurmdReport:
    """Split slurmd -G output into records, problems and notes."""
    records: list[SlurmGres] = []
    problems: list[str] = []
    notes: list[str] = []
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw.strip(), count=1)
        if not line:
            continue
        if line.startswith("Gres "):
            records.append(_parse_record(line))
        elif _PROBLEM.match(line):
            if line not in problems:
                problems.append(line)
        else:
            notes.append(line)
    return SlurmdReport(tuple(records), tuple(problems), tuple(notes))


def parse_slurmd_g(text: str) -> tuple[SlurmGres, ...]:
    """The GRES records in slurmd -G output, in the order printed."""
    return parse_slurmd_report(text).records


def _parse_record(line: str) -> SlurmGres:
    fields: dict[str, str] = {}
    for token in line.split()[1:]:
        if token == _NULL:  # the Links slot when no Links were given
            continue
        key, sep, value = token.partition("=")
        if not sep:
            raise CommandError(f"slurmd -G: unexpected token {token!r} in {line!r}")
        fields[key] = value
    if "Name" not in fields or "Count" not in fields:
        raise CommandError(f"slurmd -G: record without Name or Count: {line!r}")
    try:
        file = fields.get("File")
        return SlurmGres(
            name=fields["Name"],
            type=_nullable(fields.get("Type")),
            count=int(fields["Count"]),
            plugin_id=_int_or_none(fields.get("ID")),
            index=_int_or_none(fields.get("Index")),
            file=file,
            files=expand_files(file) if file else (),
            cores=fields.get("Cores"),
            core_count=_int_or_none(fields.get("CoreCnt")),
            links=_nullable(fields.get("Links")),
            flags=tuple(f for f in fields.get("Flags", "").split(",") if f),
            line=line,
        )
    except ValueError as exc:
        raise CommandError(f"slurmd -G: {exc} in {line!r}") from exc


def _nullable(value: str | None) -> str | None:
    return None if value in (None, _NULL) else value


def _int_or_none(value: str | None) -> int | None:
    return None if value is None else int(value)


def expand_files(expr: str) -> tuple[str, ...]:
    """A File/MultipleFiles expression as slurmd printed it, expanded into paths."""
    return expand_hostlist(expr)


def expand_ranges(spec: str) -> tuple[int, ...]:
    """``"0-3,8"`` → ``(0, 1, 2, 3, 8)``."""
    return parse_ranges(spec, MAX_CPUS)


def run_slurmd_report(conf_dir: Path, slurmd: str = SLURMD, timeout: float = 30,
                      node_name: str | None = None) -> SlurmdReport:
    """Run ``slurmd -G`` on ``conf_dir/slurm.conf`` (and its gres.conf) and parse what it said.

    Raises CommandError only when slurmd cannot run or exits non-zero; problems it reported
    while exiting 0 are left in the report.
    """
    argv = _argv(conf_dir, slurmd, node_name)
    # A clean environment: an inherited SLURM_CONF or SLURMD_* variable must not change the result.
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    result = run_command(argv, timeout=timeout, check=False, env=env)
    output = result.stderr + result.stdout
    report = parse_slurmd_report(output)
    if result.returncode != 0:
        why = "; ".join(report.problems) or output.strip() or "no output"
        if _NO_MUNGE.search(output):
            why = f"munged is not running (slurmd -G needs it since Slurm 24.11): {why}"
        raise CommandError(f"slurmd -G exited {result.returncode}: {why}", result.argv,
                           result.returncode, result.stderr)
    return report


def run_slurmd_g(conf_dir: Path, slurmd: str = SLURMD, timeout: float = 30,
                 node_name: str | None = None) -> tuple[SlurmGres, ...]:
    """The records ``slurmd -G`` prints for ``conf_dir``; CommandError on any error, fatal or warning.

    slurmd exits 0 after most errors in gres.conf, so its error, fatal and warning lines (in either
    case) count as failure too; the CommandError message lists them, separated by "; ".
    """
    report = run_slurmd_report(conf_dir, slurmd, timeout, node_name)
    if report.problems:
        raise CommandError(f"slurmd -G reported: {'; '.join(report.problems)}",
                           tuple(_argv(conf_dir, slurmd, node_name)), 0, "\n".join(report.problems))
    return report.records


def _argv(conf_dir: Path, slurmd: str, node_name: str | None) -> list[str]:
    argv = [slurmd, "-G", "-f", str(Path(conf_dir) / "slurm.conf")]
    return [*argv, "-N", node_name] if node_name else argv
