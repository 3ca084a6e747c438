"""The report by user and by account from Prometheus' per-user sums (report/prom_users): the
per-device report's numbers, and the store's, from points per user instead of per device.

The same three nodes as test_prom_rules_report (jobs that end and start inside buckets, a device
busy with no job on it, a window not on the scrapes' grid), backfilled with promtool, with the
shipped rules evaluated over them by promtool."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.helpers import prom_backfill
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled
from tests.helpers.prom_rules_cycles import HOUR, POLICY, RULES, SINCE, STEP, UNTIL
from tests.helpers.prom_rules_cycles import cluster as _cluster
from tests.helpers.prom_rules_cycles import truth as _truth

from gpuslurm.cli.main import cli
from gpuslurm.errors import InputError
from gpuslurm.report import prom_users
from gpuslurm.report.compute import Report, compute
from gpuslurm.report.data import ReportData
from gpuslurm.report.prom_client import PrometheusClient
from gpuslurm.report.prom_grid import RULE_MEMORY
from gpuslurm.report.prometheus import load_prometheus
from gpuslurm.report.query import load_sqlite
from gpuslurm.report.user_report import compute_users
from gpuslurm.samples import Cycle
from gpuslurm.state.store import Store

pytestmark = pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
                                reason="needs Debian's prometheus package (.ci/run installs it)")


def _answers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, list[dict[str, Any]]]]:
    seen: list[tuple[str, str, list[dict[str, Any]]]] = []
    real = PrometheusClient._get

    def recording(self: PrometheusClient, endpoint: str, params: dict[str, str],
                  want: str) -> list[dict[str, Any]]:
        got = real(self, endpoint, params, want)
        seen.append((endpoint, params.get("query", ""), got))
        return got

    monkeypatch.setattr(PrometheusClient, "_get", recording)
    return seen


DEVICE_UTIL = "device:gpuslurm_gpu_utilization_ratio:sum_5m"
RULE_WINDOW_H = 300 / 3600  # the gpuslurm_5m group's interval
JOBS = 9  # tests.helpers.prom_rules_cycles: three jobs on each of three nodes


def _shift(report: Report) -> float:
    """How far the two paths may split a row's use apart: one rule window per job that ends."""
    return sum(r.jobs for r in report.rows) * RULE_WINDOW_H


def _same(got: Report, per_device: Report, truth: Report) -> None:
    """Allocated exact, used within 0.1 % of the per-device report's (and the store's within its
    own tolerance: test_prom_rules_report), jobs, idle jobs and unmeasured time the same."""
    mine, theirs = {r.key: r for r in per_device.rows}, {r.key: r for r in truth.rows}
    assert {r.key for r in got.rows} == set(mine) == set(theirs)
    for r in got.rows:
        assert r.allocated_gpu_hours == pytest.approx(mine[r.key].allocated_gpu_hours, rel=1e-9), r.key
        assert r.allocated_gpu_hours == pytest.approx(theirs[r.key].allocated_gpu_hours, rel=1e-9), r.key
        # a 5-minute window where a job ends on a device busy after it: the per-user sums split it
        # by the processes' counts of the window, the per-device path by each job's part. Where the
        # window lies depends on the group's evaluation offset (a hash of the rules file's name):
        # up to one window's use per job end moves between the job's user and the next
        assert r.used_gpu_hours == pytest.approx(mine[r.key].used_gpu_hours, abs=_shift(per_device)), r.key
        assert abs(r.used_gpu_hours - theirs[r.key].used_gpu_hours) <= 2 * STEP / 3600, r.key
        assert r.unmeasured_gpu_hours == pytest.approx(mine[r.key].unmeasured_gpu_hours, abs=1e-9), r.key
        assert (r.jobs, r.idle_jobs) == (mine[r.key].jobs, mine[r.key].idle_jobs), r.key
        assert r.idle_gpu_hours == pytest.approx(mine[r.key].idle_gpu_hours, abs=STEP / 3600), r.key
    assert got.totals.gpus == per_device.totals.gpus
    assert got.totals.used_gpu_hours == pytest.approx(per_device.totals.used_gpu_hours, rel=1e-9)
    assert got.totals.allocated_gpu_hours == pytest.approx(per_device.totals.allocated_gpu_hours, rel=1e-12)


