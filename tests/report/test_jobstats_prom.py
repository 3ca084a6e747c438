"""``gpuslurm jobstats JOBID --source prometheus:URL`` for a job that spanned two nodes: a real
Prometheus holding two node monitors' exporter samples (backfilled with promtool), read per node
and per GPU, energy checked against a hand-computed integral; who sees which job, as the real
user ``nobody`` (their own job, not another user's) and as an admin group's member; and any
answer a forged exporter's series make (a stand-in server with Prometheus' API shape): figures or
one line.
"""

from __future__ import annotations

import grp
import json
import os
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from tests.helpers.cluster_fixture import users_site
from tests.helpers.jobstats_helpers import JOBSTATS_AS_USER
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled
from tests.helpers.prom_helpers import free_port

from gpuslurm.cli.main import main
from gpuslurm.config import parse_config
from gpuslurm.errors import EXIT_BAD_INPUT, InputError
from gpuslurm.report.jobstats import J_PER_KWH, table, to_json
from gpuslurm.report.jobstats_load import prometheus_stats
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample

pytestmark = pytest.mark.skipif(not (os.path.exists(PROMETHEUS) and os.path.exists(PROMTOOL)),
                                reason="needs Debian's prometheus package")

T0 = 1_699_999_200.0 + 7
EVERY = 10.0
END = T0 + 3000  # job 42's last cycle on both nodes
NOW = T0 + 3600
NOBODY = 65534
A0, A1 = "GPU-a0000000-0000-0000-0000-000000000000", "GPU-a1000000-0000-0000-0000-000000000000"
B0, B1 = "GPU-b0000000-0000-0000-0000-000000000000", "GPU-b1000000-0000-0000-0000-000000000000"
# util %, power W: A0 idle at 60 W, A1 at 50 % and 200 W, B0 at 80 % and 300 W
LOAD = {A0: (0.0, 60.0), A1: (50.0, 200.0), B0: (80.0, 300.0), B1: (90.0, 400.0)}


def cycles() -> Iterator[Cycle]:
    j42_n1 = Allocation("42", "nobody", NOBODY, (A0, A1), T0, "phys")
    j42_n2 = Allocation("42", "nobody", NOBODY, (B0,), T0 + 60, "phys")  # started a minute later there
    j44 = Allocation("44", "daemon", 1, (A1,), T0 + 1000)  # shares A1 for a while
    j43 = Allocation("43", "daemon", 1, (B1,), T0)
    j45_n1 = Allocation("45", "nobody", NOBODY, (), T0)  # a forged exporter names another owner
    j45_n2 = Allocation("45", "root", 0, (), T0)
    for i in range(361):
        ts = T0 + EVERY * i
        for node, gpus, allocs in (
                ("n1", (A0, A1), [j42_n1, j45_n1] + ([j44] if T0 + 1000 <= ts <= T0 + 1500 else [])),
                ("n2", (B0, B1), [j42_n2, j43, j45_n2])):
            held = [a for a in allocs if a.start <= ts <= END]
            samples = tuple(GpuSample(ts, g, util_pct=LOAD[g][0], mem_used_mib=2048.0, mem_total_mib=81559.0,
                                      power_w=LOAD[g][1]) for g in gpus)
            procs = tuple(ProcSample(ts, g, 4200 + n, name="train.py", uid=a.uid, user=a.user,
                                     job_id=a.job_id, mem_mib=2048.0, sm_util_pct=LOAD[g][0])
                          for n, (a, g) in enumerate((a, g) for a in held for g in a.uuids))
            yield Cycle(ts, node, samples, procs, tuple(held))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backfilled(tmp_path_factory.mktemp("jobstats-prom"), ((c, ()) for c in cycles())) as url:
        yield url


