"""Record (or check) the behaviour snapshot of issue 20: every command's output and exit code on the
built-in bundles and the real captures, and each hook's exit code in the fault cases.

    python -m tests.helpers.snapshot_record           compare with tests/cli/snapshot/golden.json
                                                      and print the diff
    python -m tests.helpers.snapshot_record --write   record it again (only when a change is intended)

tests/cli/test_snapshot.py runs the same cases under pytest, one test per case. What is
normalised, and why, is said there.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.report_helpers import CONFIG as REPORT_CONFIG
from tests.helpers.report_helpers import END, T0, make_store
from tests.helpers.scheduler_stand_in import no_jobs_config
from tests.helpers.snapshot_env import (
    BASE_ENV,
    HERE,
    REAL,
    REPO,
    TESTS,
    environ,
    first_line,
    normalise,
    stdout_record,
)
from tests.helpers.snapshot_hooks import HOOK_CASES

GOLDEN = HERE / "golden.json"
RERECORD = "if the change is intended, record it again: python -m tests.helpers.snapshot_record --write"

BUILTINS = ("dgx-h100", "l40s-4x", "a100-mig")
PLACEMENT_INPUT = TESTS / "place" / "data" / "scontrol-show-d-job-l40s.txt"
NODE_NAME = "snapnode"  # [monitor] node_name: the monitor and status would name this machine
NVL = "{DATA}/nvl-pairs-4x"  # tests/place's bundle of two NVLink pairs
NVL_PAIRS = [f"GPU-nvl-pairs-4x-000{i}-0000-0000-000000000000" for i in range(4)]  # tests/place/data's
L40S_GPU0 = "GPU-b02cb6a6-cbee-5f55-b99a-6a786dc74e39"  # l40s-4x's GPU 0 (README.md shows it)
A100_LAYOUT = ('[gpus."0"]\nprofiles = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]\n\n'
               '[gpus."1"]\nmig = false\n')  # a100-mig's own, as `mig show --as-layout` prints it


def multi_captures() -> list[str]:
    return sorted(p.name for p in (REAL / "multi").glob("*.txt")) if REAL.is_dir() else []


def xml_captures() -> list[str]:
    return sorted(p.name for p in (REAL / "nvidia-smi-q-x").glob("*.xml")) if REAL.is_dir() else []


def sources() -> list[str]:
    """Every node the commands replay: the built-ins by name, the real captures as bundles."""
    return [*BUILTINS, *(f"multi/{m.removesuffix('.txt')}" for m in multi_captures()),
            *(f"xml/{x.removesuffix('.xml')}" for x in xml_captures())]


# Each command run on every source; {S} is the --from value.
NODE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("discover", "--from", "{S}", "--json"),
    ("discover", "--from", "{S}"),
    ("topo", "--from", "{S}", "--json"),
    ("topo", "--from", "{S}"),
    ("mig", "show", "--from", "{S}", "--json"),
    ("mig", "show", "--from", "{S}"),
    ("gpu", "list", "--from", "{S}", "--json"),
    ("gpu", "list", "--from", "{S}"),
    ("health", "--from", "{S}", "--json"),
    ("health", "--from", "{S}"),
    ("status", "--from", "{S}", "--json"),
    ("status", "--from", "{S}"),
    ("monitor", "--once", "--json", "--from", "{S}"),
    ("gres-conf", "--from", "{S}"),
    ("gres-conf", "--from", "{S}", "--slurm-version", "24.11", "--mps", "2", "--node-name", "n1"),
    ("node-conf", "--from", "{S}"),
    ("pbs-conf", "--from", "{S}"),
    ("pick", "1", "--from", "{S}", "--format", "json"),
    ("pick", "1", "--from", "{S}", "--format", "env"),
    ("pick", "1", "--from", "{S}", "--format", "explain"),
    ("pick", "2", "--from", "{S}", "--format", "json"),
)

# Commands run once: a source of their own, or none. "&&" runs the next command in the same site
# (its state and config), and the case records every step's exit code and the last one's output.
OTHER_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("pick", "2", "--from", "a100-mig", "--mig", "1g.10gb", "--format", "json"),
    ("pick", "2", "--from", "a100-mig", "--mig", "1g.10gb"),
    ("pick", "2", "--from", "a100-mig", "--mig", "1g.10gb", "--format", "explain"),
    ("pick", "1", "--from", "multi/h100-mig__590.48.01", "--mig", "1g.10gb", "--format", "json"),
    ("pick", "1", "--from", "multi/h200-mig__590.48.01", "--mig", "1g.18gb", "--format", "json"),
    ("pick", "1", "--from", "xml/a100-sxm4-mig-v12", "--mig", "1g.20gb", "--format", "json"),
    ("mig", "show", "--from", "a100-mig", "--as-layout"),
    # inside a job: only the job's GPUs (Slurm's GRES indices, the task prolog's UUIDs, PBS's)
    ("SLURM_JOB_ID=42", "SLURM_JOB_GPUS=1,2", "pick", "2", "--from", NVL, "--format", "json"),
    ("SLURM_JOB_ID=42", "SLURM_JOB_GPUS=1,2", "pick", "3", "--from", NVL),
    ("SLURM_JOB_ID=42", "SLURM_JOB_GPUS=1,2", f"GPUSLURM_GPU_UUIDS={NVL_PAIRS[3]}", "pick", "1",
     "--from", NVL, "--format", "json"),
    ("SLURM_JOB_ID=42", "pick", "1", "--from", "dgx-h100"),
    ("SLURM_JOB_ID=42", "SLURM_STEP_GPUS=4", "SLURM_JOB_GPUS=4,5", "pick", "1", "--from", "dgx-h100",
     "--format", "json"),
    ("SLURM_JOB_ID=42", "SLURM_JOB_GPUS=0-99999999999", "pick", "1", "--from", "dgx-h100"),
    ("PBS_JOBID=12.pbshost", "pick", "1", "--from", NVL),
    ("PBS_JOBID=12.pbshost", f"GPUSLURM_GPU_UUIDS={NVL_PAIRS[0]},{NVL_PAIRS[3]}", "pick", "2", "--from", NVL,
     "--format", "json"),
    # pick's cache of parsed bundles: the second run reads it
    ("XDG_CACHE_HOME={SITE}/cache", "pick", "2", "--from", "dgx-h100", "--format", "json", "&&",
     "XDG_CACHE_HOME={SITE}/cache", "pick", "2", "--from", "dgx-h100", "--format", "json"),
    ("XDG_CACHE_HOME={SITE}/cache", "pick", "2", "--from", "a100-mig", "--mig", "1g.10gb", "&&",
     "XDG_CACHE_HOME={SITE}/cache", "pick", "2", "--from", "a100-mig", "--mig", "1g.10gb"),
    ("pick", "2", "--from", "{DATA}/pcie-tree-8x", "--format", "explain"),
    ("pick", "4", "--from", "{DATA}/pcie-tree-8x", "--format", "json"),
    ("GPUSLURM_SCENARIO={SITE}/busy.json", "pick", "2", "--from", "l40s-4x", "--format", "explain"),
    ("GPUSLURM_SCENARIO={SITE}/busy.json", "pick", "2", "--from", "l40s-4x", "--max-util", "50", "--format",
     "json"),
    ("GPUSLURM_SCENARIO={SITE}/busy.json", "pick", "4", "--from", "l40s-4x", "--mem", "10GiB"),
    ("GPUSLURM_SCENARIO={SITE}/busy.json", "status", "--from", "l40s-4x", "--json"),
    ("GPUSLURM_SCENARIO={SITE}/busy.json", "monitor", "--once", "--json", "--from", "l40s-4x"),
    ("GPUSLURM_SCENARIO={SITE}/no-such.json", "pick", "1", "--from", "l40s-4x"),
    # a node with faults (faulty/dgx-h100: Xid 79, a hot GPU, ECC errors)
    ("health", "--from", "faulty/dgx-h100", "--json"),
    ("health", "--from", "faulty/dgx-h100"),
    ("health", "--from", "faulty/dgx-h100", "--gpu", "index:2", "--json"),
    ("status", "--from", "faulty/dgx-h100", "--json"),
    ("pick", "8", "--from", "faulty/dgx-h100"),
    ("pick", "2", "--from", "faulty/dgx-h100", "--format", "explain"),
    ("monitor", "--once", "--json", "--from", "faulty/dgx-h100"),
    ("monitor", "--once", "--from", "faulty/dgx-h100", "&&",
     "gpu", "list", "--from", "faulty/dgx-h100", "--json"),
    ("monitor", "--once", "--from", "faulty/dgx-h100", "&&", "hogs", "--json"),
    ("gpu", "online", "index:2", "--from", "faulty/dgx-h100", "--no-slurm"),
    ("mig", "assert", "{SITE}/a100-layout.toml", "--from", "a100-mig"),
    ("mig", "assert", "{SITE}/a100-layout.toml", "--from", "dgx-h100"),
    ("mig", "assert", "{SITE}/other-layout.toml", "--from", "a100-mig"),
    ("mig", "assert", "{SITE}/missing.toml", "--from", "a100-mig"),
    ("pick", "1", "--from", "dgx-h100", "--type", "a100", "--format", "json"),
    ("pick", "9", "--from", "dgx-h100", "--format", "json"),
    ("placement", "--from", "l40s-4x", "--node", "l40s01", "--input", str(PLACEMENT_INPUT), "--json"),
    ("placement", "--from", "l40s-4x", "--node", "l40s01", "--input", str(PLACEMENT_INPUT)),
    ("hogs", "--json"),
    ("monitor", "--once", "--from", "dgx-h100", "&&", "hogs", "--json"),
    ("monitor", "--once", "--from", "dgx-h100", "&&", "hogs"),
    ("monitor", "--once", "--from", "dgx-h100", "&&", "hogs", "--json", "--violations-dir",
     "{SITE}/violations"),
    ("throttle", "list", "--file", "{SITE}/throttle", "--json"),
    *(("fairshare-report", "--db", "{STORE}", "--since", f"@{int(T0)}", "--until", f"@{int(END)}", "--by", by,
       "--format", fmt) for by in ("user", "account", "job", "process") for fmt in ("json", "table")),
    ("fairshare-report", "--db", "{STORE}", "--since", f"@{int(T0)}", "--until", f"@{int(END)}", "--format",
     "csv"),
    ("throttle", "add", "nobody", "--file", "{SITE}/throttle", "--for", "2h", "--cap", "2",
     "--reason", "fair share", "&&", "throttle", "list", "--file", "{SITE}/throttle", "--json"),
    ("throttle", "add", "snapshot-no-such-user", "--file", "{SITE}/throttle", "--for", "1h", "--mode",
     "reject", "--reason", "x", "&&", "throttle", "remove", "snapshot-no-such-user", "--file",
     "{SITE}/throttle", "&&", "throttle", "list", "--file", "{SITE}/throttle", "--json", "--all"),
    ("gpu", "offline", "index:3", "--from", "dgx-h100", "--reason", "fan", "--no-slurm", "&&",
     "gpu", "list", "--from", "dgx-h100", "--json"),
    ("gpu", "offline", "index:3", "--from", "dgx-h100", "--reason", "fan", "--no-slurm", "&&",
     "gpu", "online", "index:3", "--from", "dgx-h100", "--no-slurm", "&&",
     "gpu", "list", "--from", "dgx-h100", "--json"),
    ("gpu", "offline", "99", "--from", "dgx-h100", "--reason", "fan", "--no-slurm"),
    ("gres-conf", "--from", "dgx-h100", "-o", "{SITE}/gres.conf", "&&",
     "gres-conf", "--from", "dgx-h100", "--check", "{SITE}/gres.conf"),
    ("gres-conf", "--from", "l40s-4x", "-o", "{SITE}/gres.conf", "&&",
     "gres-conf", "--from", "dgx-h100", "--check", "{SITE}/gres.conf"),
    ("gres-conf", "--from", "dgx-h100", "--no-links", "--shard", "4"),
    ("gres-conf", "--from", "a100-mig", "--slurm-version", "22.05"),
    ("node-conf", "--from", "dgx-h100", "--node-name", "gpu01", "--feature", "ib,site"),
    ("pbs-conf", "--from", "dgx-h100", "--node-name", "pbs01"),
)

# Bad input: a missing bundle, a file instead of a directory, an unknown builtin, bad values.
BAD_SOURCES = ("{SITE}/missing", "{SITE}/a-file", "builtin:no-such", "no-such")
BAD_SOURCE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("discover", "--from", "{B}", "--json"),
    ("topo", "--from", "{B}", "--json"),
    ("mig", "show", "--from", "{B}", "--json"),
    ("gpu", "list", "--from", "{B}", "--json"),
    ("health", "--from", "{B}", "--json"),
    ("status", "--from", "{B}", "--json"),
    ("gres-conf", "--from", "{B}"),
    ("node-conf", "--from", "{B}"),
    ("pbs-conf", "--from", "{B}"),
    ("pick", "1", "--from", "{B}", "--format", "json"),
)
BAD_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("pick", "0", "--from", "dgx-h100"),
    ("pick", "two", "--from", "dgx-h100"),
    ("pick", "1", "--from", "dgx-h100", "--format", "yaml"),
    ("pick", "1", "--from", "dgx-h100", "--mem", "lots"),
    ("gres-conf", "--from", "dgx-h100", "--mps", "0"),
    ("gres-conf", "--from", "dgx-h100", "--slurm-version", "x.y"),
    ("gres-conf", "--from", "dgx-h100", "--check", "{SITE}/missing.conf"),
    ("discover", "--no-such-option"),
    ("no-such-command",),
    ("capture", "import", "{SITE}/missing.txt", "{SITE}/out"),
    ("placement", "--from", "l40s-4x", "--node", "l40s01", "--input", "{SITE}/missing", "--json"),
)


# Every command and subcommand: its --help (the options a refactor must keep). test_snapshot.py
# checks the list against the CLI's own.
COMMANDS: tuple[tuple[str, ...], ...] = (
    (), ("capture",), ("demo",), ("discover",), ("epilog",), ("fairshare-report",), ("gpu",),
    ("gpu", "list"), ("gpu", "offline"), ("gpu", "online"), ("gres-conf",), ("health",), ("hogs",),
    ("hook-server",),
    ("install",), ("jobstats",), ("man-pages",), ("mig",), ("mig", "apply"), ("mig", "assert"),
    ("mig", "show"),
    ("monitor",), ("node-conf",), ("pbs-conf",), ("pick",), ("placement",), ("prolog",), ("status",),
    ("task-prolog",), ("throttle",), ("throttle", "add"), ("throttle", "auto"), ("throttle", "list"),
    ("throttle", "remove"), ("throttle", "sync"), ("topo",), ("watch",),
)


def cli_cases() -> dict[str, tuple[str, ...]]:
    """Each command case: its id (the command line as a user types it) and its argv."""
    out: dict[str, tuple[str, ...]] = {}
    for command in COMMANDS:
        out[" ".join((*command, "--help"))] = (*command, "--help")
    for source in sources():
        for argv in NODE_COMMANDS:
            args = tuple(source if a == "{S}" else a for a in argv)
            out[" ".join(args)] = args
    for argv in (*OTHER_COMMANDS, *BAD_COMMANDS):
        out[" ".join(argv).replace(str(REPO), "<repo>")] = argv
    for bad in BAD_SOURCES:
        for argv in BAD_SOURCE_COMMANDS:
            args = tuple(bad if a == "{B}" else a for a in argv)
            out[" ".join(args)] = args
    for m in multi_captures():
        args = ("capture", "import", f"{{REAL}}/multi/{m}", "{SITE}/bundle")
        out[" ".join(args)] = args
    return out


# ---------------------------------------------------------------------------------------------
# The world: bundles made once from the real captures


@dataclass
class World:
    root: Path
    imports: dict[str, dict[str, Any]]  # the `capture import` cases, recorded while making bundles


@contextlib.contextmanager
def world() -> Iterator[World]:
    with tempfile.TemporaryDirectory(prefix="gpuslurm-snapshot-") as tmp:
        root = Path(tmp)
        w = World(root, {})
        for m in multi_captures():
            bundle = root / "multi" / m.removesuffix(".txt")
            bundle.parent.mkdir(exist_ok=True)
            args = ("capture", "import", f"{{REAL}}/multi/{m}", "{SITE}/bundle")
            with site_dir(root) as site:
                rec = run_cli(args, site, root)
                shutil.move(str(site / "bundle"), bundle)
            w.imports[" ".join(args)] = rec
        for x in xml_captures():
            bundle = root / "xml" / x.removesuffix(".xml")
            bundle.mkdir(parents=True)
            shutil.copy(REAL / "nvidia-smi-q-x" / x, bundle / "nvidia-smi-q.xml")
        make_faulty(root / "faulty" / "dgx-h100")
        yield w


def make_faulty(bundle: Path) -> None:
    """dgx-h100 with health facts: Xid 79 on GPU 2, GPU 5 hot, GPU 6 with uncorrectable ECC errors."""
    from gpuslurm.hw.source import bundle_path

    shutil.copytree(str(bundle_path("builtin:dgx-h100")), bundle)
    uuids = re.findall(r"<uuid>(GPU-[0-9a-f-]+)</uuid>", (bundle / "nvidia-smi-q.xml").read_text())
    (bundle / "health.json").write_text(json.dumps({
        uuids[2]: {"xid": [79]}, uuids[5]: {"temperature_c": 99}, uuids[6]: {"ecc_uncorrectable": 2}}))


@contextlib.contextmanager
def site_dir(world_root: Path) -> Iterator[Path]:
    """A fresh directory for one case: a config (stand-in squeue answering no jobs, run and state
    directories here, the node's name fixed), a file where a bundle is asked for."""
    with tempfile.TemporaryDirectory(prefix="site-", dir=world_root) as tmp:
        site = Path(tmp)
        config = no_jobs_config(site)
        config.write_text(config.read_text() + f'[monitor]\nnode_name = "{NODE_NAME}"\n')
        (site / "a-file").write_text("<nvidia_smi_log/>\n")
        (site / "a100-layout.toml").write_text(A100_LAYOUT)
        (site / "busy.json").write_text(json.dumps({"gpus": {L40S_GPU0: {"util": 95, "mem_mib": 44000}}}))
        (site / "other-layout.toml").write_text(A100_LAYOUT.replace(
            '["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]', '["7g.80gb"]'))
        yield site


def run_cli(args: tuple[str, ...], site: Path, world_root: Path, process: bool = False) -> dict[str, Any]:
    """One command (or "&&"-joined steps) in-process, as the ``gpuslurm`` executable runs it
    (pick without click); with ``process``, as that executable in a process of its own."""
    steps: list[list[str]] = [[]]
    for a in args:
        if a == "&&":
            steps.append([])
        else:
            steps[-1].append(a)
    codes = [_one_command(step, site, world_root, process) for step in steps]
    rec = codes[-1]
    if len(codes) > 1:
        rec["steps"] = [{"exit": c["exit"], "stderr": c["stderr"]} for c in codes[:-1]]
    return rec


def _one_command(args: list[str], site: Path, world_root: Path, process: bool) -> dict[str, Any]:
    from gpuslurm.cli.main import main
    from gpuslurm.cli.pick_cmd import main as pick_main

    if "{STORE}" in args and not (site / "report.db").exists():  # tests/report's hand-computed store
        make_store(site / "report.db", rolled=True)
        config = site / "gpuslurm.toml"
        config.write_text(config.read_text() + REPORT_CONFIG)
    places = {"{SITE}": str(site), "{REAL}": str(REAL), "{STORE}": str(site / "report.db"),
              "{DATA}": str(TESTS / "place" / "data")}
    argv = [re.sub(r"\{[A-Z]+\}", lambda m: places.get(m.group(0), m.group(0)), a) for a in args]
    argv = [str(world_root / a) if a.startswith(("multi/", "xml/", "faulty/")) else a for a in argv]
    env = {"GPUSLURM_CONFIG": str(site / "gpuslurm.toml")}
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):  # NAME=VALUE before the command, as in a shell
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    out, err = io.StringIO(), io.StringIO()
    if process:
        proc = subprocess.run([sys.executable, "-m", "gpuslurm", *argv], env={**BASE_ENV, **env},
                              capture_output=True, text=True, timeout=120, check=False, cwd="/")
        code = proc.returncode
        out.write(proc.stdout)
        err.write(proc.stderr)
    else:
        with environ(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = pick_main(argv[1:]) if argv[:1] == ["pick"] else main(argv)
    as_json = "--json" in argv or "json" in argv
    return {"exit": code,
            "stdout": stdout_record(normalise(out.getvalue(), site, world_root), as_json),
            "stderr": normalise(first_line(err.getvalue()), site, world_root)}


# ---------------------------------------------------------------------------------------------
# Recording


def record_case(case: str, w: World, process: bool = False) -> dict[str, Any]:
    """One case's behaviour (``process``: a command case run as its own process)."""
    if case in w.imports:
        return w.imports[case]
    if case in HOOK_CASES:
        return HOOK_CASES[case](w.root)
    args = cli_cases()[case]
    with site_dir(w.root) as site:
        return run_cli(args, site, w.root, process)


def all_cases() -> list[str]:
    return [*cli_cases(), *HOOK_CASES]


def record_all(w: World, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    out = {}
    for case in all_cases():
        if progress:
            progress(case)
        out[case] = record_case(case, w)
    return out


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def diff(case: str, want: Any, got: Any) -> str:
    """A unified diff of one case's recorded behaviour, naming the case."""
    lines = difflib.unified_diff(dumps(want).splitlines(), dumps(got).splitlines(),
                                 f"golden: {case}", f"now: {case}", lineterm="", n=2)
    return "\n".join(lines)


def load_golden() -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(GOLDEN.read_text())
    return golden


def main(argv: list[str]) -> int:
    write = argv == ["--write"]
    if argv and not write:
        print("usage: python -m tests.helpers.snapshot_record [--write]", file=sys.stderr)
        return 2
    if not REAL.is_dir():
        print(f"record.py: {REAL} is absent: the real captures are part of the snapshot", file=sys.stderr)
        return 2
    with world() as w:
        got = record_all(w)
    if write:
        GOLDEN.write_text(dumps(got))
        print(f"wrote {GOLDEN.relative_to(REPO)}: {len(got)} cases")
        return 0
    golden = load_golden()
    changed = [c for c in sorted({*golden, *got}) if golden.get(c) != got.get(c)]
    for case in changed:
        print(diff(case, golden.get(case), got.get(case)))
    if changed:
        print(f"{len(changed)} of {len(got)} cases changed; {RERECORD}")
        return 1
    print(f"all {len(got)} cases as recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