@pytest.mark.parametrize("rules_start", [HOUR, HOUR + 3600], ids=["per-user rules", "rules begin late: raw"])
def test_the_report_by_user_from_prometheus_sums_is_the_per_device_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules_start: float) -> None:
    """By user and by account: the per-user sums give the per-device report's numbers (and the
    store's), and no answer to a bucketed query holds a series per device: its points are users
    (or accounts) × buckets. Where the rules begin inside the window, the sums are joined from raw
    samples, with the same result."""
    store = _truth(tmp_path)
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False,
                    rules=RULES, rules_start=rules_start) as url:
        answers = _answers(monkeypatch)
        users = prom_users.load_user_buckets(url, SINCE, UNTIL, STEP)
        asked = list(answers)
        data = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    assert users is not None
    for by in ("user", "account"):
        _same(compute_users(users, by, POLICY), compute(data, by, POLICY), compute(store, by, POLICY))
    ranged = [(q, got) for endpoint, q, got in asked if endpoint == "query_range"]
    assert ranged
    assert not any("gpu_uuid" in (r.get("metric") or {}) for _, got in ranged for r in got)
    assert all(len(got) <= 3 for _, got in ranged)  # alice, bob, carol at most
    read_rules = any(prom_users.IN_JOBS in q for q, _ in ranged)
    assert read_rules == (rules_start == HOUR)
    # every device sampled throughout and in range, as the cluster's check rules say: no device's
    # series is read to check the whole buckets (the cost that grew with nodes x days)
    if rules_start == HOUR:
        assert not [q for q, _ in ranged if DEVICE_UTIL in q or RULE_MEMORY in q]


def _stored(tmp_path: Path, cycles: list[Cycle]) -> ReportData:
    """``cycles`` as the monitor's store holds them, read for the window: the truth."""
    with Store.open(str(tmp_path / "monitor.db")) as db:
        for c in cycles:
            db.write_cycle(c)
    return load_sqlite(str(tmp_path / "monitor.db"), SINCE, UNTIL, STEP)


def _both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cycles: list[Cycle], rules: Path
                ) -> tuple[prom_users.UserBuckets | None, list[str], ReportData]:
    """``cycles`` backfilled with ``rules`` from the first hour: the per-user sums, the queries
    of their ranged requests, and the per-device path's data."""
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles), per_process=False,
                    rules=rules, rules_start=HOUR) as url:
        answers = _answers(monkeypatch)
        users = prom_users.load_user_buckets(url, SINCE, UNTIL, STEP)
        asked = [q for endpoint, q, _ in answers if endpoint == "query_range"]
        return users, asked, load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)


def test_rules_older_than_the_check_rules_are_checked_device_by_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site whose rules file predates the cluster's check rules: the sums still come from the
    per-user rules, the checks read each device's series, and the rows are the per-device path's."""
    text = RULES.read_text()
    head, tail = text.split("      - record: cluster:gpuslurm_gpu_utilization_out_of_range:count_5m", 1)
    older = tmp_path / "older" / RULES.name
    older.parent.mkdir()
    older.write_text(head + tail[tail.index("      # every device's, and per job"):])
    assert prom_users.OUT_OF_RANGE not in older.read_text() and prom_users.FEWEST not in older.read_text()
    store = _truth(tmp_path)
    users, asked, data = _both_paths(tmp_path, monkeypatch, _cluster(), older)
    assert users is not None
    assert any(prom_users.IN_JOBS in q for q in asked)
    assert any(DEVICE_UTIL in q for q in asked) and any(RULE_MEMORY in q for q in asked)
    for by in ("user", "account"):
        _same(compute_users(users, by, POLICY), compute(data, by, POLICY), compute(store, by, POLICY))


def test_a_node_down_for_4_minutes_is_read_device_by_device_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n3's monitor down for 4 minutes inside the window (less than a bucket: a device missing
    from a whole bucket takes the per-device path): the cluster's rules count too few samples
    there, so the sums read the devices' counts node group by node group (as before the check
    rules), and name n3's gap as the per-device path does; the rows are the per-device path's and
    the store's."""
    down = (HOUR + 2 * 3600 + 100, HOUR + 2 * 3600 + 340)
    kept = [c for c in _cluster() if not (c.node == "n3" and down[0] <= c.ts < down[1])]
    store = _stored(tmp_path, kept)
    users, asked, data = _both_paths(tmp_path, monkeypatch, kept, RULES)
    assert users is not None
    assert any(RULE_MEMORY in q for q in asked)
    assert not any(DEVICE_UTIL in q for q in asked)  # no utilisation out of range: not read
    assert [g.node for g in users.gaps] == [g.node for g in data.gaps] == ["n3"], (users.gaps, data.gaps)
    assert users.gaps[0].start == pytest.approx(data.gaps[0].start, abs=STEP)
    assert users.gaps[0].end == pytest.approx(data.gaps[0].end, abs=STEP)
    for by in ("user", "account"):
        _same(compute_users(users, by, POLICY), compute(data, by, POLICY), compute(store, by, POLICY))


