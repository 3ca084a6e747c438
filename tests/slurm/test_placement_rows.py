"""slurm/placement, called directly: rows from a recorded ``scontrol show -d job``, a job whose record
appears twice (a job name or comment copying scontrol's layout) left out with a warning."""

from __future__ import annotations

from pathlib import Path

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.placement import placement_rows, summary

DATA = Path(__file__).resolve().parents[1] / "place" / "data"
RECORDED = (DATA / "scontrol-show-d-job-l40s.txt").read_text()
NODE = load_node("l40s-4x")


def test_rows_and_summary_from_a_recording() -> None:
    rows = placement_rows(NODE, RECORDED, "l40s01")
    assert rows and all(r.gpus and r.as_dict()["job"] == r.job for r in rows)
    assert summary("l40s01", rows).startswith(f"l40s01: {len(rows)} GPU job(s); NUMA-affine ")


def test_a_job_told_twice_is_left_out_and_said() -> None:
    first = placement_rows(NODE, RECORDED, "l40s01")[0]
    record = next(block for block in RECORDED.split("\n\n") if block.startswith(f"JobId={first.job} "))
    warnings: list[str] = []
    rows = placement_rows(NODE, f"{RECORDED}\n\n{record}\n", "l40s01", warn=warnings.append)
    assert first.job not in {r.job for r in rows}
    assert warnings == [f"job {first.job} left out: it appears twice in the scontrol text (a job name "
                        "or comment copied scontrol's layout)"]
