"""Reading existing gres.conf files as Slurm would."""

from __future__ import annotations

import pytest

from gpuslurm.errors import InputError
from gpuslurm.gres.conf_parse import expand_hostlist, parse_gres_conf

SITE_CONF = """\
# a typical hand-written file shared by a cluster
AutoDetect=off
NodeName=gpu[01-02,05] Name=gpu Type=a100 File=/dev/nvidia[0-1] Cores=0-15
NodeName=gpu[01-02,05] Name=gpu Type=a100 File=/dev/nvidia[2-3] cpus=16-31   # old key name
nodename=login1 name=gpu File=/dev/nvidia0
NodeName=gpu01 Name=mps Count=4K File=/dev/nvidia0
Name=gpu Type=a100_3g.40gb \
MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22
"""


def test_hostlists_expand_with_padding() -> None:
    assert list(expand_hostlist("gpu[01-03,07],login1")) == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]


def test_lines_for_one_node_with_ranges_expanded() -> None:
    entries = parse_gres_conf(SITE_CONF, "gres.conf", "gpu05")
    gpus = [e for e in entries if e.name == "gpu"]
    assert [e.files for e in gpus][:4] == [("/dev/nvidia0",), ("/dev/nvidia1",), ("/dev/nvidia2",),
                                            ("/dev/nvidia3",)]
    assert gpus[2].cores == tuple(range(16, 32))
    assert gpus[2].line == 4
    mig = gpus[4]
    assert mig.type == "a100_3g.40gb" and len(mig.files) == 3
    assert all(e.name != "mps" for e in entries)  # gpu01 only


def test_count_suffix_and_case_insensitive_keys() -> None:
    entries = parse_gres_conf(SITE_CONF, "gres.conf", "gpu01")
    mps = [e for e in entries if e.name == "mps"]
    assert mps[0].count == 4096


@pytest.mark.parametrize(("text", "words"), [
    ("Name=gpu File=/dev/nvidia0 Cores=0-x\n", "line 1: bad Cores="),
    ("NodeName=a File=/dev/nvidia0\n", "line 1: no Name="),
    ("Name=gpu garbage\n", "expected key=value"),
    ("Name=mps Count=lots\n", "bad Count="),
    ("Name=gpu File=/dev/nvidia[0-99999999999]\n", "line 1: bad File="),
    ("Name=gpu File=/dev/nvidia[4-]\n", "line 1: bad File="),
    ("Name=gpu File=/dev/nvidia[0-1e308]\n", "line 1: bad File="),
    ("Name=gpu MultipleFiles=/dev/nvidia[0-1\n", "line 1: bad Multiplefiles="),
    ("Name=gpu File=/dev/nvidia0 Cores=56-18446744073709551616\n", "line 1: bad Cores="),
    ("NodeName=n[0-99999999999] Name=gpu File=/dev/nvidia0\n", "line 1: bad NodeName"),
])
def test_bad_lines_name_the_file_and_line(text: str, words: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_gres_conf(text, "/etc/slurm/gres.conf")
    assert words in str(exc.value)
    assert str(exc.value).startswith("/etc/slurm/gres.conf: ")