def test_per_process_series_take_the_per_device_path(tmp_path: Path) -> None:
    """Per-process series split a device by each process's SM utilisation: the per-user sums
    cannot, so they answer None (the caller reads per device)."""
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=True) as url:
        assert prom_users.load_user_buckets(url, SINCE, UNTIL, STEP) is None


def test_a_node_scraped_by_two_targets_takes_the_per_device_path(tmp_path: Path) -> None:
    """One exporter in two scrape jobs: every series of node n2.x twice (instances a and b). The
    sums over its series would count its use twice (the review's finding: used over allocated);
    the per-user path answers None, and the per-device path takes each device once. (The shipped
    per-job rules do not evaluate over such series at all: "many-to-many matching not allowed",
    which stops promtool's backfill, so this is the raw samples' case.)"""
    store = _truth(tmp_path)
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False,
                    twice=frozenset({"n2.x"})) as url:
        assert prom_users.load_user_buckets(url, SINCE, UNTIL, STEP) is None
        data = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    _one_row_per_device(data, store)


def test_the_report_command_by_account_reads_the_sums(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``fairshare-report --by account --source prometheus:`` takes the per-user sums (no bucketed
    answer holds a series per device); with ``--plot`` (per-device charts), the per-device path
    (its answers do): the same rows."""
    (tmp_path / "gpuslurm.toml").write_text("")
    monkeypatch.setenv("GPUSLURM_CONFIG", str(tmp_path / "gpuslurm.toml"))
    docs, per_device_answers = [], []
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False,
                    rules=RULES, rules_start=HOUR) as url:
        for plot in ((), ("--plot", str(tmp_path / "charts.html"))):
            answers = _answers(monkeypatch)
            # through the root group, as a user runs it: a command invoked alone keeps a help option
            # without -h, which later --help output in this process would show
            done = CliRunner().invoke(cli, [
                "fairshare-report", "--since", f"@{SINCE}", "--until", f"@{UNTIL}", "--step", str(STEP),
                "--by", "account",
                "--source", f"prometheus:{url}", "--format", "json", *plot], catch_exceptions=False)
            assert done.exit_code == 0, done.output
            docs.append(json.loads(done.stdout))
            per_device_answers.append(any("gpu_uuid" in (r.get("metric") or {})
                                          for endpoint, _, got in answers if endpoint == "query_range"
                                          for r in got))
            monkeypatch.undo()
            monkeypatch.setenv("GPUSLURM_CONFIG", str(tmp_path / "gpuslurm.toml"))
    assert per_device_answers == [False, True]
    sums, per_device = ({r["key"]: r for r in d["rows"]} for d in docs)
    assert set(sums) == set(per_device) >= {"phys", "chem"}
    for key, row in sums.items():
        assert row["allocated_gpu_hours"] == pytest.approx(per_device[key]["allocated_gpu_hours"], abs=1e-4)
        assert row["used_gpu_hours"] == pytest.approx(per_device[key]["used_gpu_hours"],
                                                      abs=JOBS * RULE_WINDOW_H + 1e-4)
    assert docs[0]["totals"]["gpus"] == docs[1]["totals"]["gpus"] == 6


def _without_nan_check(tmp_path: Path) -> Path:
    """The shipped rules with the cluster's out-of-range count as it was before it counted NaN
    (a site that has not updated its rules file): the same file name, so the same phase."""
    text = RULES.read_text()
    nan = ("\n            or\n            last_over_time(device:gpuslurm_gpu_utilization_ratio:sum_5m[1s])\n"
           "              != last_over_time(device:gpuslurm_gpu_utilization_ratio:sum_5m[1s]))")
    assert nan in text
    older = tmp_path / "older" / RULES.name
    older.parent.mkdir()
    older.write_text(text.replace(nan, ")"))
    return older


@pytest.mark.parametrize(("bad", "rules"), [
    (170.0, "per-user rules"), (170.0, "joined from raw samples"),
    (math.nan, "per-user rules"), (math.nan, "joined from raw samples"),
    (math.nan, "check rule blind to NaN")], ids=lambda x: "NaN" if x != x else str(x))
def test_a_utilisation_above_one_or_nan_is_refused_by_the_sums_too(tmp_path: Path, bad: float,
                                                                  rules: str) -> None:
    """A broken (or forged) exporter says a GPU was 1.7 busy, or NaN, for 10 minutes: the per-user
    sums refuse it as the per-device path and the store do (one validation), naming the series,
    exit 2. A NaN sample makes its buckets' sums NaN, never a gap; with a rules file whose check
    rule does not count NaN, the NaN in the sums sends the report to every device's series."""
    cycles = _cluster()
    gpu = cycles[200].gpus[1].gpu_uuid
    for i in range(200, 220):  # node n1's G1, cycles 200-219
        c = cycles[i]
        cycles[i] = c._replace(gpus=(c.gpus[0], c.gpus[1]._replace(util_pct=bad)))
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles), per_process=False,
                    rules=_without_nan_check(tmp_path) if rules == "check rule blind to NaN" else RULES,
                    rules_start=HOUR + 3600 if rules == "joined from raw samples" else HOUR) as url, \
            pytest.raises(InputError) as exc:
        prom_users.load_user_buckets(url, SINCE, UNTIL, STEP)
    message = str(exc.value)
    assert "damaged series: gpuslurm_gpu_utilization_ratio{" in message and gpu in message, message
    assert "not a number in 0..100" in message and "\n" not in message
    assert ("float nan" in message) == (bad != bad)
    assert exc.value.exit_code == 2


