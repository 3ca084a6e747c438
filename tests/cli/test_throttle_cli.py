"""``gpuslurm throttle`` as a real process: exit codes, one-line errors, config, sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuslurm.samples import Violation
from gpuslurm.slurm.throttle import append_violations, read_throttle_file


def gs(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def test_add_list_remove(tmp_path: Path) -> None:
    f = str(tmp_path / "t")
    rc, out, _err = gs("add", "root", "--for", "2h", "--reason", "rogue", "--contact", "ops", "--file", f)
    assert rc == 0 and "root: GPU jobs refused until" in out
    rc, out, _ = gs("add", "daemon", "--cap", "2", "--for", "30m", "--file", f)
    assert rc == 0 and "capped to 2" in out
    rc, out, _ = gs("list", "--json", "--file", f)
    rows = {r["user"]: r for r in json.loads(out)["throttles"]}
    assert rows["root"]["mode"] == "reject" and rows["root"]["contact"] == "ops"
    assert rows["daemon"]["mode"] == "cap" and rows["daemon"]["value"] == 2
    assert 7100 < rows["root"]["until"] - time.time() <= 7200
    rc, out, _ = gs("list", "--file", f)
    assert rc == 0 and "root" in out and "rogue" in out
    assert gs("remove", "root", "--file", f)[1].strip() == "root: throttle lifted"
    assert gs("remove", "root", "--file", f)[1].strip() == "root: was not throttled"
    assert [t.user for t in read_throttle_file(f).throttles] == ["daemon"]


def test_unknown_user_is_throttled_with_a_warning(tmp_path: Path) -> None:
    rc, _out, err = gs("add", "no-such-user-xyz", "--for", "1h", "--file", str(tmp_path / "t"))
    assert rc == 0 and "warning: no user 'no-such-user-xyz'" in err


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = str(tmp_path / "t")
    for args in (["add", "x", "--for", "2y"], ["add", "x", "--for", "1h", "--mode", "ban"],
                 ["add", "x"], ["add", "x", "--for", "1h", "--until", "18:00"],
                 ["add", "x", "--until", "yesterday"], ["add", "a b", "--for", "1h"],
                 ["add", "x", "--for", "1h", "--mode", "reject", "--cap", "2"],
                 ["add", "x", "--for", "1h", "--cap", "0"], ["add", "x", "--for", "1h", "--nice", "-5"],
                 ["list", "--file", "relative/path"]):
        rc, _out, err = gs(*args, *([] if "--file" in args else ["--file", f]))
        assert rc == 2, (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
    assert not Path(f).exists()


def test_config_sets_file_contact_and_defaults(tmp_path: Path) -> None:
    f = tmp_path / "etc" / "thr"
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(f'[throttle]\nfile = "{f}"\ncontact = "hpc@example.org"\ncap_gpus = 3\n')
    rc, _out, err = gs("add", "root", "--mode", "cap", "--for", "1h", env={"GPUSLURM_CONFIG": str(cfg)})
    assert rc == 0, err
    (t,) = read_throttle_file(str(f)).throttles
    assert (t.mode, t.value, t.contact) == ("cap", 3, "hpc@example.org")
    cfg.write_text("[throttle]\nsync_mode = \"ban\"\n")
    rc, _out, err = gs("list", env={"GPUSLURM_CONFIG": str(cfg)})
    assert rc == 2 and "sync_mode" in err


def test_sync_throttles_from_violations_once(tmp_path: Path) -> None:
    vdir, f = tmp_path / "violations", tmp_path / "thr"
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(f'[paths]\nviolations_dir = "{vdir}"\n[throttle]\nfile = "{f}"\n'
                   'sync_kinds = ["rogue"]\nsync_minutes = 30\nsync_mode = "priority"\nnice = 777\n')
    env = {"GPUSLURM_CONFIG": str(cfg)}
    now = time.time()
    append_violations(str(vdir), "node1", [
        Violation("rogue", "node1", "alice", "12", 999, "python", "GPU-aa", now - 120, 60, "e"),
        Violation("idle", "node1", "bob", "13", None, None, "GPU-bb", now - 120, 600, "e"),
    ])
    rc, out, _ = gs("sync", "--dry-run", env=env)
    assert rc == 0 and "would throttle alice (priority)" in out and not f.exists()
    rc, out, _ = gs("sync", env=env)
    assert rc == 0 and "throttled alice (priority)" in out and "bob" not in out
    (t,) = read_throttle_file(str(f)).throttles
    assert t.value == 777 and abs(t.until - (now - 60 + 1800)) < 5 and "GPU-aa" in t.reason
    header = f.read_text().splitlines()[0]
    rc, out, _ = gs("sync", env=env)
    assert rc == 0 and "no throttle to add or extend" in out
    assert f.read_text().splitlines()[0] == header  # nothing changed: the plugin has nothing to re-read


def test_a_fifo_or_an_open_directory_is_refused_by_every_throttle_command(tmp_path: Path) -> None:
    # the plugin cannot stat (Lua 5.1): the directory only root can write is its defence, and every
    # command checks it; a FIFO at the file is refused at once (never a hang), one line, exit 2
    f = tmp_path / "t"
    os.mkfifo(f)
    vdir = tmp_path / "v"
    vdir.mkdir()
    commands = (["list"], ["add", "root", "--for", "1h"], ["remove", "root"],
                ["sync", "--violations-dir", str(vdir)], ["sync", "--dry-run", "--violations-dir", str(vdir)])
    for args in commands:
        rc, _out, err = gs(*args, "--file", str(f))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "regular file" in err, (args, err)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    for args in commands:
        rc, _out, err = gs(*args, "--file", str(shared / "t"))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "writable by group" in err, (args, err)


def test_sync_says_when_the_violations_directory_is_missing(tmp_path: Path) -> None:
    rc, out, err = gs("sync", "--file", str(tmp_path / "t"), "--violations-dir", str(tmp_path / "nope"))
    assert rc == 0 and "0 violation(s) read" in out
    assert err.strip().splitlines() == [
        f"gpuslurm: warning: {tmp_path / 'nope'}: no such directory, no violation read "
        "(see paths.violations_dir)"]
