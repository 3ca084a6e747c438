"""The throttle file on disk (atomic, safe, 0644, junk and expiry dropped) and the violations dir."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import Throttle, add_throttle
from gpuslurm.samples import Violation
from gpuslurm.slurm.throttle import (
    HEADER_PREFIX,
    append_violations,
    format_throttle_file,
    parse_throttle_file,
    read_throttle_file,
    read_violations,
    update_throttle_file,
    write_throttle_file,
)

NOW = time.time()
A = Throttle("alice", int(NOW) + 3600, "reject", 0, int(NOW), "help@x", "rogue: 100% of GPU-1")
B = Throttle("bob", int(NOW) + 7200, "cap", 2, int(NOW), "", "")


def test_round_trip_and_header(tmp_path: Path) -> None:
    path = tmp_path / "throttle"
    write_throttle_file(str(path), [A, B])
    text = path.read_text()
    assert text.startswith(HEADER_PREFIX)
    assert read_throttle_file(str(path)).throttles == (A, B)
    first = text.splitlines()[0]
    write_throttle_file(str(path), [A, B])
    assert path.read_text().splitlines()[0] != first  # every write has a new id
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
    assert [p.name for p in tmp_path.iterdir()] == ["throttle"]  # no temporary file left


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    content = read_throttle_file(str(tmp_path / "nope" / "throttle"))
    assert content.throttles == () and not content.exists


def test_write_drops_expired_and_junk(tmp_path: Path) -> None:
    path = tmp_path / "throttle"
    expired = Throttle("old", int(NOW) - 1, "reject", 0, 0, "", "")
    path.write_text(format_throttle_file([A, expired], "x") + "junk line\n")
    before, after = update_throttle_file(str(path), lambda f: add_throttle(f.throttles, B, NOW), NOW)
    assert [j[1] for j in before.junk] == ["junk line"]
    assert after == (A, B)
    again = read_throttle_file(str(path))
    assert again.throttles == (A, B) and again.junk == ()


def test_change_returning_none_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "throttle"
    write_throttle_file(str(path), [A])
    text = path.read_text()
    update_throttle_file(str(path), lambda f: None)
    assert path.read_text() == text


def test_texts_cannot_break_lines(tmp_path: Path) -> None:
    evil = A._replace(reason="x\tbob\t1\n", contact="a\rb")
    text = format_throttle_file([evil], "id")
    parsed = parse_throttle_file(text)
    assert parsed.junk == () and len(parsed.throttles) == 1


def test_refuses_a_symlink_at_the_file(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    link = tmp_path / "throttle"
    link.symlink_to(target)
    with pytest.raises(InputError, match="symlink"):
        write_throttle_file(str(link), [A])
    with pytest.raises(InputError, match="symlink"):
        read_throttle_file(str(link))
    assert target.read_text() == "precious\n" and link.is_symlink()


def test_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InputError, match="writable by group or others"):
        write_throttle_file(str(shared / "throttle"), [A])
    assert not (shared / "throttle").exists()


def test_refuses_a_directory_owned_by_someone_else(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 65534, 65534)
    with pytest.raises(InputError, match="owned by uid 65534"):
        write_throttle_file(str(other / "throttle"), [A])


def test_symlinked_directory_path_is_resolved_first(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    write_throttle_file(str(tmp_path / "alias" / "throttle"), [A])
    assert read_throttle_file(str(real / "throttle")).throttles == (A,)


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "throttle"
    code = (
        "import sys, time\n"
        "from gpuslurm.policy.throttle import Throttle, add_throttle\n"
        "from gpuslurm.slurm.throttle import update_throttle_file\n"
        "now = time.time()\n"
        "for i in range(15):\n"
        "    t = Throttle(f'{sys.argv[2]}{i}', int(now) + 3600)\n"
        "    update_throttle_file(sys.argv[1], lambda f: add_throttle(f.throttles, t, now), now)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), f"u{n}x"]) for n in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert len(read_throttle_file(str(path)).throttles) == 60


def _v(node: str, user: str, start: float) -> Violation:
    return Violation("rogue", node, user, "5", 77, "python", "GPU-1", start, 30.0, "evidence")


def test_violations_are_appended_per_node_and_read_back(tmp_path: Path) -> None:
    d = tmp_path / "violations"
    assert read_violations(str(d)).violations == ()
    append_violations(str(d), "n1", [_v("n1", "alice", NOW - 100)])
    append_violations(str(d), "n1", [_v("n1", "bob", NOW - 50)])
    append_violations(str(d), "n2", [_v("n2", "carol", NOW - 10_000)])
    with open(d / "n2.jsonl", "a") as fh:
        fh.write('{"v":1,"kind":"rogue"\n')  # a torn line
    (d / "notes.txt").write_text("ignored\n")
    scan = read_violations(str(d), since=NOW - 1000)
    assert sorted(v.user or "" for v in scan.violations) == ["alice", "bob"]
    assert len(scan.problems) == 1 and "n2.jsonl:2" in scan.problems[0]
    with pytest.raises(InputError):
        append_violations(str(d), "../etc", [_v("x", "y", NOW)])
