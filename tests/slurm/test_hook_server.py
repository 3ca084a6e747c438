"""The hook server (``gpuslurm hook-server``) and the installed prolog and epilog as its clients.

Each test installs the hooks as an admin does (``gpuslurm install --config --replay``, the site's
run_dir not the default, so install writes the server's socket path into the prolog and the
epilog), starts the real server as root and runs the installed executables as slurmd runs them.
The attackers: the job's user (nobody) at the socket, and a socket planted by someone who is
not root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cgroup_helpers import NOBODY, SRC, SYSTEM_PYTHON, as_nobody
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.errors import EXIT_INTERNAL
from gpuslurm.install import CC as C_COMPILER
from gpuslurm.slurm import hookclient

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hook server runs as root")


def job(n: int) -> str:
    jid = f"{n}{os.getpid()}"
    assert not Path(f"/sys/fs/cgroup/devices/gpuslurm/job_{jid}").exists()
    return jid


class Server:
    def __init__(self, sock: Path, *args: str) -> None:
        self.sock = sock
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuslurm", "hook-server", "--socket", str(sock),
                                      *args], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert "serving the prolog and the epilog" in line, line

    def stop(self) -> str:
        """SIGTERM; the server's last line (how many hooks its forks ran)."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return err.strip().splitlines()[-1]


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


@pytest.fixture(params=["python", "c"])
def client(request: pytest.FixtureRequest) -> str:
    """Which client the installed prolog and epilog start: the Python one (the default) or the
    one `gpuslurm install --c-client` builds."""
    if request.param == "c" and not os.access(C_COMPILER, os.X_OK):
        pytest.skip(f"--c-client needs a C compiler at {C_COMPILER} (the release roots' Pythons have none)")
    return str(request.param)


def install(site: HookSite, client: str) -> Path:
    prefix = site.install_hooks(c_client=client == "c")
    assert ("gpuslurm-hook-client prolog " in (prefix / "gpuslurm-prolog").read_text()) == (client == "c")
    return prefix


@pytest.fixture
def server(site: HookSite) -> Iterator[Server]:
    srv = Server(site.root / "run" / "hooks.sock")
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory the job's user can reach (pytest's own is root's 0700): root's, 0755."""
    path = Path(tempfile.mkdtemp(prefix="gpuslurm-hook-server-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def open_server(open_dir: Path) -> Iterator[Server]:
    """The server with its socket where the job's user can reach the socket file itself."""
    srv = Server(open_dir / "hooks.sock")
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def served(line: str) -> int:
    return int(line.split("stopped after ")[1].split()[0])


def test_install_writes_the_socket_of_the_configs_run_dir_into_the_prolog_and_epilog(site: HookSite,
                                                                                      client: str) -> None:
    prefix = install(site, client)
    line = f"\nGPUSLURM_HOOK_SOCKET={site.root / 'run' / 'hooks.sock'}\nexport GPUSLURM_HOOK_SOCKET\n"
    assert line in (prefix / "gpuslurm-prolog").read_text()
    assert line in (prefix / "gpuslurm-epilog").read_text()
    assert "GPUSLURM_HOOK_SOCKET" not in (prefix / "gpuslurm-task-prolog").read_text()


