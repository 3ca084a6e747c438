"""Digits that are not ASCII: ``str.isdigit()`` takes '²' (which ``int`` refuses: a crash) and
'١٢' (which ``int`` reads as 12: a spoof). Each parser that tested isdigit() before int() now
takes ASCII digits only, and a bounded number of them (``int`` refuses over 4,300 digits)."""

from __future__ import annotations

import pytest

from gpuslurm.errors import InputError
from gpuslurm.report.prom_decode import proc_order
from gpuslurm.slurm.cgroup_paths import parse_cgroup
from gpuslurm.slurm.sshare import parse_sshare
from gpuslurm.watch import view

ODD = ["²", "١٢", "0²", "9" * 5000]


@pytest.mark.parametrize("digits", ODD)
def test_a_cgroup_line_with_odd_uid_digits_names_no_job(digits: str) -> None:
    assert parse_cgroup(f"4:devices:/slurm/uid_{digits}/job_12/step_0\n") is None
    assert parse_cgroup("4:devices:/slurm/uid_1000/job_12/step_0\n") is not None  # the control


@pytest.mark.parametrize("digits", ODD)
def test_sshare_raw_shares_in_odd_digits_are_a_one_line_input_error(digits: str) -> None:
    text = f"Account|User|RawShares|NormShares\nroot||{digits}|1.000000\n"
    with pytest.raises(InputError, match="RawShares"):
        parse_sshare(text)


@pytest.mark.parametrize("digits", ODD)
def test_the_status_views_sort_keys_take_odd_digits_as_no_number(digits: str) -> None:
    assert view._job_key(digits) == (-1, digits)
    assert view._label_key(f"1.{digits}") == (1, 1 << 30)


@pytest.mark.parametrize("digits", ODD)
def test_a_prometheus_pid_label_in_odd_digits_sorts_as_no_pid(digits: str) -> None:
    key = (("node", "n1"), ("pid", digits), ("job_id", "7"))
    assert proc_order(key)[2] == 0  # type: ignore[arg-type]
