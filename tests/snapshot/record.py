"""Record (or check) the behaviour snapshot of issue 20: every command's output and exit code on the
built-in bundles and the real captures, and each hook's exit code in the fault cases.

    python tests/snapshot/record.py           compare with tests/snapshot/golden.json, print the diff
    python tests/snapshot/record.py --write   record it again (only when a change is intended)

tests/snapshot/test_snapshot.py runs the same cases under pytest, one test per case. What is
normalised, and why, is said there.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
GOLDEN = HERE / "golden.json"
REAL = REPO.parent / "shared" / "fixtures" / "real"
RERECORD = "if the change is intended, record it again: python tests/snapshot/record.py --write"

if str(TESTS) not in sys.path:  # run as a script: the test helpers live in tests/
    sys.path.insert(0, str(TESTS))

from hooks.hook_helpers import make_site  # noqa: E402
from report.report_helpers import CONFIG as REPORT_CONFIG  # noqa: E402
from report.report_helpers import END, T0, make_store  # noqa: E402
from scheduler_stand_in import no_jobs_config  # noqa: E402

BUILTINS = ("dgx-h100", "l40s-4x", "a100-mig")
PLACEMENT_INPUT = TESTS / "place" / "data" / "scontrol-show-d-job-l40s.txt"
QSTAT_JOB = TESTS / "pbs" / "data" / "qstat-f-json.json"  # real qstat -f -F json: 0.pbshost, 2 GPUs
NODE_NAME = "snapnode"  # [monitor] node_name: the monitor and status would name this machine


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
    ("throttle", "add", "alice", "--file", "{SITE}/throttle", "--for", "2h", "--cap", "2",
     "--reason", "fair share", "&&", "throttle", "list", "--file", "{SITE}/throttle", "--json"),
    ("throttle", "add", "bob", "--file", "{SITE}/throttle", "--for", "1h", "--mode", "reject",
     "--reason", "x", "&&", "throttle", "remove", "bob", "--file", "{SITE}/throttle", "&&",
     "throttle", "list", "--file", "{SITE}/throttle", "--json", "--all"),
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


def cli_cases() -> dict[str, tuple[str, ...]]:
    """Each command case: its id (the command line as a user types it) and its argv."""
    out: dict[str, tuple[str, ...]] = {}
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
# Normalisation


_CLOCK = re.compile(r"\b(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d)(?::(\d\d))?\b")
NEAR_NOW_S = 2 * 86400  # a time this close to the run's is the run's clock, not a recorded fact


def _now(epoch: float) -> bool:
    return abs(epoch - time.time()) < NEAR_NOW_S


def _clock(match: re.Match[str]) -> str:
    import calendar

    y, mo, d, h, mi, s = (int(g or 0) for g in match.groups())
    try:
        epoch = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except (OverflowError, ValueError):
        return match.group(0)
    return "<time>" if _now(epoch) else match.group(0)


def normalise(text: str, site: Path, world: Path) -> str:
    """Paths that differ between checkouts and runs become placeholders, times of the run's own
    clock <time> (see test_snapshot.py)."""
    for path, name in ((site, "<site>"), (world, "<bundles>"), (REAL, "<real>"), (REPO, "<repo>")):
        text = text.replace(str(path.resolve()), name).replace(str(path), name)
    return _CLOCK.sub(_clock, text)


def _scrub(doc: Any) -> Any:
    """JSON with the run's own clock (epoch seconds near now) as <time>."""
    if isinstance(doc, dict):
        return {k: _scrub(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_scrub(v) for v in doc]
    if isinstance(doc, int | float) and not isinstance(doc, bool) and _now(doc):
        return "<time>"
    return doc


def _stdout(text: str, as_json: bool) -> Any:
    """JSON as data (one document, or JSON lines), anything else as its lines."""
    if as_json and text.strip():
        try:
            return _scrub(json.loads(text))
        except ValueError:
            pass
        try:
            return [_scrub(json.loads(line)) for line in text.splitlines()]
        except ValueError:
            pass
    return text.splitlines()


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text.strip() else ""


# ---------------------------------------------------------------------------------------------
# The world: bundles made once from the real captures


@dataclass
class World:
    root: Path
    imports: dict[str, dict[str, Any]]  # the `capture import` cases, recorded while making bundles

    def source(self, name: str) -> str:
        if name.startswith(("multi/", "xml/")):
            return str(self.root / name)
        return name


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
        yield w


@contextlib.contextmanager
def site_dir(world_root: Path) -> Iterator[Path]:
    """A fresh directory for one case: a config (stand-in squeue answering no jobs, run and state
    directories here, the node's name fixed), a file where a bundle is asked for."""
    with tempfile.TemporaryDirectory(prefix="site-", dir=world_root) as tmp:
        site = Path(tmp)
        config = no_jobs_config(site)
        config.write_text(config.read_text() + f'[monitor]\nnode_name = "{NODE_NAME}"\n')
        (site / "a-file").write_text("<nvidia_smi_log/>\n")
        yield site


# The environment every case runs in: nothing of the caller's but what a shell always has, and a
# fixed zone and terminal width (the tables fit the width; times print in local time).
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "COLUMNS": "100",
            "LINES": "40"}