def test_served_prolog_and_epilog_do_what_the_hooks_do_without_the_server(site: HookSite,
                                                                          client: str) -> None:
    prefix = install(site, client)
    here, there = job(601), job(602)
    # Without a server: the hook runs in its own process, as before the server existed.
    # An account that is not UTF-8 (slurmd passes what the job gave): the bytes reach the fork as
    # they reach the hook's own process.
    odd = {"SLURM_JOB_ACCOUNT": "phys\udcffics"}
    alone = site.run_installed(prefix, "prolog", site.slurm_environ(here, gpus="2,3", **odd))
    assert alone.returncode == 0, alone.stderr
    srv = Server(site.root / "run" / "hooks.sock")
    try:
        prolog = site.run_installed(prefix, "prolog", site.slurm_environ(there, gpus="2,3", **odd))
        assert prolog.returncode == 0, prolog.stderr
        # The server's fork wrote to the client's own stderr, passed along with the request.
        assert f"gpuslurm prolog job {there}: 2 device(s)" in prolog.stderr
        maps = [json.loads((site.jobs_dir / f"{j}.json").read_text()) for j in (here, there)]
        for m in maps:
            m.pop("job_id"), m.pop("start", None), m.pop("written", None)
        assert maps[0] == maps[1]
        tasks = [(site.root / "run" / "tasks" / f"{j}.task").read_text().replace(j, "JOB")
                 for j in (here, there)]
        assert tasks[0] == tasks[1]
        epilog = site.run_installed(prefix, "epilog", site.slurm_environ(there, gpus="2,3"))
        assert epilog.returncode == 0, epilog.stderr
        assert not (site.jobs_dir / f"{there}.json").exists()
    finally:
        last = srv.stop()
    assert served(last) == 2, last
    epilog = site.run_installed(prefix, "epilog", site.slurm_environ(here, gpus="2,3"))
    assert epilog.returncode == 0, epilog.stderr
    summaries = [json.loads((site.summaries / f"{j}-summary.json").read_text()) for j in (here, there)]
    assert summaries[0]["gpus"] == summaries[1]["gpus"]
    assert summaries[0].keys() == summaries[1].keys()


def test_a_served_hooks_exit_code_is_the_hooks_own(site: HookSite, server: Server, client: str) -> None:
    prefix = install(site, client)
    site.write_config("[bogus]\n")
    broken = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(603)))
    assert broken.returncode == 2 and "unknown section [bogus]" in broken.stderr
    assert not (site.jobs_dir / f"{jid}.json").exists()
    assert served(server.stop()) == 1


def test_usage_and_help_never_reach_the_server(site: HookSite, server: Server, client: str) -> None:
    prefix = install(site, client)
    bad = site.run_installed(prefix, "prolog", site.slurm_environ(job(604)), "--verbose")
    assert bad.returncode == 2 and bad.stderr.startswith("usage: ")
    assert served(server.stop()) == 0


def test_a_served_hook_imports_nothing_the_server_did_not(site: HookSite) -> None:
    """What keeps a served hook cheap: everything it imports is imported once, before the fork."""
    code = f"""
import os, sys
from gpuslurm.slurm import hookserver
hookserver.warm()
before = set(sys.modules)
fd = os.open("/dev/null", os.O_WRONLY); os.dup2(fd, 1); os.dup2(fd, 2)
from gpuslurm.slurm.entry import main
codes = []
for hook in ("prolog", "epilog"):
    os.environ.clear()
    os.environ.update({site.environ(job(605), gpus="0,1")!r})
    codes.append(main([hook]))
os.write(int(sys.argv[1]), repr((codes, sorted(set(sys.modules) - before))).encode())
"""
    r, w = os.pipe()
    try:
        subprocess.run([sys.executable, "-c", code, str(w)], pass_fds=(w,), check=True, timeout=60)
    finally:
        os.close(w)
    with os.fdopen(r) as f:
        codes, new = eval(f.read())
    assert codes == [0, 0]
    assert new == []


# --- as the attacker: the job's user at the socket ---------------------------------------------


ATTACK = """
import errno, os, socket, sys
from gpuslurm.slurm import hookclient
raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    raw.connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print(errno.errorcode[exc.errno])
raw.close()
print(hookclient.ask("prolog", sys.argv[1], {k.encode(): v.encode() for k, v in os.environ.items()}))
"""


def _attack_as_nobody(sock: Path, env: dict[str, str]) -> list[str]:
    """The job's user's own client at the socket: how a bare connect ends, and what ``ask`` got."""
    proc = as_nobody([SYSTEM_PYTHON, "-c", ATTACK, str(sock)], env={**env, "PYTHONPATH": SRC})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.split()


