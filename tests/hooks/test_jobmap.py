from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest

from gpuslurm.errors import InputError
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus
from gpuslurm.state import jobmap
from gpuslurm.state.jobmap import (
    JobMap,
    MappedDevice,
    UnsafePathError,
    check_job_id,
    job_map,
    list_job_ids,
    list_maps,
    read_map,
    remove_map,
    write_map,
)


def sample(job_id: str = "1234", start: float = 1_700_000_000.5) -> JobMap:
    devices = (MappedDevice("GPU-aaaa", 2, 0, None, ("/dev/nvidia2",)),
               MappedDevice("GPU-bbbb", 0, 2, None, ("/dev/nvidia0",)))
    return JobMap(job_id, "alice", 1001, devices, start)


def mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_round_trip_and_permissions(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "run" / "gpuslurm" / "jobs"
    path = write_map(sample(), str(base))
    assert path == str(base / "1234.json")
    assert mode(base) == 0o700
    assert mode(base.parent) == 0o755  # others' per-job directories live beside jobs/
    assert mode(base / "1234.json") == 0o600
    got = read_map("1234", str(base))
    assert got == sample()
    assert got is not None and got.uuids == ("GPU-aaaa", "GPU-bbbb") and got.minors == (2, 0)
    doc = json.loads((base / "1234.json").read_text())
    assert doc["version"] == 1 and doc["uid"] == 1001 and doc["gpus"][0]["minor"] == 2
    assert sorted(os.listdir(base)) == ["1234.json"]  # no temporary file left behind


def test_list_and_remove(tmp_path: pathlib.Path) -> None:
    base = str(tmp_path / "jobs")
    for job in ("10", "9", "9_2", "9_10", "100"):
        write_map(sample(job), base)
    (tmp_path / "jobs" / "notes.txt").write_text("x")
    (tmp_path / "jobs" / ".10.json.99.tmp").write_text("x")
    assert list_job_ids(base) == ("9", "9_2", "9_10", "10", "100")
    assert [m.job_id for m in list_maps(base)] == ["9", "9_2", "9_10", "10", "100"]
    assert remove_map("9_2", base) is True
    assert remove_map("9_2", base) is False
    assert read_map("9_2", base) is None
    assert list_job_ids(base) == ("9", "9_10", "10", "100")


def test_absent_directory_is_not_created_by_readers(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "nothing" / "jobs"
    assert read_map("1", str(base)) is None
    assert remove_map("1", str(base)) is False
    assert list_job_ids(str(base)) == ()
    assert list_maps(str(base)) == ()
    assert not (tmp_path / "nothing").exists()


def test_rewrite_replaces(tmp_path: pathlib.Path) -> None:
    base = str(tmp_path / "jobs")
    write_map(sample(start=1.0), base)
    write_map(sample(start=2.0), base)
    got = read_map("1234", base)
    assert got is not None and got.start == 2.0


def test_failed_write_keeps_old_map_and_leaves_no_temp(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "jobs"
    write_map(sample(start=1.0), str(base))

    def broken_replace(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobmap.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_map(sample(start=2.0), str(base))
    monkeypatch.undo()
    assert os.listdir(base) == ["1234.json"]
    got = read_map("1234", str(base))
    assert got is not None and got.start == 1.0


def test_existing_readable_dir_is_narrowed(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    write_map(sample(), str(base))
    assert mode(base) == 0o700


def test_symlinked_dir_refused(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "jobs"
    link.symlink_to(real)
    with pytest.raises(UnsafePathError) as info:
        write_map(sample(), str(link))
    assert info.value.source == str(link)
    assert "symlink" in info.value.message
    assert os.listdir(real) == []
    with pytest.raises(UnsafePathError):
        read_map("1234", str(link))


def test_symlinked_ancestor_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError) as info:
        write_map(sample(), str(tmp_path / "run" / "jobs"))
    assert info.value.source == str(tmp_path / "run")
    assert not (tmp_path / "real" / "jobs").exists()


def test_group_writable_dir_refused(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    base.mkdir()
    os.chmod(base, 0o770)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        write_map(sample(), str(base))
    assert os.listdir(base) == []


def test_world_writable_ancestor_refused_unless_sticky(tmp_path: pathlib.Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(UnsafePathError) as info:
        write_map(sample(), str(parent / "jobs"))
    assert info.value.source == str(parent)
    assert not (parent / "jobs").exists()
    os.chmod(parent, 0o1777)  # like /tmp: others cannot rename or remove our entries
    write_map(sample(), str(parent / "jobs"))
    assert read_map("1234", str(parent / "jobs")) == sample()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_dir_owned_by_someone_else_refused(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    base.mkdir(mode=0o700)
    os.chown(base, 4321, 4321)
    with pytest.raises(UnsafePathError, match="owned by uid 4321"):
        write_map(sample(), str(base))


def test_planted_symlink_at_final_path(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample("1"), str(base))  # creates the directory
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (base / "1234.json").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symlink") as info:
        write_map(sample(), str(base))
    assert info.value.source == str(base / "1234.json")
    assert victim.read_text() == "precious\n"
    assert (base / "1234.json").is_symlink()
    assert sorted(os.listdir(base)) == ["1.json", "1234.json"]  # temp file not created
    with pytest.raises(UnsafePathError, match="symlink"):
        read_map("1234", str(base))
    with pytest.raises(UnsafePathError):
        list_maps(str(base))
    assert remove_map("1234", str(base)) is True  # unlinking removes the link, not the victim
    assert victim.read_text() == "precious\n"


def test_planted_symlink_at_temp_path(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample("1"), str(base))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    tmp = base / f".1234.json.{os.getpid()}.tmp"
    tmp.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symlink is already at the temporary name"):
        write_map(sample(), str(base))
    assert victim.read_text() == "precious\n"
    assert not (base / "1234.json").exists()
    dangling = base / f".77.json.{os.getpid()}.tmp"
    dangling.symlink_to(tmp_path / "not-there")
    with pytest.raises(UnsafePathError):
        write_map(sample("77"), str(base))
    assert not (tmp_path / "not-there").exists()


def test_stale_temp_file_of_ours_is_replaced(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample("1"), str(base))
    stale = base / f".1234.json.{os.getpid()}.tmp"
    stale.write_text("half a map")
    write_map(sample(), str(base))
    assert read_map("1234", str(base)) == sample()
    assert not stale.exists()


def test_fifo_at_final_path_refused(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample("1"), str(base))
    os.mkfifo(base / "1234.json", 0o600)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        write_map(sample(), str(base))
    with pytest.raises(UnsafePathError, match="not a regular file"):  # and reading does not hang
        read_map("1234", str(base))


def test_map_writable_by_others_refused(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample(), str(base))
    os.chmod(base / "1234.json", 0o666)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        read_map("1234", str(base))


@pytest.mark.parametrize("bad", ["", "../1234", "1/2", "12a", "1_", "_1", "1_2_3", " 1", "1.",
                                 "١٢", "12345678901", "-1"])
def test_bad_job_ids(tmp_path: pathlib.Path, bad: str) -> None:
    with pytest.raises(InputError, match="not a Slurm job id"):
        check_job_id(bad)
    for call in (lambda: read_map(bad, str(tmp_path)), lambda: remove_map(bad, str(tmp_path)),
                 lambda: write_map(sample(bad), str(tmp_path / "jobs"))):
        with pytest.raises(InputError, match="not a Slurm job id"):
            call()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"job_id": "1234", "user": "a", "uid": "1001", "start": 1, "gpus": []}', "'uid'"),
    ('{"job_id": "1234", "user": "a", "uid": 1, "start": 1, "gpus": [{"uuid": "GPU-x"}]}', "'minor'"),
    ('{"job_id": "99", "user": "a", "uid": 1, "start": 1, "gpus": []}', "names job 99"),
    ('{"job_id": "../x", "user": "a", "uid": 1, "start": 1, "gpus": []}', "not a Slurm job id"),
])
def test_corrupt_maps(tmp_path: pathlib.Path, content: str, message: str) -> None:
    base = tmp_path / "jobs"
    write_map(sample(), str(base))
    (base / "1234.json").write_text(content)
    with pytest.raises(InputError, match=message):
        read_map("1234", str(base))


def test_unknown_keys_are_ignored(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "jobs"
    write_map(sample(), str(base))
    doc = json.loads((base / "1234.json").read_text())
    doc["mps"] = {"pipe": "/run/gpuslurm/mps/1234"}
    doc["gpus"][0]["future"] = 1
    (base / "1234.json").write_text(json.dumps(doc))
    assert read_map("1234", str(base)) == sample()


def test_job_map_from_resolved_mig_devices(tmp_path: pathlib.Path) -> None:
    node = load_node("a100-mig")
    env = HookEnv.from_environ({"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "1001",
                                "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "1,4"})
    job_id, uid, user = env.require_job()
    m = job_map(job_id, user, uid, resolve_job_gpus(env, node), start=5.0)
    mig_dev, whole = m.devices
    assert mig_dev.uuid.startswith("MIG-") and mig_dev.parent_uuid is not None
    assert mig_dev.parent_uuid.startswith("GPU-")
    assert mig_dev.minor == 1 and mig_dev.gres_index == 1
    assert len(mig_dev.device_files) == 3 and mig_dev.device_files[0] == "/dev/nvidia1"
    assert whole.parent_uuid is None and whole.device_files == ("/dev/nvidia0",) and whole.gres_index == 4
    write_map(m, str(tmp_path / "jobs"))
    assert read_map("77", str(tmp_path / "jobs")) == m
