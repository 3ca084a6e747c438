"""slurm/throttle_sync: the use case behind ``gpuslurm throttle sync``, called directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.config import Config, ThrottleConfig
from gpuslurm.errors import InputError
from gpuslurm.samples import Violation
from gpuslurm.slurm.throttle import append_violations, read_throttle_file
from gpuslurm.slurm.throttle_sync import sync_policy, sync_throttles

NOW = 1_900_000_000.0


def rogue(user: str, start: float = NOW - 600) -> Violation:
    return Violation("rogue", "n1", user, None, 42, "python", None, start, 60.0, "outside any job")


def test_a_dry_run_says_what_it_would_throttle_and_writes_nothing(tmp_path: Path) -> None:
    append_violations(str(tmp_path / "v"), "n1", [rogue("alice"), rogue("bob", start=NOW + 3 * 86400)])
    warnings: list[str] = []
    file = tmp_path / "throttle"
    done = sync_throttles(Config(), str(file), violations_dir=str(tmp_path / "v"), dry_run=True,
                          warn=warnings.append, now=NOW)
    assert [t.user for t in done.changed] == ["alice"] and done.violations == 2
    assert done.before is None and not file.exists()
    assert [w for w in warnings if "violation of bob on n1" in w]  # more than a day ahead: skipped
    written = sync_throttles(Config(), str(file), violations_dir=str(tmp_path / "v"), now=NOW)
    assert [t.user for t in read_throttle_file(str(file)).throttles] == ["alice"]
    assert written.before is not None and not written.before.exists


def test_a_missing_directory_is_said_and_a_bad_source_is_bad_input(tmp_path: Path) -> None:
    warnings: list[str] = []
    done = sync_throttles(Config(), str(tmp_path / "t"), violations_dir=str(tmp_path / "none"),
                          dry_run=True, warn=warnings.append, now=NOW)
    assert done.changed == () and "no such directory" in warnings[0]
    with pytest.raises(InputError, match="not a violation source") as caught:
        sync_throttles(Config(), str(tmp_path / "t"), source="http://x", now=NOW)
    assert caught.value.exit_code == 2


def test_the_policy_keeps_fractions_of_a_minute() -> None:
    policy = sync_policy(Config(throttle=ThrottleConfig(sync_minutes=0.5, sync_mode="cap", cap_gpus=2)))
    assert policy.duration_s == 30.0 and policy.mode == "cap" and policy.value == 2