def test_the_jobs_user_cannot_reach_the_socket(site: HookSite, open_server: Server) -> None:
    """The job's user sends a prolog of their own making (their job id, GPUs and config): the
    socket is root's 0600, so the connect is refused, nothing is sent and nothing runs."""
    jid = job(606)
    assert _attack_as_nobody(open_server.sock, site.environ(jid)) == ["EACCES", "None"]
    assert not (site.jobs_dir / f"{jid}.json").exists()
    assert served(open_server.stop()) == 0


def test_a_socket_opened_to_everyone_still_serves_root_alone(site: HookSite, open_server: Server) -> None:
    """A mode gone wrong (0666): the job's user connects, and the server closes the connection
    before reading a byte and names the uid; the request runs nowhere."""
    os.chmod(open_server.sock, 0o666)
    jid = job(607)
    # Closed unanswered: the client's fail-closed answer if its request got into the socket's
    # buffer first, else nothing sent (the server closed before the send): nothing ran either way.
    connected, asked = _attack_as_nobody(open_server.sock, site.environ(jid))
    assert connected == "connected" and asked in (str(EXIT_INTERNAL), "None")
    assert not (site.jobs_dir / f"{jid}.json").exists()
    open_server.proc.send_signal(signal.SIGTERM)
    _, err = open_server.proc.communicate(timeout=30)
    assert open_server.proc.returncode == 0
    assert err.count(f"refused a client of uid {NOBODY} (only root's hooks are served)") == 2, err
    assert "stopped after 0 hook(s)" in err


def test_a_socket_planted_by_another_user_gets_nothing_and_the_hook_runs_here(
        site: HookSite, open_dir: Path, client: str) -> None:
    """Someone other than root listens where the prolog looks: the prolog sends them nothing
    (not the job's environment, not its descriptors) and runs the hook itself."""
    plant = open_dir / "plant"
    plant.mkdir()
    os.chown(plant, NOBODY, NOBODY)  # how an impostor could get there at all
    got = plant / "got"
    impostor = as_nobody([SYSTEM_PYTHON, "-c", IMPOSTOR, str(plant / "hooks.sock"), str(got)])
    assert impostor.stdout is not None
    assert impostor.stdout.readline().strip() == "listening"
    env = {**site.environ(jid := job(609)), hookclient.SOCKET_VAR: str(plant / "hooks.sock")}
    argv = [sys.executable, "-I", "-c", CLIENT, "prolog"]
    if client == "c":  # the built client, with the Python hook as its fallback, as install writes it
        argv = [str(install(site, client) / "gpuslurm-hook-client"), "prolog", *argv]
    try:
        prolog = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        _, err = impostor.communicate(timeout=30)
    assert prolog.returncode == 0, prolog.stderr
    assert "is not root's hook server; running the hook here" in prolog.stderr
    assert (site.jobs_dir / f"{jid}.json").is_file()
    assert got.read_text() == "b'' []", err  # connected, then nothing received


CLIENT = "from gpuslurm.slurm.hookclient import run; run()"  # what the installed prolog runs
IMPOSTOR = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); s.listen(1); print("listening", flush=True)
s.settimeout(20)
c, _ = s.accept(); c.settimeout(5)
try:
    data, anc, _, _ = c.recvmsg(65536, socket.CMSG_SPACE(12))
except OSError:
    data, anc = b"", []