@contextlib.contextmanager
def environ(env: dict[str, str], clear: bool = False) -> Iterator[None]:
    """``env`` as the whole environment (``clear``: as slurmd gives a hook, nothing else)."""
    with mock.patch.dict(os.environ, {**({} if clear else BASE_ENV), **env}, clear=True):
        time.tzset()
        yield
    time.tzset()


def run_cli(args: tuple[str, ...], site: Path, world_root: Path) -> dict[str, Any]:
    """One command (or "&&"-joined steps) in-process, as the ``gpuslurm`` executable runs it
    (pick without click)."""
    steps: list[list[str]] = [[]]
    for a in args:
        if a == "&&":
            steps.append([])
        else:
            steps[-1].append(a)
    codes = [_one_command(step, site, world_root) for step in steps]
    rec = codes[-1]
    if len(codes) > 1:
        rec["steps"] = [{"exit": c["exit"], "stderr": c["stderr"]} for c in codes[:-1]]
    return rec


def _one_command(args: list[str], site: Path, world_root: Path) -> dict[str, Any]:
    from gpuslurm.cli.main import main
    from gpuslurm.cli.pick_cmd import main as pick_main

    if "{STORE}" in args and not (site / "report.db").exists():  # tests/report's hand-computed store
        make_store(site / "report.db", rolled=True)
        config = site / "gpuslurm.toml"
        config.write_text(config.read_text() + REPORT_CONFIG)
    places = {"{SITE}": str(site), "{REAL}": str(REAL), "{STORE}": str(site / "report.db")}
    argv = [re.sub(r"\{[A-Z]+\}", lambda m: places.get(m.group(0), m.group(0)), a) for a in args]
    argv = [str(world_root / a) if a.startswith(("multi/", "xml/")) else a for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with environ({"GPUSLURM_CONFIG": str(site / "gpuslurm.toml")}), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = pick_main(argv[1:]) if argv[0] == "pick" else main(argv)
    as_json = "--json" in argv or "json" in argv
    return {"exit": code,
            "stdout": _stdout(normalise(out.getvalue(), site, world_root), as_json),
            "stderr": normalise(_first_line(err.getvalue()), site, world_root)}


# ---------------------------------------------------------------------------------------------
# Hooks in the fault cases: the Slurm hooks through `gpuslurm <hook>` (what the installed
# executables run) on tests/hooks' sites (a replayed bundle, a stand-in scontrol that records its
# calls); the PBS hook through gpuslurm.pbs.entry.main and the classic scripts through
# gpuslurm.pbs.classic.main, as tests/pbs drives them.


def _slurm_hook(hook: str, env: dict[str, str], site: Any, world_root: Path) -> dict[str, Any]:
    from gpuslurm.cli.main import main

    out, err = io.StringIO(), io.StringIO()
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
    with mock.patch(target, side_effect=ZeroDivisionError("a planted bug")):
        yield


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


def _pbs_site(world_root: Path, builtin: str = "dgx-h100") -> tuple[Path, Path, dict[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="pbs-", dir=world_root))
    bundle = root / "bundle"
    from gpuslurm.hw.source import BUILTIN_DIR

    shutil.copytree(BUILTIN_DIR / builtin, bundle)
    qstat = root / "qstat"
    qstat.write_text(f"#!/bin/sh\nexec /bin/cat {QSTAT_JOB}\n")
    qstat.chmod(0o755)
    config = root / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{root}/run"\nstate_dir = "{root}/state"\n'
                      f'cgroup_root = "{root}/no-cgroup"\nqstat = "{qstat}"\n'
                      f'[monitor]\nnode_name = "pbshost"\n')
    return root, bundle, {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": str(bundle)}


def _pbs_event(event: str, doc: dict[str, Any], health: Callable[[list[str]], dict[str, Any]] | None = None,
               before: tuple[tuple[str, dict[str, Any]], ...] = (), raw: bytes | None = None,
               patch: str | None = None) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        from gpuslurm.hw.source import load_node
        from gpuslurm.pbs.entry import main

        root, bundle, env = _pbs_site(world_root)
        if health:
            uuids = [g.uuid for g in load_node(str(bundle)).gpus]
            (bundle / "health.json").write_text(json.dumps(health(uuids)))

        def call(ev: str, fields: dict[str, Any], data: bytes | None = None) -> dict[str, Any]:
            request = {"format": 1, "event": ev, "hostname": "pbshost", **fields}
            out, err = io.StringIO(), io.StringIO()
            with environ(env, clear=True):
                rc = main([ev], io.BytesIO(data if data is not None else json.dumps(request).encode()),
                          out, err)
            return {"exit": rc, "answer": json.loads(out.getvalue()) if out.getvalue().strip() else None,
                    "stderr": [normalise(line, root, world_root) for line in err.getvalue().splitlines()]}

        earlier = [call(ev, fields)["exit"] for ev, fields in before]
        with _bug(patch):
            rec = call(event, doc, raw)
        rec = json.loads(normalise(json.dumps(rec), root, world_root))
        jobs = root / "run" / "jobs"
        return {"before": earlier, **rec,
                "maps": sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []}
    return run


def _classic(kind: str, argv: tuple[str, ...], health: Callable[[list[str]], dict[str, Any]] | None = None,
             config: bool = True) -> Callable[[Path], dict[str, Any]]:
    def run(world_root: Path) -> dict[str, Any]:
        from gpuslurm.hw.source import load_node
        from gpuslurm.pbs.classic import main

        root, bundle, env = _pbs_site(world_root)
        if not config:
            env["GPUSLURM_CONFIG"] = str(root / "missing.toml")
        if health:
            uuids = [g.uuid for g in load_node(str(bundle)).gpus]
            (bundle / "health.json").write_text(json.dumps(health(uuids)))
        err = io.StringIO()
        with environ(env, clear=True):
            rc = main(kind, list(argv), environ=dict(os.environ), stderr=err, mom_priv=str(root / "mom_priv"))
        jobs = root / "run" / "jobs"
        lines = [normalise(line, root, world_root) for line in err.getvalue().splitlines()]
        return {"exit": rc, "stderr": lines,
                "maps": sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []}
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


# ---------------------------------------------------------------------------------------------
# Recording


def record_case(case: str, w: World) -> dict[str, Any]:
    if case in w.imports:
        return w.imports[case]
    if case in HOOK_CASES:
        return HOOK_CASES[case](w.root)
    args = cli_cases()[case]
    with site_dir(w.root) as site:
        return run_cli(args, site, w.root)


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
        print("usage: python tests/snapshot/record.py [--write]", file=sys.stderr)
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
