"""The pure parts of holding a GPU out of service in Slurm: reasons, the node Comment, holder names.

The mechanism itself (holder jobs) runs against the real cluster in tests/cluster/test_gpu_out_e2e.py.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.gpu_out import COMMENT_PREFIX, comment
from gpuslurm.state.out_of_service import OutOfService, gpu_out_reason, holder_name

NODE = load_node("dgx-h100")


def test_drain_reason_names_the_gpu() -> None:
    g = NODE.gpus[3]
    rec = OutOfService(g.uuid, "Xid 79 (GPU has fallen off the bus; needs reboot)", 1.0, "monitor", 3, 3)
    assert gpu_out_reason(8, {g.uuid: rec}) == (
        f"gpuslurm: GPU out: index 3 (/dev/nvidia3, {g.uuid}): Xid 79 (GPU has fallen off the bus; "
        "needs reboot); resumes with 7 GPUs when its jobs end")
    assert gpu_out_reason(1, {g.uuid: rec}).endswith("no GPU left in service")


def test_comment_and_holder_name() -> None:
    g = NODE.gpus[3]
    text = comment({g.uuid: OutOfService(g.uuid, "RMA 4711", 1.0, "admin", 3, 3)})
    assert text == f"{COMMENT_PREFIX} GPU index 3 ({g.uuid}) RMA 4711"
    assert comment({}) == ""
    assert holder_name("gpu07") == "gpuslurm-gpu-out-gpu07"


@given(st.text(max_size=400))
def test_any_reason_makes_one_bounded_line(reason: str) -> None:
    g = NODE.gpus[0]
    rec = OutOfService(g.uuid, reason, 1.0, "admin", 0, 0)
    for text in (gpu_out_reason(8, {g.uuid: rec}), comment({g.uuid: rec})):
        assert len(text.splitlines()) <= 1 and len(text) <= 1000 and text.isprintable()