open(sys.argv[2], "w").write(repr(data) + " " + repr(anc))
"""


# --- the client's rule: fall back before sending, fail closed after ---------------------------


def _fake_server(sock: Path, answer: bytes | None, ready: bytes | None = hookclient.READY
                 ) -> tuple[socket.socket, list[bytes]]:
    """A root listener that takes one request, says ``ready`` (None: closes instead), and after
    the client's GO answers ``answer`` (None: closes unanswered). ``got``: the request, then what
    the client said after READY."""
    import threading

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(str(sock))
    srv.listen(1)
    got: list[bytes] = []

    def one() -> None:
        conn, _ = srv.accept()
        data, _, _, _ = conn.recvmsg(hookclient.MAX_REQUEST)
        got.append(data)
        if ready is not None:
            conn.send(ready)
            conn.settimeout(10)
            try:
                go, anc, _, _ = conn.recvmsg(16, socket.CMSG_SPACE(12))
            except OSError:
                go, anc = b"", []
            for _, _, fds in anc:  # the hook's streams come with GO
                for i in range(0, len(fds), 4):
                    os.close(int.from_bytes(fds[i:i + 4], sys.byteorder))
            got.append(go)
            if answer is not None and go == hookclient.GO:
                conn.send(answer)
        conn.close()

    threading.Thread(target=one, daemon=True).start()
    return srv, got


def test_a_request_sent_and_unanswered_fails_the_hook_closed(site: HookSite, client: str) -> None:
    prefix = install(site, client)
    run = site.root / "run"
    run.mkdir(exist_ok=True)
    srv, got = _fake_server(run / "hooks.sock", None)
    try:
        prolog = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(610)))
    finally:
        srv.close()
    assert prolog.returncode == EXIT_INTERNAL
    assert prolog.stderr.strip() == ("gpuslurm prolog: the hook server took the request but gave no "
                                     "exit code; failing closed")
    assert got[1:] == [hookclient.GO]
    assert hookclient.parse_request(got[0])[0] == "prolog"
    # The server may have done part of the work; the hook does not do it again here.
    assert not (site.jobs_dir / f"{jid}.json").exists()


@pytest.mark.parametrize("answer", [b"rc 300", b"rc -1", b"rc 1x", b"", b"rc"])
def test_an_answer_that_is_not_an_exit_code_fails_closed(site: HookSite, answer: bytes, client: str) -> None:
    prefix = install(site, client)
    run = site.root / "run"
    run.mkdir(exist_ok=True)
    srv, _ = _fake_server(run / "hooks.sock", answer)
    try:
        prolog = site.run_installed(prefix, "prolog", site.slurm_environ(job(611)))
    finally:
        srv.close()
    assert prolog.returncode == EXIT_INTERNAL, prolog.stderr


@pytest.mark.parametrize("ready", [None, b"busy", b"ready?", b""])
def test_a_server_that_does_not_say_ready_leaves_the_hook_to_run_here(site: HookSite, client: str,
                                                                     ready: bytes | None) -> None:
    """Closed before READY, or something else said: the client never says GO (so nothing runs
    there) and runs the hook itself."""
    prefix = install(site, client)
    run = site.root / "run"
    run.mkdir(exist_ok=True)
    srv, got = _fake_server(run / "hooks.sock", b"rc 0", ready=ready)
    try:
        prolog = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(612)))
    finally:
        srv.close()
    assert prolog.returncode == 0, prolog.stderr
    assert (site.jobs_dir / f"{jid}.json").is_file()
    assert got[:1] and hookclient.GO not in got[1:]


def test_a_server_stopped_with_requests_queued_leaves_them_to_run_on_their_own(site: HookSite,
                                                                             client: str) -> None:
    """A restart during a burst of job starts: the requests queued in the socket are reset with
    the server, before any READY, so each hook runs in its own process; none fails."""
    prefix = install(site, client)
    srv = Server(site.root / "run" / "hooks.sock")
    srv.proc.send_signal(signal.SIGSTOP)
    jobs = [job(620 + i) for i in range(3)]
    try:
        hooks = [subprocess.Popen([str(prefix / "gpuslurm-prolog")], env=site.slurm_environ(j, gpus=str(i)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
                 for i, j in enumerate(jobs)]
        time.sleep(1.0)  # each has connected and sent; the server, stopped, accepted none
        srv.proc.send_signal(signal.SIGTERM)
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    results = [(h.wait(timeout=60), h.stderr.read() if h.stderr else "") for h in hooks]
    assert served(srv.stop()) == 0
    assert [code for code, _ in results] == [0, 0, 0], results
    assert all((site.jobs_dir / f"{j}.json").is_file() for j in jobs)


def test_at_its_cap_the_server_closes_and_the_hook_runs_here(site: HookSite, client: str) -> None:
    """One fork at a time: a root client holds the only one (it connects and sends nothing), and
    the next prolog's connection is closed before READY, so it runs in its own process."""
    prefix = install(site, client)
    srv = Server(site.root / "run" / "hooks.sock", "--max-children", "1")
    try:
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        holder.connect(str(srv.sock))
        time.sleep(0.3)  # accepted and forked: that fork waits for a request (5 s at most)
        prolog = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(613)))
        assert prolog.returncode == 0, prolog.stderr
        assert (site.jobs_dir / f"{jid}.json").is_file()
        holder.close()
    finally:
        last = srv.stop()
    # Every fork the server made, finished or not: the holder's alone, never the prolog's
    finishing = int(last.split("; ")[-1].split()[0])
    assert served(last) + finishing == 1, last


