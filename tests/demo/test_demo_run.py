"""``gpuslurm demo`` end to end: the real monitor path, the report, the chart; as root and as nobody."""

from __future__ import annotations

import io
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslurm.cli.demo_cmd import _Bar
from gpuslurm.demo import run as demo_run
from gpuslurm.demo.run import Progress

NOBODY = 65534
KEPT = {".gpuslurm-demo", "monitor.db", "monitor.db-wal", "monitor.db-shm", "scenario.json", "fairshare.png",
        "report.txt", ".cache", "gpuslurm.toml"}


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", "demo", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-12:-4] == b"\x00\x00\x00\x00IEND"  # complete, not cut short
    return width, height


def check_report(text: str) -> None:
    """What the day must show: the rogue, the idle allocation, the user over quota."""
    assert "GPU fair-share report" in text
    lines = text.splitlines()
    alice = next(line for line in lines if line.startswith("alice"))
    assert "!" in alice.split()[1]  # over quota
    assert any(line.strip().startswith("dave: rogue (") and "python (PID 48211) of dave" in line
               and "in no job" in line for line in lines)
    assert any(line.strip().startswith("carol: idle (") and "job 1003" in line for line in lines)
    assert any("carol: 1 idle allocation" in line for line in lines)
    assert any("dave: 1 GPU process outside any job" in line for line in lines)


