"""Whether Slurm's cgroup.conf constrains devices: the Slurm adapter's answer to
``Scheduler.constrains_devices`` (:func:`gpuslurm.slurm.cgroup_v2.constrains_devices`), pure and on
a real file; the part of cgroup.conf it reads and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.config import Config, PathsConfig
from gpuslurm.errors import InputError
from gpuslurm.slurm.adapter import SlurmScheduler
from gpuslurm.slurm.cgroup_v2 import MAX_CONF_BYTES, constrains_devices


@pytest.mark.parametrize(("text", "expected"), [
    ("ConstrainDevices=yes\n", True),
    ("constraindevices = YES # with a comment\n", True),
    ("ConstrainDevices=true\n", True),
    ("ConstrainDevices=no\n", False),
    ("ConstrainDevices=yes\nConstrainDevices=no\n", False),  # the last setting wins
    ("#ConstrainDevices=yes\nConstrainCores=yes\n", False),
    ("ConstrainDevices=maybe\n", False),  # not Slurm's true: gpuslurm isolates itself
    ("CgroupSlice=user.slice\nConstrainDevices=yes\n", True),  # a v2-only key never fails v1 nodes
    ("", False),
    (None, False),
])
def test_constrains_devices(text: str | None, expected: bool) -> None:
    assert constrains_devices(text) is expected


_LINE = st.one_of(
    st.tuples(st.sampled_from(["ConstrainDevices", "constraindevices", " CONSTRAINDEVICES "]),
              st.sampled_from(["yes", "no", "true", "false", "1", "0", "up", "down", "", "maybe", "YES"]),
              st.booleans()),
    st.text(alphabet=st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
            max_size=40),
)


@given(st.lists(_LINE, max_size=12))
def test_constrains_devices_is_the_last_uncommented_setting(lines: list[tuple[str, str, bool] | str]) -> None:
    """Any text: never raises; the answer is the last uncommented ConstrainDevices line's."""
    text, expected = [], False
    for line in lines:
        if isinstance(line, tuple):
            key, value, commented = line
            text.append(f"{'#' if commented else ''}{key}={value}")
            if not commented:
                expected = value.lower() in ("yes", "true", "1", "up")
        elif "constraindevices" not in line.lower():
            text.append(line)
    assert constrains_devices("\n".join(text)) is expected


def test_the_adapter_reads_the_configured_cgroup_conf(tmp_path: Path) -> None:
    conf = tmp_path / "cgroup.conf"
    cfg = Config(paths=PathsConfig(slurm_cgroup_conf=str(conf)))
    sched = SlurmScheduler()
    assert sched.constrains_devices(cfg) is False  # no file: Slurm constrains nothing
    conf.write_text("CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n")
    assert sched.constrains_devices(cfg) is True
    conf.write_text("ConstrainDevices=no\n" + "#" * MAX_CONF_BYTES)
    with pytest.raises(InputError, match="larger than"):  # bounded: one line, exit 2
        sched.constrains_devices(cfg)
