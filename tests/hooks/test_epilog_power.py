"""The epilog's power figures from a damaged or forged store: bounded, the rest of the summary kept."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.samples import MAX_GPU_POWER_W, Cycle, GpuSample
from gpuslurm.slurm.hooks import run_epilog, run_prolog
from gpuslurm.state.store import Store


def test_a_forged_power_reading_is_left_out_of_the_summary_and_logged(tmp_path: Path) -> None:
    # A sample whose power no GPU draws (a forged capture, a damaged row: 1e18 W, infinite, text)
    # made power_mean_w absurd, or cost the summary every monitor figure. It is left out, logged,
    # and the epilog succeeds with the job's other figures.
    site: HookSite = make_site(tmp_path)
    assert run_prolog(site.environ(gpus="4"), HookLog("prolog", stream=io.StringIO(), use_syslog=False)) == 0
    start = json.loads((site.jobs_dir / "1234.json").read_text())["start"]
    db = site.root / "state" / "monitor.db"
    db.parent.mkdir(exist_ok=True)
    with Store.open(str(db)) as store:
        for i in range(10):
            store.write_cycle(Cycle(start + i, "node07", (GpuSample(
                start + i, site.uuids[4], util_pct=50.0, mem_used_mib=100.0, power_w=200.0,
                temp_c=50.0),), (), ()))
    conn = sqlite3.connect(str(db))
    with conn:
        for i, forged in ((3, 1e18), (4, float("inf")), (5, "1e18")):
            conn.execute("UPDATE gpu_sample SET power_w = ? WHERE ts = ?", (forged, start + i))
    conn.close()
    log = HookLog("epilog", stream=io.StringIO(), use_syslog=False)
    assert run_epilog(site.environ(gpus="4"), log, now=start + 9) == 0, log.lines
    [g] = json.loads((site.summaries / "1234-summary.json").read_text())["gpus"]
    assert (g["power_mean_w"], g["power_max_w"]) == (200.0, 200.0), g
    assert g["util_mean_pct"] == 50.0 and g["temp_max_c"] == 50.0 and g["samples"] == 10
    assert 0 <= g.get("energy_j", 0) <= MAX_GPU_POWER_W * 9
    assert any("left 3 power reading(s) no GPU draws out" in line for line in log.lines), log.lines
