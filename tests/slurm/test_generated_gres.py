"""Every gres.conf gpuslurm generates, fed to the real ``slurmd -G`` with the generated node line.

What Slurm understood (type, device files, cores, links, counts) must be what we meant. The device
files are real character devices under a temporary root, made by the harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.slurm_harness import make_devices, slurmd_parse, write_slurm_conf

from gpuslurm.errors import CommandError
from gpuslurm.gres.records import GresOptions, GresPlan, plan_gres
from gpuslurm.gres.render import render_node_conf, render_plan
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import load_node
from gpuslurm.topo.cores import format_ranges

pytestmark = pytest.mark.slurm


def _node_line(node: Node, opts: GresOptions) -> str:
    text = render_node_conf(node, "testnode", opts)
    return next(ln for ln in text.splitlines() if ln.startswith("NodeName="))


def _setup(tmp_path: Path, node: Node, opts: GresOptions, gres_types: str) -> tuple[GresPlan, str, Path]:
    dev = tmp_path / "dev"
    minors = {g.minor for g in node.gpus}
    caps = {m for g in node.gpus for mig in g.mig_devices for m in (mig.gi_minor, mig.ci_minor)
            if m is not None}
    make_devices(dev, minors, caps)
    conf_dir = tmp_path / "etc"
    plan = plan_gres(node, opts)
    write_slurm_conf(conf_dir, _node_line(node, opts), gres_types)
    return plan, render_plan(node, plan, opts), conf_dir


CASES = [
    ("dgx-h100", GresOptions(), "gpu"),
    ("dgx-h100", GresOptions(mps=100, shard=4), "gpu,mps,shard"),
    ("dgx-h100", GresOptions(links=False, node_name="testnode"), "gpu"),
    ("l40s-4x", GresOptions(), "gpu"),
    ("l40s-4x", GresOptions(shard=8, node_name="testnode"), "gpu,shard"),
    # MIG with GresTypes=gpu only: Slurm < 23.02.7 splits MultipleFiles when mps/shard are
    # configured (bug 17482), which the generated file warns about.
    ("a100-mig", GresOptions(), "gpu"),
]


@pytest.mark.parametrize(("bundle", "opts", "gres_types"), CASES,
                         ids=[f"{b}-{t}-{i}" for i, (b, _, t) in enumerate(CASES)])
def test_slurm_understands_what_we_meant(tmp_path: Path, bundle: str, opts: GresOptions,
                                         gres_types: str) -> None:
    node = load_node(bundle)
    opts = GresOptions(node_name=opts.node_name, mps=opts.mps, shard=opts.shard, links=opts.links,
                       dev_root=str(tmp_path))
    plan, gres_text, conf_dir = _setup(tmp_path, node, opts, gres_types)
    records = slurmd_parse(conf_dir, gres_text)  # raises on any error/fatal/WARNING line

    slurm_gpus = [r for r in records if r.name == "gpu"]
    meant = plan.gpu_records
    assert len(slurm_gpus) == len(meant) == sum(1 for r in meant)
    for got, want in zip(slurm_gpus, meant, strict=True):
        assert got.type == want.type
        assert got.files == want.files
        assert got.core_ids == want.cores
        assert got.count == 1
        if want.links is None:
            assert got.links is None
        else:
            assert got.links == want.links_text
    for name in ("mps", "shard"):
        want_shared = [r for r in plan.records if r.name == name]
        got_shared = [r for r in records if r.name == name]
        assert [(r.files, r.count) for r in got_shared] == [(w.files, w.count) for w in want_shared]


def test_cores_copied_from_nvidia_smi_are_rejected_by_slurm(tmp_path: Path) -> None:
    """The harness catches the classic mistake, so the positive test above can fail."""
    node = load_node("dgx-h100")
    opts = GresOptions(dev_root=str(tmp_path))
    plan, gres_text, conf_dir = _setup(tmp_path, node, opts, "gpu")
    os_cpus = format_ranges(plan.gpu_records[4].gpu.cpu_affinity)  # 56-111,168-223
    wrong = gres_text.replace("Cores=56-111", f"Cores={os_cpus}", 1)
    assert wrong != gres_text
    with pytest.raises(CommandError, match="Cores"):
        slurmd_parse(conf_dir, wrong)


def test_real_capture_with_minor_not_index(tmp_path: Path, real_fixtures: Path) -> None:
    """The real dual-A5000 capture (GPU 0 is /dev/nvidia1) with a CPU layout we supply."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text(
        (real_fixtures / "nvidia-smi-q-x" / "dual_a5000-v13.xml").read_text())
    # One socket per GPU: 2 sockets x 8 cores x 2 threads, siblings +16.
    rows = ["# CPU,Core,Socket,Node"] + [f"{c},{c % 16},{(c % 16) // 8},{(c % 16) // 8}" for c in range(32)]
    (bundle / "lscpu.csv").write_text("\n".join(rows) + "\n")
    (bundle / "nvidia-smi-topo.txt").write_text(
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tSYS\t0-7,16-23\t0\t\tN/A\n"
        "GPU1\tSYS\t X \t8-15,24-31\t1\t\tN/A\n")
    node = load_node(str(bundle))
    opts = GresOptions(dev_root=str(tmp_path))
    _plan, gres_text, conf_dir = _setup(tmp_path, node, opts, "gpu")
    records = slurmd_parse(conf_dir, gres_text)
    by_file = {r.files[0]: r.core_ids for r in records if r.name == "gpu"}
    assert by_file == {f"{tmp_path}/dev/nvidia1": tuple(range(0, 8)),
                       f"{tmp_path}/dev/nvidia0": tuple(range(8, 16))}
