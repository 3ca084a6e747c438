"""gres.conf planning and --check on the built-in bundles (real parsers, real files)."""

from __future__ import annotations

import pytest

from gpuslurm.errors import CaptureError
from gpuslurm.gres.check import check_gres_conf
from gpuslurm.gres.conf_parse import parse_gres_conf
from gpuslurm.gres.records import GresOptions, plan_gres
from gpuslurm.gres.render import gres_summary, render_gres_conf
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.mig_types import mig_naming
from gpuslurm.slurm.version import SlurmVersion


@pytest.fixture(scope="module")
def dgx() -> Node:
    return load_node("dgx-h100")


@pytest.fixture(scope="module")
def l40s() -> Node:
    return load_node("l40s-4x")


@pytest.fixture(scope="module")
def a100() -> Node:
    return load_node("a100-mig")


def test_dgx_cores_per_socket_and_nvswitch_links(dgx: Node) -> None:
    plan = plan_gres(dgx, GresOptions())
    gpus = plan.gpu_records
    assert [r.file for r in gpus] == [f"/dev/nvidia{i}" for i in range(8)]
    assert {r.cores_text for r in gpus[:4]} == {"0-55"}
    assert {r.cores_text for r in gpus[4:]} == {"56-111"}
    assert gpus[0].links == (-1, 18, 18, 18, 18, 18, 18, 18)
    assert gpus[7].links == (18,) * 7 + (-1,)
    assert any("NVSwitch" in n for n in plan.notes)


def test_l40s_file_by_minor_and_interleaved_cores(l40s: Node) -> None:
    gpus = plan_gres(l40s, GresOptions()).gpu_records
    # PCI bus order; minors are not the index on this box.
    assert [(r.gpu.index, r.file) for r in gpus] == [
        (g.index, f"/dev/nvidia{g.minor}") for g in sorted(l40s.gpus, key=lambda g: g.bus_id)]
    assert any(r.gpu.index != r.gpu.minor for r in gpus)
    assert [r.cores_text for r in gpus] == ["0-31", "0-31", "32-63", "32-63"]
    # No NVLink: only -1 and 0.
    assert all(set(r.links or ()) <= {-1, 0} for r in gpus)


def test_a100_mig_records_use_caps_and_no_links(a100: Node) -> None:
    plan = plan_gres(a100, GresOptions())
    migs = [r for r in plan.gpu_records if r.mig is not None]
    assert len(migs) == 4
    parent = migs[0].gpu
    for r in migs:
        assert r.mig is not None
        assert r.files[0] == f"/dev/nvidia{parent.minor}"
        assert r.files[1] == f"/dev/nvidia-caps/nvidia-cap{r.mig.gi_minor}"
        assert r.files[2] == f"/dev/nvidia-caps/nvidia-cap{r.mig.ci_minor}"
        assert r.type is not None and r.type.startswith("nvidia_a100_")
        assert r.links is None
    assert {r.type for r in migs} == {"nvidia_a100_3g.39gb", "nvidia_a100_2g.20gb", "nvidia_a100_1g.10gb"}
    assert gres_summary(plan).count("gpu:") == 4


def test_mps_and_shard_lines_skip_mig_gpus(a100: Node, dgx: Node) -> None:
    plan = plan_gres(dgx, GresOptions(mps=100, shard=4))
    assert sum(1 for r in plan.records if r.name == "mps") == 8
    assert gres_summary(plan).endswith("mps:800,shard:32")
    plan = plan_gres(a100, GresOptions(mps=100))
    mps = [r for r in plan.records if r.name == "mps"]
    assert len(mps) == 1 and not mps[0].gpu.mig_mode


def test_node_name_prefix_and_dev_root(dgx: Node) -> None:
    text = render_gres_conf(dgx, GresOptions(node_name="dgx01", dev_root="/tmp/x/"))
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(ln.startswith("NodeName=dgx01 ") for ln in lines)
    assert "File=/tmp/x/dev/nvidia0 " in text