def test_a_job_on_two_nodes_reads_per_node_and_per_gpu_with_the_power_s_integral(prom: str) -> None:
    doc = to_json(prometheus_stats(parse_config(""), "42", f"prometheus:{prom}", now=NOW, caller_uid=0,
                                   caller_gids=[0]))
    assert doc["node"] == "n1,n2" and doc["job"]["source"] == "prometheus"
    assert (doc["job"]["user"], doc["job"]["uid"], doc["job"]["account"]) == ("nobody", NOBODY, "phys")
    assert (doc["job"]["start"], doc["job"]["last_seen"], doc["job"]["running"]) == (T0, END, False)
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert {u: g["node"] for u, g in gpus.items()} == {A0: "n1", A1: "n1", B0: "n2"}
    # by hand: each node's scrapes from the job's start there to its end, trapezoids of constant power
    assert gpus[A0]["energy_j"] == pytest.approx(60.0 * 3000)
    assert gpus[A1]["energy_j"] == pytest.approx(200.0 * 3000)
    assert gpus[B0]["energy_j"] == pytest.approx(300.0 * 2940)
    assert doc["energy_j"] == pytest.approx(60.0 * 3000 + 200.0 * 3000 + 300.0 * 2940)
    assert all(g["energy_source"] == "power" for g in gpus.values())
    assert gpus[B0]["samples"] == 295 and gpus[B0]["util_mean_pct"] == pytest.approx(80.0)
    assert gpus[A1]["shared_with"] == ["44"] and gpus[A0]["shared_with"] == []
    assert {(p["device"], p["name"]) for p in doc["processes"]} == {(A0, "train.py"), (A1, "train.py"),
                                                                   (B0, "train.py")}
    assert doc["verdict"] == "idle GPUs" and A0 in doc["notes"][0]["text"]
    text = "\n".join(table(doc))
    assert f"On n1: {(60.0 + 200.0) * 3000 / J_PER_KWH:.3f} kWh" in text
    assert f"On n2: {300.0 * 2940 / J_PER_KWH:.3f} kWh" in text
    assert text.index("On n1:") < text.index(A0[:21]) < text.index("On n2:") < text.index(B0[:21])


def test_a_job_whose_nodes_name_different_owners_is_one_line(prom: str) -> None:
    with pytest.raises(InputError, match="its nodes' series name different users"):
        prometheus_stats(parse_config(""), "45", f"prometheus:{prom}", now=NOW, caller_uid=0, caller_gids=[0])


def test_an_admin_group_sees_another_user_s_job(prom: str) -> None:
    cfg = parse_config('[jobstats]\nadmin_groups = ["daemon"]\n')
    gid = grp.getgrnam("daemon").gr_gid
    st = prometheus_stats(cfg, "43", f"prometheus:{prom}", now=NOW, caller_uid=NOBODY, caller_gids=[gid])
    assert [g.uuid for g in st.gpus] == [B1]
    with pytest.raises(InputError, match="not in Prometheus' series, or not yours"):
        prometheus_stats(cfg, "43", f"prometheus:{prom}", now=NOW, caller_uid=NOBODY, caller_gids=[NOBODY])


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as the real user nobody")
def test_nobody_reads_their_own_job_and_not_another_user_s(prom: str) -> None:
    with users_site("gpuslurm-jobstats-prom-") as base:
        (base / "gpuslurm.toml").write_text("")
        (base / "gpuslurm.toml").chmod(0o644)

        def as_nobody(job: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(base / "users-venv" / "bin" / "python"), "-c", JOBSTATS_AS_USER, job,
                                   str(NOW), f"prometheus:{prom}"],
                                  user=NOBODY, group=NOBODY, extra_groups=[],
                                  timeout=120, cwd="/", capture_output=True, text=True, check=False,
                                  env={"PATH": "/usr/bin:/bin",
                                       "GPUSLURM_CONFIG": str(base / "gpuslurm.toml")})

        mine = as_nobody("42")
        assert mine.returncode == 0, mine.stderr
        assert json.loads(mine.stdout)["job"]["uid"] == NOBODY
        theirs, never = as_nobody("43"), as_nobody("99")
        assert theirs.returncode == never.returncode == EXIT_BAD_INPUT
        assert theirs.stderr == "job 43: not in Prometheus' series, or not yours\n"
        assert never.stderr.replace("99", "43") == theirs.stderr  # nothing tells the two apart


