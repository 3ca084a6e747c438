"""Who sees which job's figures: the monitor (root) leaves each job's ``jobstats`` figures for its
owner alone, and an ordinary user (the real user ``nobody``, real processes) reads their own job's
through ``gpuslurm jobstats``'s use case without reading the root-only store, and nobody else's.

The attacks, as ``nobody``: read the store; read another user's job (by id, and its file by path);
make their own file writable, grow, truncate or renew it (root's partition filled between two
rewrites, retention dodged); rewrite a file an older monitor gave them to claim another job or uid,
or with garbage; plant a file in the directory; where an admin once left it writable, plant
symlinks, a FIFO and a directory at the names the monitor's retention removes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.cluster_fixture import users_site
from tests.helpers.jobstats_helpers import JOBSTATS_AS_USER

from gpuslurm.errors import EXIT_BAD_INPUT
from gpuslurm.jobid import valid_job_id
from gpuslurm.report.jobstats import Settings
from gpuslurm.safedir import ACL_XATTR, acl_entries
from gpuslurm.samples import Allocation, Cycle, GpuSample
from gpuslurm.state.store import Store
from gpuslurm.watch.jobfiles import JobFiles, job_of

NOBODY = 65534
OTHER = 1002
T0 = 1_700_000_000.0
G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays root and nobody; the store is root's")

def alloc(job: str, uid: int, gpu: str) -> Allocation:
    return Allocation(job, "nobody" if uid == NOBODY else "bob", uid, (gpu,), T0)


def cycle(ts: float, *allocations: Allocation) -> Cycle:
    gpus = (GpuSample(ts, G0, util_pct=0.0, mem_used_mib=500.0, mem_total_mib=81559.0, power_w=70.0),
            GpuSample(ts, G1, util_pct=90.0, mem_used_mib=9000.0, mem_total_mib=81559.0, power_w=400.0))
    return Cycle(ts, "n1", gpus, (), allocations)


@pytest.fixture
def site() -> Iterator[Path]:
    with users_site("gpuslurm-jobfiles-") as base:
        state = base / "state"
        state.mkdir(mode=0o755)
        config = base / "gpuslurm.toml"
        config.write_text(f'[paths]\nstate_dir = "{state}"\n')
        config.chmod(0o644)
        store = Store.open(str(state / "monitor.db"))
        files = JobFiles(str(state / "jobstats"), store, Settings(), interval_s=60)
        both = (alloc("7", NOBODY, G0), alloc("8", OTHER, G1))
        for i in range(11):
            c = cycle(T0 + 10 * i, *both)
            store.write_cycle(c)
            files(c)
        end = cycle(T0 + 110)  # both jobs ended: their last files are written
        store.write_cycle(end)
        files(end)
        store.close()
        yield base


def as_nobody(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(base / "users-venv" / "bin" / "python"), *args], user=NOBODY, group=NOBODY,
                          extra_groups=[], timeout=60, cwd="/", capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(base / "gpuslurm.toml")})


def jobstats(base: Path, job: str) -> subprocess.CompletedProcess[str]:
    return as_nobody(base, "-c", JOBSTATS_AS_USER, job)


def test_each_job_s_file_is_its_owner_s_alone_in_a_directory_root_alone_writes(site: Path) -> None:
    d = site / "state" / "jobstats"
    st = d.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    for job, uid in (("7", NOBODY), ("8", OTHER)):
        f = (d / f"{job}.json").stat()
        # root's file; the job's uid, and no one else, reads it through the ACL (its mask: 0440)
        assert (f.st_uid, f.st_gid, stat.S_IMODE(f.st_mode)) == (0, 0, 0o440)
        acl = acl_entries(os.getxattr(d / f"{job}.json", ACL_XATTR))
        readers = [(tag, perm, who) for tag, perm, who in acl if perm]
        assert readers == [(0x01, 4, 0xFFFFFFFF), (0x02, 4, uid), (0x10, 4, 0xFFFFFFFF)]
        assert json.loads((d / f"{job}.json").read_text())["job"]["running"] is False
    assert stat.S_IMODE((site / "state" / "monitor.db").stat().st_mode) == 0o600


def test_nobody_reads_their_own_job_without_the_store(site: Path) -> None:
    store = as_nobody(site, "-c", f"open({str(site / 'state' / 'monitor.db')!r}).read()")
    assert store.returncode != 0 and "PermissionError" in store.stderr
    mine = jobstats(site, "7")
    assert mine.returncode == 0, mine.stderr
    doc = json.loads(mine.stdout)
    assert (doc["job"]["id"], doc["job"]["uid"], doc["verdict"]) == ("7", NOBODY, "idle GPUs")
    assert [g["uuid"] for g in doc["gpus"]] == [G0]


def test_nobody_cannot_see_another_user_s_job(site: Path) -> None:
    theirs = jobstats(site, "8")
    never = jobstats(site, "9")
    assert theirs.returncode == never.returncode == EXIT_BAD_INPUT
    assert theirs.stderr == "job 8: not in this node's monitor store, or not yours\n"
    assert never.stderr.replace("9", "8") == theirs.stderr  # nothing tells the two apart
    path = site / "state" / "jobstats" / "8.json"
    direct = as_nobody(site, "-c", f"open({str(path)!r}).read()")
    assert direct.returncode != 0 and "PermissionError" in direct.stderr
    planted = as_nobody(site, "-c", f"open({str(path.parent / 'x.json')!r}, 'w')")
    assert planted.returncode != 0 and "PermissionError" in planted.stderr


def test_nobody_cannot_widen_grow_truncate_or_renew_their_own_job_s_file(site: Path) -> None:
    path = site / "state" / "jobstats" / "7.json"
    before = path.read_bytes(), path.stat()
    tries = {"chmod": "os.chmod(p, 0o600)", "append": "open(p, 'ab').write(b'x' * 4096)",
             "truncate": "os.truncate(p, 0)", "rewrite": "open(p, 'r+b').write(b'x')",
             "utime": "os.utime(p, (2**31, 2**31))", "chown": "os.chown(p, 65534, -1)",
             "setfacl": "os.setxattr(p, 'system.posix_acl_access', b'')"}
    for what, code in tries.items():
        done = as_nobody(site, "-c", f"import os; p = {str(path)!r}\n{code}")
        assert done.returncode != 0 and "PermissionError" in done.stderr, (what, done.stderr)
    after = path.read_bytes(), path.stat()
    assert after[0] == before[0] and after[1].st_mtime_ns == before[1].st_mtime_ns
    assert (after[1].st_uid, stat.S_IMODE(after[1].st_mode)) == (0, 0o440)
    assert jobstats(site, "7").returncode == 0


def test_a_file_an_older_monitor_gave_its_owner_still_reads_and_a_rewrite_is_bad_input(site: Path) -> None:
    # before the ACL, the monitor chowned each file to the job's uid; those files stay readable, and
    # what their owner makes of them is bad input until root's next write takes the name back
    path = site / "state" / "jobstats" / "7.json"
    os.chown(path, NOBODY, -1)
    os.removexattr(path, ACL_XATTR)
    os.chmod(path, 0o400)
    assert jobstats(site, "7").returncode == 0
    doc = json.loads(path.read_text())
    forged = {**doc, "job": {**doc["job"], "id": "8", "uid": OTHER}}
    for payload, says in ((json.dumps(forged), "job 7: not in this node's monitor store, or not yours"),
                          ('{"schema": "gpuslurm.jobstats.v1", "job": {"id": "7", "uid": 65534}}',
                           "not a jobstats file"),
                          ("\u2028garbage", "not a jobstats file")):
        wrote = as_nobody(site, "-c", f"import os; p = {str(path)!r}; os.chmod(p, 0o600); "
                                      f"open(p, 'w').write({payload!r}); os.chmod(p, 0o400)")
        assert wrote.returncode == 0, wrote.stderr
        got = jobstats(site, "7")
        assert got.returncode == EXIT_BAD_INPUT and says in got.stderr, got.stderr
        assert got.stderr.count("\n") == 1
    with Store.open(str(site / "state" / "monitor.db")) as store:  # the monitor writes it again
        JobFiles(str(path.parent), store, Settings())(cycle(T0 + 120, alloc("7", NOBODY, G0)))
    f = path.stat()
    assert (f.st_uid, stat.S_IMODE(f.st_mode)) == (0, 0o440)
    assert jobstats(site, "7").returncode == 0


def test_a_root_file_another_user_s_acl_lets_nobody_open_is_still_not_theirs(site: Path) -> None:
    # 8's file with nobody's ACL (a mistake of root's, or a job id reused): the document is OTHER's
    from gpuslurm.safedir import reader_acl

    path = site / "state" / "jobstats" / "8.json"
    os.setxattr(path, ACL_XATTR, reader_acl(0o400, NOBODY))
    got = jobstats(site, "8")
    assert got.returncode == EXIT_BAD_INPUT and "not yours" in got.stderr


# a file system without ACLs (ramfs), mounted in a mount namespace of the test's own
NO_ACL_RUN = """
import json, sys
from gpuslurm.report.jobstats import Settings
from gpuslurm.state.store import Store
from gpuslurm.watch.jobfiles import JobFiles
from tests.watch.test_jobfiles import T0, alloc, cycle, NOBODY, G0, G1
import os
# job 7's file from an older monitor, given to nobody: with no ACL it must not stay theirs
open(sys.argv[2] + "/jobstats/7.json", "w").write("{}")
os.chown(sys.argv[2] + "/jobstats/7.json", NOBODY, -1)
warned = []
with Store.open(sys.argv[1]) as store:
    files = JobFiles(sys.argv[2] + "/jobstats", store, Settings(), interval_s=10, warn=warned.append)
    for i in range(3):
        c = cycle(T0 + 200 + 10 * i, alloc("7", NOBODY, G0), alloc("8", 1002, G1))
        store.write_cycle(c)
        files(c)