def test_missing_facts_name_the_file(dgx: Node) -> None:
    no_cpus = dgx._replace(cpus=())
    with pytest.raises(CaptureError, match=r"lscpu\.csv"):
        plan_gres(no_cpus, GresOptions())
    no_affinity = dgx._replace(gpus=tuple(g._replace(cpu_affinity=())
                                                     for g in dgx.gpus))
    with pytest.raises(CaptureError, match=r"nvidia-smi-topo\.txt"):
        plan_gres(no_affinity, GresOptions())


def test_check_accepts_what_we_generate(l40s: Node, a100: Node) -> None:
    for node in (l40s, a100):
        opts = GresOptions(node_name="n1")
        text = render_gres_conf(node, opts)
        assert check_gres_conf(plan_gres(node, opts), parse_gres_conf(text, "g", "n1")) == []


def test_check_names_each_kind_of_mistake(l40s: Node) -> None:
    plan = plan_gres(l40s, GresOptions())
    by_index = sorted(l40s.gpus, key=lambda g: g.index)
    g0 = by_index[0]
    os_cpus = ",".join(str(c) for c in g0.cpu_affinity)
    existing = "\n".join([
        # File numbered by index (minor != index), Cores right for GPU index 0
        f"Name=gpu Type=nvidia_l40s File=/dev/nvidia{g0.index} Cores=0-31",
        # OS CPU ids pasted from nvidia-smi
        f"Name=gpu Type=nvidia_l40s File=/dev/nvidia{g0.minor} Cores={os_cpus}",
        # a type AutoDetect would not match
        f"Name=gpu Type=L40S File=/dev/nvidia{by_index[2].minor} Cores=32-63",
        # a GPU this node does not have
        "Name=gpu Type=nvidia_l40s File=/dev/nvidia9 Cores=32-63",
    ]) + "\n"
    problems = check_gres_conf(plan, parse_gres_conf(existing, "gres.conf"))
    kinds = sorted((p.kind, p.line) for p in problems)
    assert ("file", 1) in kinds
    assert ("cores", 2) in kinds
    assert ("type", 3) in kinds
    assert ("extra", 4) in kinds
    assert ("missing", None) in kinds  # by_index[3]'s device has no line
    os_hint = next(p for p in problems if p.line == 2)
    assert "OS CPU ids" in os_hint.message
    assert "numbered by GPU index" in next(p for p in problems if p.line == 1).message


def test_check_type_substring_rule(dgx: Node) -> None:
    plan = plan_gres(dgx, GresOptions(links=False))
    lines = "\n".join(f"Name=gpu Type=h100 File=/dev/nvidia{i} Cores={'0-55' if i < 4 else '56-111'}"
                      for i in range(8))
    assert check_gres_conf(plan, parse_gres_conf(lines, "g")) == []


def test_template_cache_refuses_a_planted_directory(tmp_path, monkeypatch, dgx: Node) -> None:  # type: ignore[no-untyped-def]
    """Root must not use a cache directory someone else prepared (here: a symlink)."""
    import os
    import tempfile

    from gpuslurm.gres import render

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"_jinja2-cache-{os.getuid()}").symlink_to(elsewhere)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert render._bytecode_cache() is None
    text = render_gres_conf(dgx, GresOptions())
    assert "File=/dev/nvidia7" in text
    assert list(elsewhere.iterdir()) == []


def test_numa_cores_on_a_release_without_the_socket_check(a100: Node) -> None:
    """22.05 takes a GPU's NUMA cores (a100-mig: 16 of a socket's 64), the closest affinity."""
    plan = plan_gres(a100, GresOptions(mig=mig_naming(SlurmVersion(22, 5, 8), "test")))
    assert {r.cores_text for r in plan.gpu_records} == {"48-63", "112-127"}
    assert not any("whole sockets" in n for n in plan.notes)
    assert not any("--slurm-version" in n for n in plan.notes)


def test_unknown_release_keeps_numa_cores_and_says_why(a100: Node, dgx: Node) -> None:
    plan = plan_gres(a100, GresOptions())  # no slurmd, no --slurm-version
    assert {r.cores_text for r in plan.gpu_records} == {"48-63", "112-127"}
    assert any("INVAL" in n and "--slurm-version" in n for n in plan.notes)
    assert not any("--slurm-version" in n for n in plan_gres(dgx, GresOptions()).notes)  # whole sockets