CASES = ["n3 down for six rule windows", "n3's G1 gone while G0 is sampled", "n3 added late"]


@pytest.mark.parametrize("case", CASES)
def test_devices_missing_from_whole_buckets_are_summed_as_the_per_device_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Devices missing from whole buckets inside the window, as a site of 64 nodes over 30 days
    always has somewhere: n3's monitor down for exactly six of the rules' 5-minute windows (its
    scrapes missing from one evaluation's range to another's, so that the fewest samples of the
    devices still sampled say nothing and only the count of device series catches it); n3's G1
    fallen off the bus for those 30 minutes while G0 and the monitor go on (NVML sees neither
    the GPU nor its process; the job still holds it); n3 joining the cluster 2 hours in. The
    sums answer, with the per-device path's and the store's rows, each job's unmeasured time,
    and the gap only where a monitor was down inside its node's span."""
    with backfilled(tmp_path / "whole", ((c, ()) for c in _cluster()), per_process=False,
                    rules=RULES, rules_start=HOUR) as url:
        last = PrometheusClient(url).instant(f"max(timestamp({RULE_MEMORY}))", UNTIL)
    phase = float(last[0]["value"][1]) % 300
    edge = HOUR + 2 * 3600 + phase  # an evaluation's time
    kept = []
    for c in _cluster():
        inside = c.node == "n3" and edge < c.ts <= edge + 1800
        if (case == CASES[0] and inside) or (case == CASES[2] and c.node == "n3" and c.ts <= edge):
            continue
        if case == CASES[1] and inside:
            g0 = c.gpus[0].gpu_uuid
            c = c._replace(gpus=c.gpus[:1], procs=tuple(p for p in c.procs if p.gpu_uuid == g0))
        kept.append(c)
    store = _stored(tmp_path, kept)
    if case == CASES[0]:
        with backfilled(tmp_path / "prom", ((c, ()) for c in kept), per_process=False,
                        rules=RULES, rules_start=HOUR) as url:
            prom = PrometheusClient(url)
            fewest = prom.instant(f"min_over_time({prom_users.FEWEST}[1800s])", edge + 1800)
            sampled = prom.instant(f"min_over_time({prom_users.SAMPLED}[1800s])", edge + 1800)
        assert float(fewest[0]["value"][1]) >= 10 and float(sampled[0]["value"][1]) == 4, (fewest, sampled)
    users, asked, data = _both_paths(tmp_path / "both", monkeypatch, kept, RULES)
    assert users is not None
    assert any(RULE_MEMORY in q for q in asked)  # the cluster's rules did not vouch: counts read
    assert not any(DEVICE_UTIL in q for q in asked)  # no utilisation out of range: not read
    gaps = ["n3"] if case == CASES[0] else []
    assert [g.node for g in users.gaps] == [g.node for g in data.gaps] == gaps, (users.gaps, data.gaps)
    for mine, theirs in zip(users.gaps, data.gaps, strict=True):
        assert (mine.start, mine.end) == pytest.approx((theirs.start, theirs.end), abs=STEP)
    assert users.gpus == len({(g.node, g.uuid) for g in data.gpus}) == 6
    # bob's job on n3's G1 (job 22) held it unsampled, in each case (the rows: _same)
    assert users.unmeasured_s.get(("n3", "22"), 0.0) >= 1800 - STEP, users.unmeasured_s
    for by in ("user", "account"):
        _same(compute_users(users, by, POLICY), compute(data, by, POLICY), compute(store, by, POLICY))