print(json.dumps({"warned": warned, "left": os.listdir(sys.argv[2] + "/jobstats")}))
"""


def test_a_file_system_without_acls_gets_no_files_and_one_warning(site: Path) -> None:
    mnt = site / "ramfs"
    mnt.mkdir(mode=0o755)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
         'mount -t ramfs -o mode=0755 gpuslurm-test "$1" && mkdir -m 0755 "$1/jobstats" '
         '&& shift && exec "$@"',
         "sh", str(mnt),
         sys.executable, "-c", NO_ACL_RUN, str(site / "state" / "monitor.db"), str(mnt)],
        capture_output=True, text=True, timeout=120, cwd=str(root), check=False,
        env={**os.environ, "PYTHONPATH": f"{root}:{root / 'src'}"})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["left"] == []  # no file given to its owner (the older one gone), no temporary left
    assert len(got["warned"]) == 1, got["warned"]
    assert "takes no POSIX ACL" in got["warned"][0] and "[jobstats] dir" in got["warned"][0]


def test_on_a_host_without_the_node_s_files_a_user_gets_one_line(site: Path) -> None:
    (site / "gpuslurm.toml").write_text(f'[paths]\nstate_dir = "{site / "elsewhere"}"\n')
    got = jobstats(site, "7")
    assert got.returncode == EXIT_BAD_INPUT
    assert got.stderr.endswith("no job files here: is `gpuslurm monitor` running on this node?\n")


def test_root_will_not_write_into_a_directory_others_can_write(site: Path) -> None:
    d = site / "state" / "jobstats"
    d.chmod(0o777)
    warned: list[str] = []
    with Store.open(str(site / "state" / "monitor.db")) as store:
        files = JobFiles(str(d), store, Settings(), warn=warned.append)
        with pytest.raises(Exception, match="writable by group or others"):
            files(cycle(T0 + 120, alloc("7", NOBODY, G0)))


DAY = 86400.0


def plant(base: Path, script: str) -> None:
    """nobody's own doing, in a directory an admin left writable for a while (0777), then fixed."""
    d = base / "state" / "jobstats"
    d.chmod(0o777)
    try:
        done = as_nobody(base, "-c", f"import os; d = {str(d)!r}; os.chdir(d)\n{script}")
        assert done.returncode == 0, done.stderr
    finally:
        d.chmod(0o755)