@pytest.mark.parametrize("release", [SlurmVersion(24, 11, 5), SlurmVersion(26, 5, 5)])
def test_cores_are_whole_sockets_where_slurm_checks_them(a100: Node, release: SlurmVersion) -> None:
    """24.11 and later set the node INVAL on Cores=48-63 ("doesn't match socket boundaries")."""
    opts = GresOptions(node_name="n1", mig=mig_naming(release, "test"))
    plan = plan_gres(a100, opts)
    assert {r.cores_text for r in plan.gpu_records} == {"0-63", "64-127"}
    assert all(plan.core_map.is_whole_sockets(r.cores or ()) for r in plan.gpu_records)
    text = render_gres_conf(a100, opts)
    assert "# Note: Cores= widened to whole sockets" in text and "48-63 -> 0-63" in text
    assert check_gres_conf(plan, parse_gres_conf(text, "g", "n1")) == []


def test_check_flags_numa_cores_as_the_reason_for_inval(a100: Node) -> None:
    old = render_gres_conf(a100, GresOptions(node_name="n1", mig=mig_naming(SlurmVersion(26, 5, 5), "t")))
    numa = old.replace("Cores=0-63", "Cores=48-63").replace("Cores=64-127", "Cores=112-127")
    plan = plan_gres(a100, GresOptions(node_name="n1", mig=mig_naming(SlurmVersion(26, 5, 5), "t")))
    problems = check_gres_conf(plan, parse_gres_conf(numa, "g", "n1"))
    assert problems and all(p.kind == "cores" for p in problems)
    assert len(problems) == len(plan.gpu_records)  # one finding per line
    assert "not whole sockets (socket 0 is cores 0-63)" in problems[0].message
    assert "INVAL" in problems[0].message and "Cores=0-63" in problems[0].message
    # the same file is right for 22.05
    plan22 = plan_gres(a100, GresOptions(node_name="n1", mig=mig_naming(SlurmVersion(26, 5, 5), "t")
                                         ._replace(whole_sockets=False)))
    assert check_gres_conf(plan22, parse_gres_conf(numa, "g", "n1")) == []


def test_check_names_the_hardware_cores_when_a_split_range_is_on_the_wrong_socket(a100: Node) -> None:
    """A line whose NUMA range is another socket's: widening the file's own range would advise the
    wrong socket (Cores=0-63 for a GPU on socket 1); the finding names the hardware's cores."""
    opts = GresOptions(node_name="n1", mig=mig_naming(SlurmVersion(26, 5, 5), "t"))
    wrong = render_gres_conf(a100, opts).replace("Cores=64-127", "Cores=48-63")
    plan = plan_gres(a100, opts)
    problems = check_gres_conf(plan, parse_gres_conf(wrong, "g", "n1"))
    assert len(problems) == 1 and problems[0].kind == "cores"
    assert "Cores=64-127" in problems[0].message and "Cores=0-63" not in problems[0].message


@pytest.mark.parametrize("release", [SlurmVersion(23, 2, 7), SlurmVersion(23, 11, 10),
                                     SlurmVersion(24, 5, 8)])
def test_a_release_between_the_tried_ones_keeps_numa_cores_and_says_what_to_do(
        a100: Node, release: SlurmVersion) -> None:
    """23.02-24.05 were not tried: NUMA Cores= as 22.05 takes them, with a note on the INVAL a
    24.11-like check would cause and the option that widens them (the review: no word before)."""
    plan = plan_gres(a100, GresOptions(mig=mig_naming(release, "test")))
    assert {r.cores_text for r in plan.gpu_records} == {"48-63", "112-127"}
    assert any("not tried" in n and "--slurm-version 24.11" in n for n in plan.notes)
    assert not any("not tried" in n for n in plan_gres(a100, GresOptions(
        mig=mig_naming(SlurmVersion(22, 5, 8), "test"))).notes)
