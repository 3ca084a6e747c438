"""gpuslurm pbs-conf: one PBS vnode per NUMA node with its CPUs, memory and GPUs."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuslurm.cli.main import cli
from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import load_node


def test_dgx_h100_has_two_numa_vnodes_with_four_gpus_each() -> None:
    node = load_node("dgx-h100")
    vnodes = plan_vnodes(node)
    assert [v.numa_node for v in vnodes] == [0, 1]
    assert [len(v.gpu_minors) for v in vnodes] == [4, 4]
    assert sum(len(v.cpus) for v in vnodes) == len(node.cpus)
    assert not set(vnodes[0].cpus) & set(vnodes[1].cpus)


def test_cli_prints_a_vnode_definition_file() -> None:
    result = CliRunner().invoke(cli, ["pbs-conf", "--from", "dgx-h100", "--node-name", "pbshost"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "$configversion 2"
    assert "pbshost: resources_available.ngpus = 0" in lines
    assert "pbshost[1]: resources_available.ngpus = 4" in lines


def test_mig_instances_are_nmigs_and_a_node_without_any_says_no_nmigs() -> None:
    """a100-mig: the MIG-mode GPU's 4 instances are nmigs of its NUMA vnode (3), not ngpus; the
    whole GPU is ngpus of its own (7). A node without MIG instances writes no nmigs line, so a
    server that never made the resource reads its file unchanged."""
    node = load_node("a100-mig")
    vnodes = {v.numa_node: v for v in plan_vnodes(node)}
    assert (len(vnodes[3].gpu_minors), vnodes[3].nmigs) == (0, 4)
    assert (len(vnodes[7].gpu_minors), vnodes[7].nmigs) == (1, 0)
    result = CliRunner().invoke(cli, ["pbs-conf", "--from", "a100-mig", "--node-name", "pbshost"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "pbshost: resources_available.nmigs = 0" in lines
    assert "pbshost[3]: resources_available.nmigs = 4" in lines
    assert "pbshost[3]: resources_available.ngpus = 0" in lines
    assert "pbshost[7]: resources_available.ngpus = 1" in lines
    plain = CliRunner().invoke(cli, ["pbs-conf", "--from", "dgx-h100", "--node-name", "pbshost"])
    assert "nmigs" not in plain.output


def test_a_capture_without_meminfo_gives_no_mem_lines_and_a_note(real_fixtures: Path, tmp_path: Path) -> None:
    """The real H200 capture has no meminfo: `mem = 0mb` on every vnode made any `mem=` request
    unrunnable; as node-conf leaves RealMemory out, pbs-conf leaves mem out (pbs_mom's own figure
    stays on the natural vnode) and says so on stderr (the file has no comment syntax)."""
    from gpuslurm.hw.replay.importer import import_multi_capture

    bundle = tmp_path / "h200"
    import_multi_capture(real_fixtures / "multi" / "h200-mig__590.48.01.txt", bundle)
    (bundle / "lscpu.csv").write_text("# CPU,Core,Socket,Node\n"
                                      + "".join(f"{c},{c},0,0\n" for c in range(24)))
    assert [v.memory_mib for v in plan_vnodes(load_node(str(bundle)))] == [None]
    result = CliRunner().invoke(cli, ["pbs-conf", "--from", str(bundle), "--node-name", "pbshost"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "$configversion 2", "pbshost: resources_available.ncpus = 0",
        "pbshost: resources_available.ngpus = 0",
        "pbshost: resources_available.nmigs = 0", "pbshost[0]: resources_available.ncpus = 24",
        "pbshost[0]: resources_available.ngpus = 0", "pbshost[0]: resources_available.nmigs = 5",
        "pbshost[0]: sharing = default_shared"]
    assert result.stderr == ("gpuslurm pbs-conf: mem left out: the capture has no meminfo (pbs_mom's own "
                             "figure stays on the natural vnode)\n")
    with_mem = CliRunner().invoke(cli, ["pbs-conf", "--from", "dgx-h100", "--node-name", "pbshost"])
    assert "pbshost: resources_available.mem = 0kb" in with_mem.stdout and with_mem.stderr == ""
    assert "pbshost[1]: resources_available.mem = " in with_mem.stdout
