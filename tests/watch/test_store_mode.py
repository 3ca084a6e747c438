"""Who can read the monitor's store: root alone by default, a named group when configured.

The store names every user's processes, jobs and findings, so an ordinary user (``nobody``) must
not read it: created 0600 with its -wal and -shm whatever the umask, an older 0644 one made 0600
again when the monitor opens it (and said), and 0640 for ``[monitor] db_group`` only.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslurm.samples import Cycle, GpuSample
from gpuslurm.state.store import Store, StoreError

NOBODY = 65534
G0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
READ = ("import sqlite3, sys; c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True); "
        "print(c.execute('SELECT uuid FROM device').fetchall())")


@pytest.fixture
def state() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="gpuslurm-store-mode-", dir="/tmp"))
    base.chmod(0o755)  # like /var/lib/gpuslurm: anyone may look in, so the files' modes decide
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _files(db: Path) -> dict[str, tuple[int, int]]:
    return {f.name: (stat.S_IMODE(f.stat().st_mode), f.stat().st_gid) for f in db.parent.glob("monitor.db*")}


def _write(store: Store) -> None:
    store.write_cycle(Cycle(1000.0, "n1", (GpuSample(1000.0, G0, None, 50.0),), (), (), ()))


def _nobody_reads(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/python3", "-c", READ, str(db)], user=NOBODY, group=NOBODY,
                          extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60, check=False)


def test_a_new_store_and_its_wal_are_0600_whatever_the_umask(state: Path) -> None:
    db = state / "monitor.db"
    old = os.umask(0)
    try:
        store = Store.open(str(db))
        _write(store)
    finally:
        os.umask(old)
    try:
        assert set(_files(db)) == {"monitor.db", "monitor.db-wal", "monitor.db-shm"}
        assert {mode for mode, _gid in _files(db).values()} == {0o600}
        assert store.tightened == []
    finally:
        store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="plays root (the monitor) and nobody")
def test_an_old_world_readable_store_is_made_root_only_when_opened(state: Path) -> None:
    db = state / "monitor.db"
    with Store.open(str(db)) as store:
        _write(store)
        for f in db.parent.glob("monitor.db*"):
            f.chmod(0o644)  # what gpuslurm made before, in a 0755 directory
        assert "GPU-aaaaaaaa" in _nobody_reads(db).stdout  # the leak: nobody read the history
        with Store.open(str(db)) as again:
            want = sorted(f"{db}{s}: mode 0644 -> 0600" for s in ("", "-wal", "-shm"))
            assert sorted(again.tightened) == want
            _write(again)
        assert {mode for mode, _gid in _files(db).values()} == {0o600}
    done = _nobody_reads(db)
    assert done.returncode != 0 and "unable to open" in done.stderr, done


@pytest.mark.skipif(os.geteuid() != 0, reason="plays root (the monitor) and nobody")
def test_db_group_opens_it_to_that_group_only(state: Path) -> None:
    db = state / "monitor.db"
    with Store.open(str(db), group=NOBODY) as store:
        _write(store)
        assert {v for v in _files(db).values()} == {(0o640, NOBODY)}
        # a member of the group reads it while the monitor runs (its -shm is there)
        assert "GPU-aaaaaaaa" in _nobody_reads(db).stdout
    with Store.open(str(db)) as store:  # the group dropped from the config: root's alone again
        assert f"{db}: mode 0640 -> 0600" in store.tightened
    assert {mode for mode, _gid in _files(db).values()} == {0o600}


def test_a_symlinked_wal_is_refused(state: Path) -> None:
    db = state / "monitor.db"
    Store.open(str(db)).close()
    (state / "elsewhere").write_text("")
    os.symlink(state / "elsewhere", f"{db}-wal")
    with pytest.raises(StoreError, match="refusing to use: a symlink"):
        Store.open(str(db))


def test_a_users_own_file_in_a_directory_they_can_write_is_refused(state: Path) -> None:
    # A store in a directory ``nobody`` can write ([monitor] db or --db under a shared path): the
    # attacker makes the -wal before root's monitor opens the store. Root's chmod 0600 leaves the
    # file theirs, so they would read every user's processes and jobs through it (and chmod it
    # back): a store file root does not own is refused, never made private.
    state.chmod(0o1777)
    db = state / "monitor.db"
    Store.open(str(db)).close()
    for f in state.glob("monitor.db-*"):
        f.unlink()
    made = subprocess.run(["/usr/bin/python3", "-c", "import sys; open(sys.argv[1], 'wb').close()",
                           f"{db}-wal"], user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                          capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    with pytest.raises(StoreError, match="owned by uid 65534"):
        Store.open(str(db))
    assert Path(f"{db}-wal").stat().st_uid == NOBODY
