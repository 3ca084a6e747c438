"""slurmd -G: the parser on recorded output, and the harness against the real slurmd."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.slurm_harness import (
    make_devices,
    slurmd_parse,
    slurmd_report,
    write_gres_conf,
    write_slurm_conf,
)

from gpuslurm.errors import CommandError
from gpuslurm.slurm.slurmd_g import expand_files, expand_ranges, parse_slurmd_g, parse_slurmd_report

# Recorded from /usr/sbin/slurmd -G (Slurm 22.05.8) on a 2x56x2 node; stderr, as printed.
H100_OUTPUT = """\
slurmd-vm: Gres Name=gpu Type=nvidia_h100_80gb_hbm3 Count=1 Index=0 ID=7696487 File=/tmp/sx/dev/nvidia0 \
Cores=0-55 CoreCnt=224 Links=-1,18,18,18,18,18,18,18
slurmd-vm: Gres Name=gpu Type=nvidia_h100_80gb_hbm3 Count=1 Index=7 ID=7696487 File=/tmp/sx/dev/nvidia7 \
Cores=56-111 CoreCnt=224 Links=18,18,18,18,18,18,18,-1
"""

MIXED_OUTPUT = """\
slurmd-vm: Gres Name=gpu Type=1g.10gb Count=1 Index=22 ID=7696487 File=/tmp/sx/dev/nvidia0,\
/tmp/sx/dev/nvidia-caps/nvidia-cap21,/tmp/sx/dev/nvidia-caps/nvidia-cap22 Cores=0-55 CoreCnt=224 (null)
slurmd-vm: Gres Name=mps Type=h100 Count=100 Index=1 ID=7565421 File=/tmp/sx/dev/nvidia1 Cores=111 \
CoreCnt=224 (null)
slurmd-vm: Gres Name=gpu Type=(null) Count=2 Index=0 ID=7696487 File=/tmp/sx/dev/nvidia[0-1] (null)
slurmd-vm: Gres Name=bandwidth Type=lustre Count=4294967296 ID=3637693249 (null)
"""

PROBLEM_OUTPUT = """\
slurmd-vm: We were configured with nvml functionality, but that lib wasn't found on the system.
slurmd-vm: error: /tmp/sx/regular is not a valid character or block device, fix your gres.conf
slurmd-vm: error: /tmp/sx/regular is not a valid character or block device, fix your gres.conf
slurmd-vm: error: /tmp/sx/regular is not a valid character or block device, fix your gres.conf
slurmd-vm: WARNING: A line in gres.conf for GRES gpu:a100 has 2 more configured than expected in \
slurm.conf. Ignoring extra GRES.
slurmd-vm: Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 File=/tmp/sx/regular Cores=0-55 \
CoreCnt=224 (null)
slurmd: fatal: Unable to determine this slurmd's NodeName
"""


def test_parse_full_record() -> None:
    first, last = parse_slurmd_g(H100_OUTPUT)
    assert first.name == "gpu"
    assert first.type == "nvidia_h100_80gb_hbm3"
    assert (first.count, first.index, first.plugin_id) == (1, 0, 7696487)
    assert first.files == ("/tmp/sx/dev/nvidia0",)
    assert (first.cores, first.core_count) == ("0-55", 224)
    assert first.links == "-1,18,18,18,18,18,18,18"
    assert last.index == 7
    assert last.core_ids == tuple(range(56, 112))


def test_parse_nulls_multiple_files_and_missing_fields() -> None:
    mig, mps, untyped, bandwidth = parse_slurmd_g(MIXED_OUTPUT)
    assert mig.files == ("/tmp/sx/dev/nvidia0", "/tmp/sx/dev/nvidia-caps/nvidia-cap21",
                         "/tmp/sx/dev/nvidia-caps/nvidia-cap22")
    assert mig.index == 22  # the last file's trailing digits, as slurmd computes it
    assert mig.links is None
    assert (mps.name, mps.count, mps.cores) == ("mps", 100, "111")
    assert untyped.type is None
    assert untyped.file == "/tmp/sx/dev/nvidia[0-1]"
    assert untyped.files == ("/tmp/sx/dev/nvidia0", "/tmp/sx/dev/nvidia1")
    assert (untyped.cores, untyped.core_count, untyped.core_ids) == (None, None, ())
    assert (bandwidth.count, bandwidth.index, bandwidth.file, bandwidth.files) == (2**32, None, None, ())


def test_parse_problems_are_deduplicated_and_kept_apart() -> None:
    report = parse_slurmd_report(PROBLEM_OUTPUT)
    assert [r.file for r in report.records] == ["/tmp/sx/regular"]
    assert report.problems == (
        "error: /tmp/sx/regular is not a valid character or block device, fix your gres.conf",
        "WARNING: A line in gres.conf for GRES gpu:a100 has 2 more configured than expected in "
        "slurm.conf. Ignoring extra GRES.",
        "fatal: Unable to determine this slurmd's NodeName",
    )
    assert report.notes == ("We were configured with nvml functionality, but that lib wasn't found "
                            "on the system.",)


@pytest.mark.parametrize("line", [
    "slurmd-vm: Gres Name=gpu Type=h100 Index=0",
    "slurmd-vm: Gres Name=gpu Count=one",
    "slurmd-vm: Gres Name=gpu Count=1 stray",
])
def test_parse_rejects_malformed_records(line: str) -> None:
    with pytest.raises(CommandError, match="slurmd -G"):
        parse_slurmd_g(line)


def test_expand_files() -> None:
    assert expand_files("/d/nvidia[0-2,5]") == ("/d/nvidia0", "/d/nvidia1", "/d/nvidia2", "/d/nvidia5")
    assert expand_files("/d/nvidia0,/d/caps/cap[21-22]") == ("/d/nvidia0", "/d/caps/cap21", "/d/caps/cap22")
    assert expand_files("/d/n[08-10]") == ("/d/n08", "/d/n09", "/d/n10")
    assert expand_files("/d/g[0-1]c[1-2]") == ("/d/g0c1", "/d/g0c2", "/d/g1c1", "/d/g1c2")
    with pytest.raises(ValueError, match="unbalanced"):
        expand_files("/d/nvidia[0-1")


def test_expand_ranges() -> None:
    assert expand_ranges("8,0-3,2") == (0, 1, 2, 3, 8)
    with pytest.raises(ValueError, match="backwards range"):
        expand_ranges("3-1")
    with pytest.raises(ValueError, match="not a number or range"):
        expand_ranges("1-")


# ---- the real slurmd ----------------------------------------------------------------------------

H100_NODE = ("NodeName=dgx-h100 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 RealMemory=1000 "
             "Gres=gpu:nvidia_h100_80gb_hbm3:8")


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    return tmp_path / "dev"


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    return tmp_path / "etc"


def _h100_gres_conf(dev: Path) -> tuple[str, list[tuple[str, str, str]]]:
    meant = []
    lines = []
    for i in range(8):
        cores = "0-55" if i < 4 else "56-111"
        links = ",".join("-1" if j == i else "18" for j in range(8))
        meant.append((f"{dev}/nvidia{i}", cores, links))
        lines.append(f"Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia{i} Cores={cores} Links={links}")
    return "AutoDetect=off\n" + "\n".join(lines) + "\n", meant


@pytest.mark.slurm
def test_real_h100_eight_gpus(dev: Path, conf: Path) -> None:
    make_devices(dev, range(8))
    assert write_slurm_conf(conf, H100_NODE, gres_types="gpu") == "dgx-h100"
    text, meant = _h100_gres_conf(dev)
    records = slurmd_parse(conf, text)
    assert [(r.name, r.type, r.count) for r in records] == [("gpu", "nvidia_h100_80gb_hbm3", 1)] * 8
    assert [(r.file, r.cores, r.links) for r in records] == meant
    assert {r.core_count for r in records} == {224}  # CPUs of the node line, not of this machine


@pytest.mark.slurm
def test_real_gres_conf_nodename_lines_select_the_node(dev: Path, conf: Path) -> None:
    make_devices(dev, range(2))
    write_slurm_conf(conf, H100_NODE.replace(":8", ":1"), gres_types="gpu")
    records = slurmd_parse(conf, (
        f"NodeName=dgx-h100 Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia1 Cores=56-111\n"
        f"NodeName=other Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia0 Cores=0-55\n"))
    assert [(r.file, r.cores) for r in records] == [(f"{dev}/nvidia1", "56-111")]


MIG_NODE = ("NodeName=a100-mig Sockets=2 CoresPerSocket=32 ThreadsPerCore=2 RealMemory=1000 "
            "Gres=gpu:3g.20gb:2,gpu:a100:1")


def _mig_gres_conf(dev: Path) -> str:
    caps = f"{dev}/nvidia-caps/nvidia-cap"
    return (f"Name=gpu Type=3g.20gb MultipleFiles={dev}/nvidia0,{caps}21,{caps}22 Cores=0-31\n"
            f"Name=gpu Type=3g.20gb MultipleFiles={dev}/nvidia0,{caps}30,{caps}31 Cores=0-31\n"
            f"Name=gpu Type=a100 File={dev}/nvidia1 Cores=32-63\n")


@pytest.mark.slurm
def test_real_mig_multiple_files(dev: Path, conf: Path) -> None:
    make_devices(dev, range(2), caps=(21, 22, 30, 31))
    write_slurm_conf(conf, MIG_NODE, gres_types="gpu")
    records = slurmd_parse(conf, _mig_gres_conf(dev))
    caps = f"{dev}/nvidia-caps/nvidia-cap"
    assert [(r.type, r.count, r.files) for r in records] == [
        ("3g.20gb", 1, (f"{dev}/nvidia0", f"{caps}21", f"{caps}22")),
        ("3g.20gb", 1, (f"{dev}/nvidia0", f"{caps}30", f"{caps}31")),
        ("a100", 1, (f"{dev}/nvidia1",)),
    ]


@pytest.mark.slurm
def test_real_mig_split_per_file_when_sharing_is_configured(dev: Path, conf: Path) -> None:
    # Slurm 22.05 bug 17482: with shard (or mps) in GresTypes each MIG file becomes its own GPU.
    # gres.conf generation must know this; if a newer Slurm fixes it, this test says so.
    make_devices(dev, range(2), caps=(21, 22, 30, 31))
    write_slurm_conf(conf, MIG_NODE, gres_types="gpu,shard")
    gpus = [r for r in slurmd_parse(conf, _mig_gres_conf(dev)) if r.name == "gpu"]
    assert sum(r.count for r in gpus if r.type == "3g.20gb") == 6
    assert all(len(r.files) == 1 for r in gpus)


@pytest.mark.slurm
def test_real_mps_and_shard_counts(dev: Path, conf: Path) -> None:
    make_devices(dev, range(2))
    write_slurm_conf(conf, "NodeName=n1 Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000 "
                           "Gres=gpu:a100:2,mps:300,shard:8")
    records = slurmd_parse(conf, (
        f"Name=gpu Type=a100 File={dev}/nvidia0 Cores=0-7\n"
        f"Name=gpu Type=a100 File={dev}/nvidia1 Cores=8-15\n"
        f"Name=mps Count=200 File={dev}/nvidia0\n"
        f"Name=mps Count=100 File={dev}/nvidia1\n"
        f"Name=shard Count=8 File={dev}/nvidia[0-1]\n"))
    by_name = {(r.name, r.file): r for r in records}
    assert len(by_name) == len(records) == 6
    mps0 = by_name[("mps", f"{dev}/nvidia0")]
    assert (mps0.count, mps0.type, mps0.cores) == (200, "a100", "0-7")  # Type and Cores from the GPU
    assert by_name[("mps", f"{dev}/nvidia1")].count == 100
    assert [by_name[("shard", f"{dev}/nvidia{i}")].count for i in range(2)] == [4, 4]  # split evenly


@pytest.mark.slurm
def test_real_regular_file_is_an_error(dev: Path, conf: Path) -> None:
    make_devices(dev, [0])
    (dev / "nvidia1").write_text("")
    write_slurm_conf(conf, H100_NODE.replace(":8", ":2"), gres_types="gpu")
    with pytest.raises(CommandError, match="nvidia1 is not a valid character or block device") as exc:
        slurmd_parse(conf, f"Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia[0-1] Cores=0-55\n")
    assert exc.value.returncode == 0  # slurmd itself exits 0 here


@pytest.mark.slurm
def test_real_cores_beyond_the_node_are_an_error(dev: Path, conf: Path) -> None:
    make_devices(dev, [0])
    write_slurm_conf(conf, H100_NODE.replace(":8", ":1"), gres_types="gpu")
    with pytest.raises(CommandError, match=r"Invalid GRES data for gpu, Cores=100-112"):
        slurmd_parse(conf, f"Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia0 Cores=100-112\n")


@pytest.mark.slurm
def test_real_type_missing_from_node_line_is_an_error(dev: Path, conf: Path) -> None:
    make_devices(dev, [0])
    write_slurm_conf(conf, H100_NODE.replace(":8", ":1"), gres_types="gpu")
    text = f"Name=gpu Type=nvidia_a100 File={dev}/nvidia0\n"
    with pytest.raises(CommandError, match=r"WARNING: .*gpu:nvidia_a100"):
        slurmd_parse(conf, text)
    assert slurmd_report(conf, text).records == ()  # slurmd dropped the GPU


@pytest.mark.slurm
def test_real_unknown_key_is_fatal(dev: Path, conf: Path) -> None:
    make_devices(dev, [0])
    write_slurm_conf(conf, H100_NODE.replace(":8", ":1"), gres_types="gpu")
    with pytest.raises(CommandError, match=r"exited 1: .*unrecognized key: UniqueId"):
        slurmd_parse(conf, f"Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia0 UniqueId=GPU-1\n")


@pytest.mark.slurm
def test_real_too_few_gpus_is_silent(dev: Path, conf: Path) -> None:
    # Slurm drops the GPUs gres.conf does not name without a word: callers must compare counts.
    make_devices(dev, range(2))
    write_slurm_conf(conf, H100_NODE, gres_types="gpu")
    records = slurmd_parse(conf, f"Name=gpu Type=nvidia_h100_80gb_hbm3 File={dev}/nvidia[0-1]\n")
    assert sum(r.count for r in records) == 2


def test_missing_device_fails_before_slurmd(dev: Path, conf: Path) -> None:
    conf.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="nvidia3"):
        write_gres_conf(conf, f"Name=gpu File={dev}/nvidia3\n")
