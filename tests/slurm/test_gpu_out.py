"""The pure parts of the graceful GPU-out path: the node's Gres= rewrite, counts, the node without a GPU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.gres.records import GresOptions, plan_gres
from gpuslurm.gres.render import gres_summary, render_plan
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.gpu_out import drain_reason, gres_gpu_count, set_node_gres, without_gpus
from gpuslurm.state.out_of_service import OutOfService

NODE = load_node("dgx-h100")
CONF = ("# cluster\nNodeName=vm NodeAddr=127.0.0.1 CPUs=224 Gres=gpu:nvidia_h100_80gb_hbm3:8,nic:2\r\n"
        "NodeName=gpu[01-04] Gres=gpu:a100:4\nPartitionName=all Nodes=ALL\n")


def test_gres_rewrite_keeps_everything_else() -> None:
    out = set_node_gres(CONF, "vm", "gpu:nvidia_h100_80gb_hbm3:7", "slurm.conf")
    assert out == CONF.replace("hbm3:8,nic:2", "hbm3:7,nic:2")
    assert set_node_gres(out, "vm", "gpu:nvidia_h100_80gb_hbm3:8,mps:800", "x").count("mps:800") == 1


@pytest.mark.parametrize("name", ["gpu01", "nope"])
def test_a_node_in_a_range_or_missing_is_bad_input(name: str) -> None:
    with pytest.raises(InputError) as err:
        set_node_gres(CONF, name, "gpu:1", "slurm.conf")
    assert err.value.exit_code == 2 and "slurm.conf" in str(err.value)


def test_counts_and_the_node_without_gpu_3() -> None:
    assert gres_gpu_count("gpu:nvidia_h100_80gb_hbm3:7(S:0-1)") == 7
    assert gres_gpu_count("gpu:a:2,gpu:b:3,mps:500") == 5
    assert gres_gpu_count("(null)") is None
    kept = without_gpus(NODE, {NODE.gpus[3].uuid})
    assert [g.index for g in kept.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert kept.links is not None and len(kept.links) == 7 and all(len(r) == 7 for r in kept.links)
    opts = GresOptions(node_name="vm")
    text = render_plan(kept, plan_gres(kept, opts), opts, None)
    lines = [line for line in text.splitlines() if " Name=gpu " in line]
    assert len(lines) == 7 and not any("File=/dev/nvidia3 " in line for line in lines)
    assert all(line.split("Links=")[1].count(",") == 6 for line in lines)
    assert gres_summary(plan_gres(kept, opts)) == "gpu:nvidia_h100_80gb_hbm3:7"


def test_drain_reason_names_the_gpu() -> None:
    g = NODE.gpus[3]
    rec = OutOfService(g.uuid, "Xid 79 (GPU has fallen off the bus; needs reboot)", 1.0, "monitor", 3, 3)
    assert drain_reason(NODE, {g.uuid: rec}) == (
        f"gpuslurm: GPU out: index 3 (/dev/nvidia3, {g.uuid}): Xid 79 (GPU has fallen off the bus; "
        "needs reboot); resumes with 7 GPUs when its jobs end")


@given(st.text(max_size=300), st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True))
def test_any_conf_text_rewrites_or_is_bad_input(conf: str, name: str) -> None:
    try:
        out = set_node_gres(conf, name, "gpu:t:3", "slurm.conf")
    except InputError as exc:
        assert len(str(exc).splitlines()) == 1
    else:  # only the node's own line changed
        before, after = conf.splitlines(), out.splitlines()
        assert len(before) == len(after)
        changed = [a for b, a in zip(before, after, strict=True) if a != b]
        assert all(a.split()[0].lower() == f"nodename={name}" and "Gres=gpu:t:3" in a for a in changed)