def test_the_monitor_removes_old_files_by_name_only_whatever_a_user_planted_there(site: Path) -> None:
    d = site / "state" / "jobstats"
    precious = site / "precious"  # root's, outside the directory: what the planted names point at
    precious.mkdir(mode=0o755)
    (precious / "keep").write_text("root's\n")
    plant(site, f"os.symlink({str(precious / 'keep')!r}, '9.json')\n"
                "os.mkfifo('10.json')\n"
                "os.mkdir('11.json'); open('11.json/inside', 'w').write('x')\n"
                f"os.symlink({str(precious)!r}, '.12.json.99.tmp')\n"
                "open('notes.txt', 'w').write('not a name the monitor writes')\n")
    month_later = [time.time() + 31 * DAY]
    with Store.open(str(site / "state" / "monitor.db")) as store:
        files = JobFiles(str(d), store, Settings(), keep_s=30 * DAY, clock=lambda: month_later[0])
        running = cycle(T0 + 200, alloc("13", NOBODY, G0))
        store.write_cycle(running)
        files(running)  # 13 runs: its file is written now, a month old by the clock, and kept
    names = sorted(os.listdir(d))
    # the ended jobs' files, the planted symlinks and the FIFO are gone (the FIFO never opened: the
    # sweep returned); a directory at a job's name stays; what the symlinks named is untouched
    assert names == ["11.json", "13.json", "notes.txt"]
    assert (precious / "keep").read_text() == "root's\n" and os.listdir(d / "11.json") == ["inside"]
    assert (d / "13.json").stat().st_uid == 0


