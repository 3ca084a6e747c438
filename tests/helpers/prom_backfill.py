"""A real Prometheus holding given monitor cycles, backfilled with promtool (no scrapes, no clock).

The cycles become the exporter's own samples (:func:`gpuslurm.watch.exporter.cycle_samples`),
written as OpenMetrics with each cycle's time as the sample's timestamp, and
``promtool tsdb create-blocks-from openmetrics`` turns them into blocks of a TSDB that a
Prometheus of our own then serves on loopback. So a test can ask Prometheus and the monitor's
SQLite store about exactly the same samples.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import yaml
from tests.helpers.prom_helpers import serving

from gpuslurm.samples import Cycle, Violation
from gpuslurm.watch.exporter import FAMILIES, PREFIX, cycle_samples

PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(cycles: Iterable[tuple[Cycle, Sequence[Violation]]], per_process: bool = True,
                twice: frozenset[str] = frozenset()) -> str:
    """The exporter's gauges of every cycle, stamped with the cycle's time, family by family; the
    nodes in ``twice`` as two scrape targets would give them (instance labels a and b)."""
    rows: dict[str, list[str]] = {name: [] for name in FAMILIES}
    for cycle, violations in cycles:
        instances = ('instance="a",', 'instance="b",') if cycle.node in twice else ("",)
        for s in cycle_samples(cycle, violations, per_process):
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
            for instance in instances:
                line = f"{PREFIX}{s.family}{{{instance}{labels}}} {s.value!r} {cycle.ts:.3f}\n"
                rows[s.family].append(line)
    out = []
    for name, lines in rows.items():
        if lines:
            out.append(f"# TYPE {PREFIX}{name} gauge\n")
            out.extend(lines)
    out.append("# EOF\n")
    return "".join(out)


@contextlib.contextmanager
def backfilled(root: Path, cycles: Iterable[tuple[Cycle, Sequence[Violation]]],
               *flags: str, per_process: bool = True, rules: Path | None = None,
               rules_start: float | None = None, twice: frozenset[str] = frozenset()) -> Iterator[str]:
    """A Prometheus on 127.0.0.1 serving ``cycles`` (started with ``flags`` too); yields its URL.
    With ``rules``: their recorded series too, evaluated every 30 s (a group's own interval where it
    has one) over the cycles' span by ``promtool tsdb create-blocks-from rules`` (as a site
    backfills new rules), from ``rules_start`` (a whole second; default: the first cycle's)."""
    root.mkdir(parents=True, exist_ok=True)
    source, data = root / "cycles.om", root / "data"
    listed = list(cycles)
    source.write_text(openmetrics(listed, per_process, twice))
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                   check=True, capture_output=True, timeout=300)
    if rules is None:
        with _serving(root, data, flags) as url:
            yield url
        return
    first, last = min(c.ts for c, _ in listed), max(c.ts for c, _ in listed)
    first = first if rules_start is None else rules_start
    for run in rule_runs(rules.read_text()):
        with _serving(root, data, flags) as url:
            # Prometheus offsets a group's evaluations by a hash of its file's name as given and
            # the group's name, so the recorded series moved with the checkout's path (and the
            # report's figures with them, within their tolerance of the store's): one relative
            # name, from root, for every run
            (root / rules.name).write_text(run)
            subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "rules", f"--url={url}",
                            f"--start={int(first)}", f"--end={int(last) + 1}", "--eval-interval=30s",
                            "--output-dir=rules", rules.name],
                           check=True, capture_output=True, timeout=300, cwd=root)
        for block in (root / "rules").iterdir():
            block.rename(data / block.name)
    with _serving(root, data, flags) as url:
        yield url


def rule_runs(text: str) -> list[str]:
    """A rules file as promtool's backfill runs it: the rules over raw series, then those over
    the first ones' series (its backfill cannot evaluate a rule over rules of the same run; a
    site backfilling the shipped rules does the same: docs/prometheus.md). The groups keep their
    names, so their evaluations fall at the same times in both runs."""
    doc = yaml.safe_load(text)
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"]}

    def over_rules(rule: dict[str, str]) -> bool:
        return any(name in rule["expr"] for name in recorded)
    runs = []
    for second in (False, True):
        groups = [{**g, "rules": [r for r in g["rules"] if over_rules(r) == second]} for g in doc["groups"]]
        if any(g["rules"] for g in groups):
            runs.append(yaml.safe_dump({"groups": [g for g in groups if g["rules"]]}, sort_keys=False))
    return runs


@contextlib.contextmanager
def _serving(root: Path, data: Path, flags: Sequence[str]) -> Iterator[str]:
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    with serving(root, config, data, ["--storage.tsdb.retention.time=100y", *flags], 60) as url:
        yield url
