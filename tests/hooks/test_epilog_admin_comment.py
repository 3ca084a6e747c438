"""The epilog's AdminComment when Slurm refuses to update a finished job (Slurm 22.05)."""

from __future__ import annotations

import io
from pathlib import Path

from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.hooks import run_epilog, run_prolog


def refusing_site(tmp_path: Path, answer: str) -> HookSite:
    site = make_site(tmp_path)
    log = site.scontrol_log
    # records the call as make_site's stand-in does, then answers as slurmctld 22.05 does
    (site.root / "scontrol").write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done | sed "s/\\x00$//" >> {log}\n'
        f'printf "\\0END\\n" >> {log}\necho "{answer}" >&2\nexit 1\n')
    site.write_config("[epilog]\nadmin_comment = true\nkill_grace_s = 1\n")
    return site


class LevelLog(HookLog):
    """Keeps each line with its syslog level."""

    def __init__(self) -> None:
        super().__init__("epilog", io.StringIO(), False)
        self.levels: list[tuple[int, str]] = []

    def _emit(self, level: int, message: str) -> None:
        super()._emit(level, message)
        self.levels.append((level, self.lines[-1]))


def epilog_lines(site: HookSite) -> list[tuple[int, str]]:
    assert run_prolog(site.environ(gpus="0,1"), HookLog("prolog", io.StringIO(), False)) == 0
    log = LevelLog()
    assert run_epilog(site.environ(gpus="0,1"), log) == 0
    return [(level, line) for level, line in log.levels
            if "AdminComment" in line or "final comment" in line]


def test_a_finished_job_refusal_is_one_info_line(tmp_path: Path) -> None:
    site = refusing_site(tmp_path, "Job has already finished")
    assert epilog_lines(site) == [(6, "gpuslurm epilog job 1234: Slurm does not update a finished job: "
                                      "the monitor's last AdminComment stands")]  # LOG_INFO
    [call] = site.scontrol_calls()
    assert call[:2] == ["update", "JobId=1234"]


def test_another_refusal_is_still_an_error(tmp_path: Path) -> None:
    site = refusing_site(tmp_path, "Invalid job id specified")
    assert epilog_lines(site) == [(3, "gpuslurm epilog job 1234: cannot set the job's final comment: "
                                      "scontrol exited 1: Invalid job id specified")]  # LOG_ERR