def test_a_device_under_two_label_sets_takes_the_per_device_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n3's scrape job renamed 3 hours in (or a target label added by relabelling): each of its
    devices has two series, each absent from half the window. Taken as missing devices, the sums
    would count 8 GPUs and each of n3's jobs unmeasured for its whole span; the window's device
    names hold two label sets for one device, so the sums answer None (the caller reads per device)."""
    edge = HOUR + 3 * 3600 + 100
    plain = prom_backfill.openmetrics

    def relabelled(*args: Any) -> str:
        out = []
        for line in plain(*args).splitlines(keepends=True):
            at = line.rsplit(" ", 1)[-1]
            if 'node="n3"' in line and at.strip().replace(".", "").isdigit() and float(at) > edge:
                line = line.replace("{", '{job="gpu-nodes",', 1)
            out.append(line)
        return "".join(out)

    monkeypatch.setattr(prom_backfill, "openmetrics", relabelled)
    store = _truth(tmp_path)
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False) as url:
        names = prom_users._device_names(PrometheusClient(url), SINCE, UNTIL)
        assert names is None
        assert len(PrometheusClient(url).series("gpuslurm_gpu_memory_total_bytes", SINCE, UNTIL)) == 8
        assert prom_users.load_user_buckets(url, SINCE, UNTIL, STEP) is None
        data = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    _one_row_per_device(data, store)


def _one_row_per_device(data: ReportData, store: ReportData) -> None:
    """The per-device path holds each device once (its series joined), so a job holding it is
    counted once: allocated as the store's, exactly; used, idle and unmeasured within a bucket's
    rounding of the store's."""
    assert len(data.gpus) == len({(g.node, g.uuid) for g in data.gpus}) == 6
    for by in ("user", "account"):
        got, want = compute(data, by, POLICY), compute(store, by, POLICY)
        theirs = {r.key: r for r in want.rows}
        assert {r.key for r in got.rows} == set(theirs)
        for r in got.rows:
            assert r.allocated_gpu_hours == pytest.approx(theirs[r.key].allocated_gpu_hours, rel=1e-9), r.key
            assert r.used_gpu_hours == pytest.approx(theirs[r.key].used_gpu_hours, abs=2 * STEP / 3600), r.key
            unmeasured = theirs[r.key].unmeasured_gpu_hours
            assert r.unmeasured_gpu_hours == pytest.approx(unmeasured, abs=1e-6), r.key
        assert got.totals.used_gpu_hours == pytest.approx(want.totals.used_gpu_hours, rel=1e-3)


def test_a_job_idle_but_for_its_last_minutes_is_idle_on_both_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """carol's job on n1's GPU 0 idle for 3 hours, then busy for the window's last 5 minutes: 2.7 %
    over the window, an idle allocation. Her devices' utilisation is read from the rules up to the
    last whole bucket and from raw samples after it; her mean is the two parts' sum over both
    counts (were the raw part's to replace the rules', she would be 77 % busy)."""
    cycles = []
    for c in _cluster():
        if c.node == "n1" and c.ts >= HOUR + 3 * 3600:
            busy = 100.0 if UNTIL - 300 <= c.ts < UNTIL else 0.0
            c = c._replace(gpus=(c.gpus[0]._replace(util_pct=busy), c.gpus[1]))
        cycles.append(c)
    store = _stored(tmp_path, cycles)
    users, _, data = _both_paths(tmp_path, monkeypatch, cycles, RULES)
    assert users is not None
    last_whole_end = users.start + math.floor((UNTIL - users.start) / STEP) * STEP
    assert UNTIL - 300 < last_whole_end < UNTIL  # the busy minutes straddle the rules' end
    # 10 busy samples of about 373 (a rule window's and a subquery step's samples at the edges)
    assert 0.02 < users.job_util[("n1", "03")] < 0.04, users.job_util[("n1", "03")]
    for by in ("user", "account"):
        got = {r.key: r for r in compute_users(users, by, POLICY).rows}
        assert got["carol" if by == "user" else "chem"].idle_jobs >= 1
        _same(compute_users(users, by, POLICY), compute(data, by, POLICY), compute(store, by, POLICY))
