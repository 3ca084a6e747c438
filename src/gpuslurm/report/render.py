"""The fair-share report as a table for people, JSON or CSV for scripts (units in the field names)."""

from __future__ import annotations

import csv
import json
import time
from typing import Any, TextIO

from gpuslurm.jsondoc import document
from gpuslurm.policy.wording import pct, span, tenths
from gpuslurm.report.compute import Report, Row

FORMATS = ("table", "json", "csv")
CSV_FIELDS = ("key", "user", "account", "job_id", "pid", "node", "allocated_gpu_hours", "used_gpu_hours",
              "idle_gpu_hours", "unmeasured_gpu_hours", "share_pct", "quota_pct", "over_quota", "jobs",
              "idle_jobs", "violations", "rogue_processes", "evidence", "outside_jobs_gpu_hours",
              "energy_kwh")


def write_report(report: Report, fmt: str, fp: TextIO) -> None:
    if fmt == "json":
        json.dump(as_json(report), fp, indent=2)
        fp.write("\n")
    elif fmt == "csv":
        write_csv(report, fp)
    else:
        write_table(report, fp)


def _text(text: str) -> str:
    """``text`` without control characters: process names (and the evidence quoting them) are any
    user's text (prctl), and this table is read on an admin's terminal."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _r(x: float) -> float:
    return round(x, 4)


def _row_dict(r: Row) -> dict[str, Any]:
    return {"key": r.key, "user": r.user, "account": r.account, "job_id": r.job_id, "pid": r.pid,
            "node": r.node, "allocated_gpu_hours": _r(r.allocated_gpu_hours),
            "used_gpu_hours": _r(r.used_gpu_hours), "idle_gpu_hours": _r(r.idle_gpu_hours),
            "unmeasured_gpu_hours": _r(r.unmeasured_gpu_hours), "share_pct": _r(r.share_pct),
            "quota_pct": None if r.quota_pct is None else _r(r.quota_pct), "over_quota": r.over_quota,
            "jobs": r.jobs, "idle_jobs": r.idle_jobs, "violations": r.violations,
            "rogue_processes": r.rogue_processes, "evidence": list(r.evidence),
            "outside_jobs_gpu_hours": _r(r.outside_gpu_hours),
            "energy_kwh": None if r.energy_kwh is None else _r(r.energy_kwh)}


def as_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON values: times in ISO 8601 and Unix seconds, units in every name."""
    t = report.totals
    return document("fairshare-report", {
        "source": report.source, "by": report.by,
        "since": _iso(report.since), "until": _iso(report.until),
        "since_unix_s": report.since, "until_unix_s": report.until,
        "window_hours": _r(t.hours), "step_s": report.step_s,
        "totals": {"gpus": t.gpus, "capacity_gpu_hours": _r(t.capacity_gpu_hours),
                   "allocated_gpu_hours": _r(t.allocated_gpu_hours), "used_gpu_hours": _r(t.used_gpu_hours),
                   "idle_gpu_hours": _r(t.idle_gpu_hours), "unmeasured_gpu_hours": _r(t.unmeasured_gpu_hours),
                   "utilisation_pct": _r(t.utilisation_pct), "allocated_pct": _r(t.allocated_pct),
                   "violations": t.violations, "outside_jobs_gpu_hours": _r(t.outside_gpu_hours),
                   "energy_kwh": None if t.energy_kwh is None else _r(t.energy_kwh)},
        "rows": [_row_dict(r) for r in report.rows],
        "recommendations": list(report.recommendations),
        "gaps": [{"node": g.node, "from": _iso(g.start), "until": _iso(g.end), "from_unix_s": g.start,
                  "until_unix_s": g.end, "seconds": _r(g.end - g.start)} for g in report.gaps],
    })


def write_csv(report: Report, fp: TextIO) -> None:
    """One line per row; evidence lines joined by `` | ``; totals and window are in JSON only."""
    w = csv.DictWriter(fp, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in report.rows:
        d = _row_dict(r)
        d["evidence"] = " | ".join(r.evidence)
        w.writerow({k: "" if v is None else v for k, v in d.items()})


def write_table(report: Report, fp: TextIO) -> None:
    t = report.totals
    start = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.since))
    end = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(report.until))
    fp.write(f"GPU fair-share report from {report.source}\n")
    fp.write(f"Window {start} → {end} ({tenths(t.hours)} h), {t.gpus} GPUs, "
             f"capacity {tenths(t.capacity_gpu_hours)} GPU-hours\n")
    fp.write(f"Allocated {tenths(t.allocated_gpu_hours)} GPU-h ({pct(t.allocated_pct)}), "
             f"used {tenths(t.used_gpu_hours)} GPU-h ({pct(t.utilisation_pct)}; "
             f"{tenths(t.outside_gpu_hours)} outside any job), "
             f"idle {tenths(t.idle_gpu_hours)} GPU-h, unmeasured {tenths(t.unmeasured_gpu_hours)} GPU-h, "
             f"{t.violations} violation(s)\n")
    for g in report.gaps:  # a node's monitor down: its time there is unmeasured, not idle nor unused
        fp.write(f"gap: node {_text(g.node)} has no samples from {_clock(g.start)} to {_clock(g.end)} "
                 f"({span(g.end - g.start)}): counted as unmeasured\n")
    if t.energy_kwh is not None:  # the power sampled times the interval (docs/report.md)
        fp.write(f"Energy {t.energy_kwh:.2f} kWh (whole GPUs; a job's share by the time it held them)\n")
    fp.write("\n")
    energy = t.energy_kwh is not None
    kwh: tuple[str, ...] = ("kWh",) if energy else ()
    head = (report.by.upper(), "ALLOC GPU-h", "USED GPU-h", "NO-JOB USE", "IDLE GPU-h", *kwh, "SHARE",
            "QUOTA", "JOBS", "IDLE JOBS", "VIOLATIONS")
    lines = [head] + [(_text(r.key) + (" !" if r.over_quota else ""), tenths(r.allocated_gpu_hours),
                       tenths(r.used_gpu_hours), tenths(r.outside_gpu_hours), tenths(r.idle_gpu_hours),
                       *((("-" if r.energy_kwh is None else f"{r.energy_kwh:.2f}"),) if energy else ()),
                       pct(r.share_pct), "-" if r.quota_pct is None else pct(r.quota_pct), str(r.jobs),
                       str(r.idle_jobs), str(r.violations)) for r in report.rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [c.rjust(wd) for c, wd in zip(line[1:], widths[1:], strict=True)]
        fp.write("  ".join(cells).rstrip() + "\n")
    if not report.rows:
        fp.write("(nothing allocated or used in this window)\n")
    if any(r.over_quota for r in report.rows):
        fp.write("! over quota\n")
    if any(r.outside_gpu_hours >= 0.05 for r in report.rows):
        fp.write("NO-JOB USE: of USED, GPU-hours of processes in no job (or of nobody): use without an "
                 "allocation, so USED may exceed ALLOC GPU-h\n")
    evidence = [(r.key, e) for r in report.rows for e in r.evidence]
    if evidence:
        fp.write("\nEvidence:\n")
        for key, e in evidence:
            fp.write(f"  {_text(key)}: {_text(e)}\n")
    if report.recommendations:
        fp.write("\nRecommendations:\n")
        for rec in report.recommendations:
            fp.write(f"  - {_text(rec)}\n")