@pytest.mark.parametrize(("args", "says"), [
    (["--source", "prometheus:ftp://prom:9090"], "not an http(s) URL"),
    (["--source", "prometheus:http://127.0.0.1:9", "--db", "/x"], "--db and --source name two places"),
    (["--source", "prometheus:http://127.0.0.1:{port}"], "unreachable"),
])
def test_a_bad_source_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], args: list[str],
                                              says: str) -> None:
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("GPUSLURM_CONFIG", str(tmp_path / "none.toml"))
    port = str(free_port())
    capsys.readouterr()
    assert main(["jobstats", "42", *[a.replace("{port}", port) for a in args]]) == EXIT_BAD_INPUT
    out = capsys.readouterr()
    assert out.out == "" and says in out.err and out.err.count("\n") == 1, out.err


class _Answers(BaseHTTPRequestHandler):
    """Prometheus' HTTP API shape with whatever the test puts in ``answer``."""

    answer: Callable[[str], Any] = staticmethod(lambda query: {})

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
        body = json.dumps(type(self).answer(query)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def answering() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"prometheus:http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly what an exporter writes, sometimes anything: so examples reach the figures too."""
    return st.integers(0, 9).flatmap(lambda i: odd if i == 0 else usual)


_odd_text = st.one_of(st.text(max_size=12), st.sampled_from(["", "GPU-x\u202e", "MIG-1/2", "²", "-1"]))
_value = _mostly(st.floats(min_value=0, max_value=1).map(repr),
                 st.one_of(st.floats().map(repr), st.integers().map(str),
                           st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "x", "", "2e12"])))
_stamp = _mostly(st.floats(min_value=T0, max_value=T0 + 3000),
                 st.one_of(st.floats(allow_nan=False), st.integers(-(2**63), 2**63)))
_labels = st.fixed_dictionaries({
    "node": _mostly(st.sampled_from(["n1", "n2"]), _odd_text),
    "gpu_uuid": _mostly(st.sampled_from([A0, A1, B0]), _odd_text),
    "mig_uuid": _mostly(st.just(""), _odd_text),
    "user": _mostly(st.just("nobody"), _odd_text),
    "pid": _mostly(st.integers(1, 99999).map(str), _odd_text),
}, optional={k: _odd_text for k in ("account", "job_id", "process")})
_time = _mostly(st.floats(min_value=T0, max_value=T0 + 3000).map(repr), _value)


def _vectors(value: st.SearchStrategy[str], least: int = 0) -> st.SearchStrategy[list[Any]]:
    return st.lists(st.fixed_dictionaries({"metric": _labels, "value": st.tuples(_stamp, value).map(list)}),
                    min_size=least, max_size=4)
_matrices = st.lists(st.fixed_dictionaries({"metric": _labels, "values": st.lists(
    st.tuples(_stamp, _value).map(list), max_size=6)}), max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_vectors(_time, 1), _vectors(_time), _vectors(st.just("1")), _matrices, _matrices)
@example([{"metric": {"node": "n1", "user": "nobody"}, "value": [T0, repr(T0 + 60)]}], [], [], [],
         # a pid label of a Unicode digit: str.isdigit says yes, int() refuses it
         [{"metric": {"node": "n1", "gpu_uuid": A0, "pid": "\u00b2"}, "values": [[T0, "1"]]}])
def test_any_answer_is_figures_or_one_line(answering: str, seen: list[Any], starts: list[Any],
                                           held: list[Any], gauges: list[Any], procs: list[Any]) -> None:
    # a forged exporter's labels and values, any timestamps: the job's figures and table, or one
    # line (exit 2), never a traceback
    def answer(query: str) -> Any:
        if "[" in query and not query.startswith(("max", "min", "last")):
            kind, result = "matrix", procs if "process" in query else gauges
        else:
            kind = "vector"
            result = seen if "last_seen" in query else starts if "start" in query else held
        return {"status": "success", "data": {"resultType": kind, "result": result}}

    _Answers.answer = staticmethod(answer)
    try:
        st_ = prometheus_stats(parse_config(""), "42", answering, now=NOW, caller_uid=0, caller_gids=[0])
    except InputError as exc:
        event(f"one line: {str(exc).split(': ')[1][:30]}")
        assert "\n" not in str(exc) and exc.exit_code == EXIT_BAD_INPUT
        return
    event(f"figures, {len(st_.gpus)} GPU(s), {len(st_.job.processes)} process(es)")
    for line in table(to_json(st_)):
        assert line.isprintable()