def test_an_older_monitor_s_file_its_owner_keeps_renewing_goes_at_the_first_sweep(site: Path) -> None:
    # before the ACL the file was nobody's: they grew it and renewed its time to outlive retention
    d = site / "state" / "jobstats"
    os.chown(d / "7.json", NOBODY, -1)
    grew = as_nobody(site, "-c", f"import os; p = {str(d / '7.json')!r}; os.chmod(p, 0o600); "
                                 "open(p, 'a').write('x' * 65536); os.utime(p)")
    assert grew.returncode == 0, grew.stderr
    with Store.open(str(site / "state" / "monitor.db")) as store:
        JobFiles(str(d), store, Settings(), keep_s=30 * DAY)(cycle(T0 + 200))
    assert sorted(os.listdir(d)) == ["8.json"]  # root's young file stays


def test_files_younger_than_the_retention_stay_and_zero_keeps_them_all(site: Path) -> None:
    d = site / "state" / "jobstats"
    with Store.open(str(site / "state" / "monitor.db")) as store:
        JobFiles(str(d), store, Settings(), keep_s=30 * DAY, clock=lambda: time.time() + 29 * DAY)(
            cycle(T0 + 200))
        assert sorted(os.listdir(d)) == ["7.json", "8.json"]
        JobFiles(str(d), store, Settings(), keep_s=0, clock=lambda: time.time() + 3650 * DAY)(
            cycle(T0 + 200))
        assert sorted(os.listdir(d)) == ["7.json", "8.json"]
        JobFiles(str(d), store, Settings(), keep_s=30 * DAY, clock=lambda: time.time() + 31 * DAY)(
            cycle(T0 + 200))
    assert os.listdir(d) == []
    assert jobstats(site, "7").returncode == EXIT_BAD_INPUT  # gone reads as any job not here


@given(st.text(max_size=80))
def test_only_names_the_monitor_writes_are_a_job_s(name: str) -> None:
    job = job_of(name)
    if job is not None:
        assert valid_job_id(job)
        assert name == f"{job}.json" or (name.startswith(f".{job}.json.") and name.endswith(".tmp"))


@given(st.from_regex(r"\A[1-9][0-9]{0,8}(_[0-9]{1,4}|\[[0-9]{1,4}\]\.pbs1)?\Z"), st.integers(1, 2**22))
def test_a_job_s_file_and_its_temporary_name_it(job: str, pid: int) -> None:
    assert valid_job_id(job)
    assert job_of(f"{job}.json") == job == job_of(f".{job}.json.{pid}.tmp")
    assert job_of(f"{job}.json.x") is None and job_of(f".{job}.json.x.tmp") is None


def test_a_directory_that_will_not_open_is_tried_once_an_hour_without_jobs(site: Path) -> None:
    d = site / "state" / "jobstats"
    d.chmod(0o777)  # refused: others could write it
    hour = [time.time()]
    with Store.open(str(site / "state" / "monitor.db")) as store:
        files = JobFiles(str(d), store, Settings(), keep_s=30 * DAY, clock=lambda: hour[0])
        with pytest.raises(Exception, match="writable by group or others"):
            files(cycle(T0 + 200))
        files(cycle(T0 + 210))  # no job, the sweep not due: the directory is not opened again
        hour[0] += 3600
        with pytest.raises(Exception, match="writable by group or others"):
            files(cycle(T0 + 220))
