from __future__ import annotations

import pytest

from gpuslurm.errors import InputError
from gpuslurm.gres.records import GresOptions, plan_gres
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import builtin_names, load_node
from gpuslurm.slurm.hookenv import HookEnv, gres_devices, parse_index_list, resolve_job_gpus


@pytest.fixture(scope="module")
def l40s() -> Node:
    return load_node("l40s-4x")


@pytest.fixture(scope="module")
def dgx() -> Node:
    return load_node("dgx-h100")


@pytest.fixture(scope="module")
def mig() -> Node:
    return load_node("a100-mig")


def env(**kw: str) -> HookEnv:
    return HookEnv.from_environ(kw)


def test_prolog_environment() -> None:
    e = HookEnv.from_environ({
        "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice",
        "SLURM_JOB_GPUS": "0,3", "CUDA_VISIBLE_DEVICES": "0,3", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURMD_NODENAME": "gpu07", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2",
        "PATH": "/usr/bin",
    })
    assert e == HookEnv(job_id="4242", uid=1001, user="alice", job_gpus=(0, 3),
                        cuda_visible_devices=("0", "3"), context="prolog_slurmd", node_name="gpu07",
                        array_job_id="4240", array_task_id="2")
    assert e.require_job() == ("4242", 1001, "alice")


def test_missing_variables_are_none() -> None:
    e = HookEnv.from_environ({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "NoDevFiles"})
    assert e == HookEnv()
    with pytest.raises(InputError) as info:
        e.require_job()
    assert info.value.source == "SLURM_JOB_ID"


def test_require_job_names_the_missing_variable() -> None:
    with pytest.raises(InputError) as info:
        env(SLURM_JOB_ID="7", SLURM_JOB_USER="bob").require_job()
    assert info.value.source == "SLURM_JOB_UID"


@pytest.mark.parametrize(("var", "value"), [
    ("SLURM_JOB_ID", "12/../x"), ("SLURM_JOB_ID", "-1"), ("SLURM_JOB_UID", "root"),
    ("SLURM_JOB_UID", "-5"), ("SLURM_JOB_GPUS", "0,a"), ("SLURM_STEP_GPUS", "1,,2"),
    ("SLURM_JOB_GPUS", "3-1"), ("SLURM_ARRAY_TASK_ID", "1;rm"), ("SLURM_JOB_ID", "١٢"),
    ("SLURM_JOB_UID", "4294967295"), ("SLURM_JOB_UID", "4294967296"), ("SLURM_JOB_UID", "9" * 40),
    ("SLURM_JOB_GPUS", "0-99999999999"), ("SLURM_STEP_GPUS", "0-4095,0-4095"),
    ("SLURM_JOB_GPUS", "9" * 5000),
])
def test_malformed_variable_is_named(var: str, value: str) -> None:
    with pytest.raises(InputError) as info:
        HookEnv.from_environ({var: value})
    assert info.value.source == var
    assert repr(value) in info.value.message


def test_index_lists() -> None:
    assert parse_index_list("3,1", "V") == (3, 1)
    assert parse_index_list("0-3,6", "V") == (0, 1, 2, 3, 6)
    assert parse_index_list(" 2 ", "V") == (2,)
    assert parse_index_list(None, "V") is None


@pytest.mark.parametrize("name", builtin_names())
def test_gres_order_is_the_generated_gres_conf_order(name: str) -> None:
    # The meaning of Slurm's GRES index rests on this: position i among our devices is the
    # i-th Name=gpu line gpuslurm writes into gres.conf.
    node = load_node(name)
    lines = [(r.gpu.uuid, r.mig) for r in plan_gres(node, GresOptions()).gpu_records]
    devices = gres_devices(node)
    assert [(d.gpu.uuid, d.mig) for d in devices] == lines
    assert [d.gres_index for d in devices] == list(range(len(lines)))


def test_indices_follow_bus_order_not_minors(l40s: Node) -> None:
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="0,2", CUDA_VISIBLE_DEVICES="0,2"), l40s)
    assert [d.gpu.bus_id for d in devs] == ["00000000:3D:00.0", "00000000:BC:00.0"]
    assert [d.uuid for d in devs] == ["GPU-b02cb6a6-cbee-5f55-b99a-6a786dc74e39",
                                      "GPU-43d30056-04fe-5837-b709-64899f6f6f88"]
    assert [d.minor for d in devs] == [2, 0]  # minor ≠ index on this machine
    assert [d.device_files for d in devs] == [("/dev/nvidia2",), ("/dev/nvidia0",)]


def test_bus_order_even_if_node_lists_gpus_otherwise(l40s: Node) -> None:
    shuffled = l40s._replace(gpus=tuple(reversed(l40s.gpus)))
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="0"), shuffled)
    assert devs[0].gpu.bus_id == "00000000:3D:00.0"


