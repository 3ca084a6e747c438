"""The shipped recording rules (packaging/gpuslurm-rules.yml) pass ``promtool check rules`` and
their unit tests (tests/prometheus/gpuslurm-rules.test.yml), which fail when an expectation is wrong."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROMTOOL = "/usr/bin/promtool"
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "gpuslurm-rules.yml"
TESTS = Path(__file__).with_name("gpuslurm-rules.test.yml")

pytestmark = pytest.mark.skipif(not os.access(PROMTOOL, os.X_OK),
                                reason=f"{PROMTOOL} is absent: apt-get install prometheus (.ci/run does)")


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_rules_are_valid_prometheus_rules() -> None:
    done = _promtool("check", "rules", str(RULES), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 24 rules found" in done.stdout


def test_the_rules_give_the_per_job_and_per_user_aggregates() -> None:
    done = _promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_expectation_fails_the_rule_tests(tmp_path: Path) -> None:
    """The unit tests can fail: alice's two GPUs expected as three."""
    (tmp_path / "packaging").mkdir()
    shutil.copy(RULES, tmp_path / "packaging" / RULES.name)
    here = tmp_path / "tests" / "prom"
    here.mkdir(parents=True)
    text = TESTS.read_text()
    wrong = text.replace("""user:gpuslurm_gpus_allocated:sum{user="alice",account="phys"}'
            value: 2""", """user:gpuslurm_gpus_allocated:sum{user="alice",account="phys"}'
            value: 3""")
    assert wrong != text
    (here / TESTS.name).write_text(wrong)
    done = _promtool("test", "rules", TESTS.name, cwd=here)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


def test_the_out_of_range_rule_uses_the_stores_bound() -> None:
    """The cluster's check rule and the store refuse the same utilisation: above MAX_PCT (a mean
    of stored percentages may round just above 100), or below 0."""
    from gpuslurm.state.store_values import MAX_PCT

    rule = RULES.read_text().split("record: cluster:gpuslurm_gpu_utilization_out_of_range:count_5m", 1)[1]
    rule = rule.split("- record:", 1)[0]
    assert f"> {MAX_PCT / 100!r}" in rule and "< 0" in rule, rule


def test_backfill_runs_the_rules_over_rules_second() -> None:
    """promtool's backfill cannot evaluate a rule over rules of the same run: the tests' backfill
    (and the benchmark's) runs the cluster's check rules after the device rules they read."""
    from tests.helpers.prom_backfill import rule_runs

    first, second = rule_runs(RULES.read_text())
    assert "record: device:gpuslurm_gpu_memory_total_bytes:count_5m" in first
    assert "cluster:gpuslurm_gpu_memory_total_bytes:min_count_5m" not in first
    assert "record: cluster:gpuslurm_gpu_memory_total_bytes:min_count_5m" in second
    assert "record: device:" not in second and "name: gpuslurm_5m" in second