def test_a_request_that_is_not_one_runs_nothing_and_the_server_goes_on(site: HookSite,
                                                                        server: Server) -> None:
    prefix = site.install_hooks()
    for junk in (b"hello", b"gpuslurm-hook/1\0task-prolog\x0022", b"gpuslurm-hook/1\0prolog\x0099"):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        raw.connect(str(server.sock))
        raw.sendmsg([junk], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                              b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2)))])
        raw.settimeout(10)
        assert raw.recv(64) == b""  # closed, unanswered
        raw.close()
    prolog = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(614)))
    assert prolog.returncode == 0 and (site.jobs_dir / f"{jid}.json").is_file()
    assert served(server.stop()) == 4


def test_no_server_means_the_hook_runs_here(site: HookSite, client: str) -> None:
    prefix = install(site, client)
    prolog = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(615)))
    assert prolog.returncode == 0 and prolog.stderr.count("\n") == 1, prolog.stderr
    assert (site.jobs_dir / f"{jid}.json").is_file()


def test_a_server_that_never_takes_the_request_holds_none_of_the_hooks_streams(site: HookSite,
                                                                             client: str) -> None:
    """A wedged server (it listens, never accepts): after 10 s without READY the client runs the
    hook itself, and the hook's output ends when the hook does. slurmd reads a hook's output to its
    end, so streams left in the server's queue would hold every hook to PrologEpilogTimeout."""
    prefix = install(site, client)
    run = site.root / "run"
    run.mkdir(exist_ok=True)
    wedged = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    wedged.bind(str(run / "hooks.sock"))
    wedged.listen(8)
    try:
        hook = subprocess.Popen([str(prefix / "gpuslurm-prolog")], env=site.slurm_environ(jid := job(630)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        _, err = hook.communicate(timeout=40)  # EOF on both streams with the wedged server still there
        assert hook.returncode == 0, err
        assert (site.jobs_dir / f"{jid}.json").is_file()
    finally:
        wedged.close()


def test_a_hook_started_with_a_stream_closed_runs_in_its_own_process(site: HookSite, server: Server,
                                                                      client: str) -> None:
    """slurmd's hook with no stdin: the client's socket would be its fd 0, and the served hook
    would read the socket as stdin; the client runs the hook itself instead."""
    prefix = install(site, client)
    done = subprocess.run([str(prefix / "gpuslurm-prolog")], env=site.slurm_environ(jid := job(631)),
                          capture_output=True, text=True, timeout=60, check=False, cwd="/",
                          preexec_fn=lambda: os.close(0))
    assert done.returncode == 0, done.stderr
    assert (site.jobs_dir / f"{jid}.json").is_file()
    assert served(server.stop()) == 0


# --- where the server listens -------------------------------------------------------------------


def _start(sock: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", "hook-server", "--socket", str(sock)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_server_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o777)
    os.chmod(run, 0o1777)
    done = _start(run / "hooks.sock")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("its directory must be root's and writable by root alone")


def test_the_server_refuses_to_replace_what_is_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "hooks.sock").write_text("keep me")
    done = _start(tmp_path / "hooks.sock")
    assert done.returncode == 2 and "something other than a socket is there" in done.stderr
    assert (tmp_path / "hooks.sock").read_text() == "keep me"


def test_a_second_server_does_not_take_a_live_ones_socket(site: HookSite, server: Server) -> None:
    done = _start(server.sock)
    assert done.returncode == 2 and "another hook server listens there" in done.stderr
    assert server.proc.poll() is None and server.sock.exists()


def test_the_server_removes_its_socket_on_stop_and_replaces_a_stale_one(tmp_path: Path) -> None:
    sock = tmp_path / "hooks.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(sock))
    stale.close()
    srv = Server(sock)
    assert sock.stat().st_mode & 0o777 == 0o600
    srv.stop()
    assert not sock.exists()


# --- the served hook's process, as the hook's own process has it --------------------------------

PROBE = '''
import json, os, signal, subprocess, sys


def probe(argv):
    """What a hook's process is: written as JSON to $PROBE_OUT (the hook's own environment)."""
    sh = subprocess.run(["/bin/sh", "-c", "ls /proc/self/fd; grep -E '^Sig(Ign|Blk)' /proc/self/status"],
                        capture_output=True, text=True, check=True)  # noqa: E501
    state = {
        "argv": sys.argv, "cwd": os.getcwd(), "umask": os.umask(0o22),
        "environ": sorted([k.hex(), v.hex()] for k, v in os.environb.items() if k != b"PROBE_OUT"),
        "signals": {str(int(s)): str(signal.getsignal(s)) for s in signal.valid_signals()
                    if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "a command's fds and signals": sh.stdout.split(),
        "stdio": [os.readlink(f"/proc/self/fd/{fd}").split(":")[0] for fd in (0, 1, 2)],
    }
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(state, out)
    return 0
'''

PROBE_SERVER = '''
import signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import probe
import gpuslurm.slurm.entry as entry
entry.main = probe.probe  # the hook the fork runs, and nothing else changed
from gpuslurm.slurm.hookserver import serve
# A server started by hand from a shell with `&` or nohup: signals ignored that the hook must not inherit
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
sys.exit(serve(Path(sys.argv[1]), lambda line: print(line, file=sys.stderr, flush=True)))
'''


def test_a_served_hooks_process_is_the_hooks_own(tmp_path: Path) -> None:
    """The same probe run as the hook (its own process, as slurmd starts it) and served by a
    server started with signals ignored and blocked: the same argv, umask, environment (bytes
    that are not UTF-8 included, nothing of the server's), signal dispositions and mask, and what
    a command it runs inherits (descriptors, signals); its streams are the client's."""
    (tmp_path / "probe.py").write_text(PROBE)
    sock = tmp_path / "hooks.sock"
    server = subprocess.Popen([sys.executable, "-c", PROBE_SERVER, str(sock), str(tmp_path)],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "SERVER_ONLY": "x"})
    assert server.stderr is not None and "serving" in server.stderr.readline()
    env = {"SLURM_JOB_ID": "7", "ODD": "caf\udce9", "EMPTY": "", "SPACES": " a = b ",
           "PYTHONPATH": f"{tmp_path}:{SRC}"}
    got = {}
    try:
        for how, code in (("own", "import sys, probe; sys.exit(probe.probe(sys.argv[1:]))"),
                          ("served", CLIENT)):
            out = tmp_path / f"{how}.json"
            start = f"import sys; sys.path[:0] = {[str(tmp_path), SRC]!r}; "
            done = subprocess.run([sys.executable, "-I", "-c", start + code, "prolog"],
                                  env={**env, "PROBE_OUT": str(out), hookclient.SOCKET_VAR: str(sock)},
                                  umask=0o027, cwd="/", capture_output=True, text=True, timeout=60,
                                  check=False)
            assert done.returncode == 0, done.stderr
            got[how] = json.loads(out.read_text())
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "stopped after 1 hook(s)" in err  # the second run was served
    for key in got["own"]:
        assert got["served"][key] == got["own"][key], (key, got["served"][key], got["own"][key])
    assert got["own"]["umask"] == 0o027 and got["own"]["argv"] == ["-c", "prolog"]