def test_the_demo_replays_a_day_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    start = time.monotonic()
    res = demo("--hours", "3", "--out", str(out))
    took = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    assert took < 60
    check_report(res.stdout)
    assert (out / "report.txt").read_text() == res.stdout
    assert png_size(out / "fairshare.png") == (1100, 1200)
    # progress: periodic lines when stderr is not a terminal, then where everything is
    assert res.stderr.count("demo: ") == 10 and "demo: 100 %" in res.stderr
    assert f"Chart:  {out / 'fairshare.png'}" in res.stderr
    assert set(os.listdir(out)) <= KEPT  # the stand-in /proc and job maps are gone
    # the store is the monitor's own, with every kind of finding the detectors made
    conn = sqlite3.connect(f"file:{out / 'monitor.db'}?mode=ro", uri=True)
    try:
        kinds = dict(conn.execute("SELECT kind, count(*) FROM violation GROUP BY kind").fetchall())
        cycles = conn.execute("SELECT count(DISTINCT ts) FROM gpu_sample").fetchone()[0]
        jobs = {r[0] for r in conn.execute("SELECT job_id FROM allocation")}
    finally:
        conn.close()
    assert kinds.get("rogue") == 1 and kinds.get("idle") == 2 and kinds.get("over-share", 0) >= 3
    assert cycles == 3 * 360 and jobs == {j.job_id for j in demo_run.script.JOBS}
    # the suggested next command, run as printed (by a shell, from a directory of no config),
    # judges with the demo's quotas, not gpuslurm's default of 100 % each
    nxt = next(line for line in res.stderr.splitlines() if line.startswith("Next:"))[len("Next:"):]
    env = {k: v for k, v in os.environ.items() if k != "GPUSLURM_CONFIG"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    again = subprocess.run(["bash", "-c", nxt.replace("--by job", "--by user")], capture_output=True,
                           text=True, timeout=60, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    quotas = {ln.split()[0]: ln.split()[-5] for ln in again.stdout.splitlines()
              if ln.split() and ln.split()[0] in {u.name for u in demo_run.script.USERS}}
    assert quotas == {u.name: f"{u.quota * 100:.0f}" for u in demo_run.script.USERS}, again.stdout


def test_a_second_run_replaces_the_first_and_foreign_directories_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert demo("--hours", "2", "--out", str(out), "--no-plot").returncode == 0
    assert not (out / "fairshare.png").exists()
    again = demo("--hours", "2", "--out", str(out), "--no-plot")
    assert again.returncode == 0, again.stderr
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    res = demo("--hours", "2", "--out", str(foreign))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "not empty and not an earlier demo's directory" in res.stderr
    assert (foreign / "thesis.tex").read_text() == "precious" and os.listdir(foreign) == ["thesis.tex"]
    (out / "thesis.tex").write_text("precious")  # even in a demo's directory, a file of someone else's
    res = demo("--hours", "2", "--out", str(out))
    assert res.returncode == 2 and "'thesis.tex'" in res.stderr and (out / "thesis.tex").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--hours", "1"], "--hours: must be between 2 and 168 hours"),
    (["--hours", "200"], "--hours: must be between 2 and 168 hours"),
    (["--speed", "0"], "must be more than 0"),
])
def test_bad_options_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    res = demo(*args, "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_without_matplotlib_the_report_is_printed_and_the_missing_chart_said(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; from gpuslurm.cli.main import main; "
            f"sys.exit(main(['demo', '--hours', '2', '--out', {str(tmp_path / 'o')!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    check_report(res.stdout)
    assert "Chart:  not drawn: matplotlib is not installed" in res.stderr
    assert not (tmp_path / "o" / "fairshare.png").exists()


def test_without_out_it_uses_a_new_temporary_directory(tmp_path: Path) -> None:
    res = demo("--hours", "2", "--no-plot", env={"TMPDIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    made = [p for p in tmp_path.iterdir() if p.name.startswith("gpuslurm-demo-")]
    assert len(made) == 1 and (made[0] / "report.txt").is_file()
    assert f"Report: {made[0] / 'report.txt'}" in res.stderr


def test_speed_paces_the_replay(tmp_path: Path) -> None:
    out = demo_run.prepare_out(tmp_path / "o")
    fast = demo_run.run_day(out, 2.0, speed=7200 / 1.5)  # two hours in a second and a half
    assert 1.4 <= fast.elapsed_s < 10


def test_the_progress_bar_stays_on_one_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    fp = Tty()
    bar = _Bar(fp)
    for done in (0.0, 3600.0, 7200.0):
        bar.update(Progress(done, 7200.0, 1, 2, {"rogue": 1}))
    bar.done()
    text = fp.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and text.count("\r") == 3
    assert "[###############...............]  50 %  1:00 of 2:00  2 jobs  found: 1 rogue" in text
    assert all(len(part.removesuffix("\x1b[K\n").removesuffix("\x1b[K")) < 100 for part in text.split("\r"))


# ---- as nobody ---------------------------------------------------------------------------------

@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory nobody can reach (pytest's tmp_path is root-only), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="gpuslurm-demo-test-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _owned_by_nobody(root: str) -> set[str]:
    found = set()
    for name in os.listdir(root):
        try:
            if os.lstat(os.path.join(root, name)).st_uid == NOBODY:
                found.add(name)
        except FileNotFoundError:
            pass
    return found


def _blocked(path: str) -> list[str]:
    """The directories on the way to ``path`` (through its links) that a user with no rights of its
    own cannot pass (no o+x), top first."""
    blocked: list[str] = []
    for way in (os.path.abspath(path), os.path.realpath(path)):
        for parent in reversed(Path(way).parents):
            if os.path.isdir(parent) and not os.stat(parent).st_mode & 0o001 and str(parent) not in blocked:
                blocked.append(str(parent))
    return blocked


def _as_nobody(argv: list[str], scratch: Path, env: dict[str, str],
               cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``argv`` as nobody, with only ``env``; no capabilities kept.

    The interpreter is this one as the test runs it (``sys.executable``: a venv stays a venv),
    with gpuslurm installed however it is: editable (the checkout's src), a wheel in a venv, or the
    system's. Where nobody cannot pass a directory on the way to the interpreter, its standard
    library or the packages (a pyenv under /root), the test gives that directory o+x in a private
    mount namespace, on an overlay whose upper layer lies in ``scratch``: the paths stay the same,
    the host's directories are untouched, and nothing else under them becomes readable.
    """
    import gpuslurm

    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
            "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    needed = [sys.executable, sys.base_prefix, os.path.dirname(gpuslurm.__file__),
              os.path.dirname(demo_run.__file__), *(p for p in sys.path if p and os.path.isdir(p))]
    blocked = sorted({d for p in needed for d in _blocked(p)}, key=lambda d: d.count("/"))
    if not blocked:
        return subprocess.run([*drop, sys.executable, *argv], capture_output=True, text=True, timeout=120,
                              cwd=cwd)
    if shutil.which("unshare") is None:
        pytest.skip(f"nobody cannot pass {blocked[0]}, and unshare(1) is absent to open it in a namespace")
    layers = Path(tempfile.mkdtemp(prefix="layers-", dir=scratch))
    script, tops = [], [d for d in blocked if not any(d.startswith(t + "/") for t in blocked)]
    for i, top in enumerate(tops):
        (layers / f"u{i}").mkdir()
        (layers / f"w{i}").mkdir()
        script.append(f'mount -t overlay overlay -o "lowerdir={top},upperdir={layers}/u{i},'
                      f'workdir={layers}/w{i}" "{top}"')
    script += [f'chmod o+x "{d}"' for d in blocked]
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           " && ".join(script) + ' && exec "$@"', "sh", *drop, sys.executable, *argv],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_demo_needs_no_root_and_writes_only_in_its_directory(scratch: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become nobody")
    home, tmp, cwd, work = (scratch / n for n in ("home", "tmp", "cwd", "work"))
    out = work / "out"
    for d in (home, tmp, cwd, work):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    before = {p: _owned_by_nobody(p) for p in ("/tmp", "/var/tmp", "/dev/shm")}
    env = {"HOME": str(home), "TMPDIR": str(tmp), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    res = _as_nobody(["-m", "gpuslurm", "demo", "--hours", "2", "--out", str(out)], scratch, env, cwd)
    assert res.returncode == 0, res.stderr
    check_report(res.stdout)
    assert png_size(out / "fairshare.png") == (1100, 1200)
    assert os.stat(out).st_uid == NOBODY and all(p.stat().st_uid == NOBODY for p in out.rglob("*"))
    # nothing in its home (matplotlib's caches went into the demo's directory), temp dir or cwd
    assert os.listdir(home) == [] and os.listdir(tmp) == [] and os.listdir(cwd) == []
    assert os.listdir(work) == ["out"] and set(os.listdir(out)) <= KEPT
    assert {p: _owned_by_nobody(p) for p in before} == before