def test_step_gpus_win_over_job_gpus(dgx: Node) -> None:
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="0,1,2,3", SLURM_STEP_GPUS="2"), dgx)
    assert [d.gres_index for d in devs] == [2]


def test_numeric_cuda_visible_devices_is_not_trusted(dgx: Node) -> None:
    # Inside a job with ConstrainDevices Slurm renumbers CUDA_VISIBLE_DEVICES from 0.
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="5,7", CUDA_VISIBLE_DEVICES="0,1"), dgx)
    assert [d.gpu.bus_id for d in devs] == ["00000000:C3:00.0", "00000000:DF:00.0"]


def test_no_slurm_gpus_means_no_gpus(dgx: Node) -> None:
    assert resolve_job_gpus(env(CUDA_VISIBLE_DEVICES=dgx.gpus[0].uuid), dgx) == ()
    assert resolve_job_gpus(env(), dgx) == ()


def test_out_of_range(dgx: Node) -> None:
    with pytest.raises(InputError) as info:
        resolve_job_gpus(env(SLURM_JOB_GPUS="7,8"), dgx)
    assert info.value.source == "SLURM_JOB_GPUS"
    assert "index 8" in info.value.message and "(0-7)" in info.value.message
    with pytest.raises(InputError) as info:
        resolve_job_gpus(env(SLURM_JOB_GPUS="0", SLURM_STEP_GPUS="9"), dgx)
    assert info.value.source == "SLURM_STEP_GPUS"


def test_repeats_dropped(dgx: Node) -> None:
    assert [d.gres_index for d in resolve_job_gpus(env(SLURM_JOB_GPUS="3,1,3"), dgx)] == [3, 1]


def test_gpu_uuids(dgx: Node) -> None:
    a, b = dgx.gpus[6].uuid, dgx.gpus[1].uuid
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="1,6", CUDA_VISIBLE_DEVICES=f"{a},{b.upper()}"), dgx)
    assert [d.uuid for d in devs] == [a, b]  # Slurm's order, the node's spelling
    assert [d.gres_index for d in devs] == [6, 1]


def test_mig_indices(mig: Node) -> None:
    # a100-mig: GPU at bus 07 in MIG mode with 4 MIG devices (GRES 0-3), GPU at 87 whole (GRES 4)
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="1,4"), mig)
    assert devs[0].mig is not None and devs[0].uuid.startswith("MIG-")
    assert devs[0].minor == 1
    assert devs[0].device_files[0] == "/dev/nvidia1"
    assert devs[0].device_files[1].startswith("/dev/nvidia-caps/nvidia-cap")
    assert devs[1].mig is None and devs[1].gpu.bus_id == "00000000:87:00.0"


def test_mig_uuids(mig: Node) -> None:
    table = gres_devices(mig)
    want = [table[2], table[0]]
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="2,0",
                                CUDA_VISIBLE_DEVICES=",".join(d.uuid for d in want)), mig)
    assert devs == tuple(want)


def test_legacy_mig_name(mig: Node) -> None:
    dev = gres_devices(mig)[3]
    assert dev.mig is not None
    legacy = f"MIG-{dev.gpu.uuid}/{dev.mig.gi_id}/{dev.mig.ci_id}"
    assert resolve_job_gpus(env(SLURM_JOB_GPUS="3", CUDA_VISIBLE_DEVICES=legacy), mig) == (dev,)


def test_mig_without_uuid_gets_legacy_name(mig: Node) -> None:
    parent = next(g for g in mig.gpus if g.mig_mode)
    bare = parent._replace(mig_devices=tuple(m._replace(uuid=None, gi_minor=None)
                                                         for m in parent.mig_devices))
    node = mig._replace(gpus=tuple(bare if g is parent else g for g in mig.gpus))
    dev = resolve_job_gpus(env(SLURM_JOB_GPUS="0"), node)[0]
    assert dev.mig is not None
    assert dev.uuid == f"MIG-{parent.uuid}/{dev.mig.gi_id}/{dev.mig.ci_id}"
    with pytest.raises(ValueError, match="minors"):
        _ = dev.device_files


def test_unknown_uuid(mig: Node) -> None:
    with pytest.raises(InputError) as info:
        resolve_job_gpus(env(SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="MIG-00000000-dead-beef"), mig)
    assert info.value.source == "CUDA_VISIBLE_DEVICES"
    assert "MIG-00000000-dead-beef" in info.value.message


def test_mixed_list_falls_back_to_indices(dgx: Node) -> None:
    devs = resolve_job_gpus(env(SLURM_JOB_GPUS="4", CUDA_VISIBLE_DEVICES=f"0,{dgx.gpus[0].uuid}"), dgx)
    assert [d.gres_index for d in devs] == [4]
