"""The live view's pure core: fixed snapshots in, lines out (marks, widths, lost GPUs, JSON)."""

from __future__ import annotations

import json

import pytest

from gpuslurm.hw.source import load_node
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, ScanProblem, Violation
from gpuslurm.watch.view import build_snapshot, plain, render, snapshot_dict, styled

NODE = load_node("dgx-h100")
U = [g.uuid for g in sorted(NODE.gpus, key=lambda g: g.index)]
T = 1_700_000_000.0


def cycle(*, lost: bool = False) -> Cycle:
    gpus = [GpuSample(T, U[i], None, util, mem, 81559.0, 72.0 + 6 * util, 31.0 + util / 3)
            for i, (util, mem) in enumerate([(93.0, 64000.0), (91.0, 64000.0), (0.0, 0.0), (1.0, 9000.0),
                                              (1.5, 9000.0), (0.0, 0.0), (35.0, 22000.0), (88.0, 30000.0)])]
    problems: tuple[ScanProblem, ...] = ()
    if lost:
        gpus = [g for g in gpus if g.gpu_uuid != U[5]]
        problems = (ScanProblem(T, "gpu-lost", U[5], "fell off the bus"),)
    procs = (
        ProcSample(T, U[0], 10010, None, "torchrun", 2001, "alice", "1001", 63000.0, 93.0, T - 7200),
        ProcSample(T, U[1], 10011, None, "torchrun", 2001, "alice", "1001", 63000.0, 91.0, T - 7200),
        ProcSample(T, U[3], 10030, None, "jupyter-lab", 2003, "carol", "1003", 9000.0, 1.0, T - 5000),
        # in no job at all: an ssh login running python
        ProcSample(T, U[7], 48211, None, "python", 2004, "dave", None, 30000.0, 88.0, T - 600),
        # in a job, but on a GPU the job was not given
        ProcSample(T, U[6], 10050, None, "python", 2002, "bob", "1002", 2000.0, 5.0, T - 60),
    )
    allocs = (
        Allocation("1001", "alice", 2001, (U[0], U[1]), T - 7300),
        Allocation("1002", "bob", 2002, (U[2],), T - 100, account="nlp"),
        Allocation("1003", "carol", 2003, (U[3], U[4]), T - 5100),
    )
    return Cycle(T, "dgx-h100-01", tuple(gpus), procs, allocs, problems)


IDLE = Violation("idle", "dgx-h100-01", "carol", "1003", 10030, "jupyter-lab", U[3], T - 3000, 3000.0,
                 f"job 1003 of carol holds {U[3]} at 1.0 % on average over the last 30 min (idle at or "
                 "below 5 %); jupyter-lab (PID 10030, job 1003) is on it")
ROGUE = Violation("rogue", "dgx-h100-01", "dave", None, 48211, "python", U[7], T - 600, 600.0,
                  f"python (PID 48211) of dave on {U[7]}, but it is in no job (seen for 10 min)",
                  "critical")


def snapshot(**kw: object) -> object:
    return build_snapshot(NODE, cycle(**kw), [IDLE, ROGUE],  # type: ignore[arg-type]
                          source="replay of builtin:dgx-h100", findings="monitor store")


def texts(width: int = 80, **kw: object) -> list[str]:
    return [line.text for line in render(snapshot(**kw), width)]  # type: ignore[arg-type]


def row(lines: list[str], *needles: str) -> str:
    """The one table row holding every needle (the violations' sentences below are not rows)."""
    end = next((i for i, line in enumerate(lines) if line.startswith("VIOLATIONS")), len(lines))
    found = [line for line in lines[:end] if all(n in line for n in needles)]
    assert len(found) == 1, (needles, found)
    return found[0]


@pytest.mark.parametrize("width", [40, 60, 80, 132])
def test_every_line_fits_the_width(width: int) -> None:
    lines = texts(width, lost=True)
    assert lines and all(len(line) <= width for line in lines), [x for x in lines if len(x) > width]


def test_processes_are_shown_with_their_job_and_the_rogue_ones_marked() -> None:
    lines = texts()
    outside = row(lines, "48211")
    assert "dave" in outside and "python" in outside and outside.rstrip().endswith("ROGUE")
    # rogue by the detector's rule too: job 1002 was given GPU 2, its process is on GPU 6
    wrong_gpu = row(lines, "10050")
    assert wrong_gpu.split()[0] == "6" and "1002" in wrong_gpu and "ROGUE" in wrong_gpu
    for pid in ("10010", "10011", "10030"):
        assert "ROGUE" not in row(lines, pid)
    assert "29.3 GiB" in outside and "88%" in outside  # memory and SM of the process


def test_an_idle_job_is_marked_and_busy_ones_are_not() -> None:
    lines = texts()
    carol = row(lines, "1003", "carol", "3,4")
    assert carol.rstrip().endswith("IDLE") and "1%" in carol
    alice = row(lines, "1001", "alice", "0,1")
    assert "IDLE" not in alice and "92%" in alice  # the mean of its two GPUs
    bob = row(lines, "1002", "bob", "nlp")
    assert "IDLE" not in bob


def test_gpu_rows_carry_figures_health_and_the_jobs_holding_them() -> None:
    lines = texts()
    gpu0 = next(line for line in lines if line.startswith("   0 H100 80GB… 1B:00.0 "))
    assert "93%" in gpu0 and "62.5/79.6 GiB" in gpu0 and "62C" in gpu0 and "630W" in gpu0
    assert gpu0.split()[-2:] == ["1001", "alice"] and " ok " in gpu0
    gpu7 = next(line for line in lines if line.startswith("   7 "))
    assert gpu7.rstrip().endswith("-")  # nobody was given it


def test_violations_are_listed_in_full_worst_first() -> None:
    lines = texts()
    start = lines.index("VIOLATIONS (2)")
    body = " ".join(line.strip() for line in lines[start + 1:])
    assert body.index("ROGUE for 10 min") < body.index("IDLE for 50 min")
    assert "it is in no job" in body and "idle at or below 5 %" in body


def test_a_lost_gpu_stays_in_the_table_with_its_health() -> None:
    snap = snapshot(lost=True)
    lines = [line.text for line in render(snap, 80)]  # type: ignore[arg-type]
    gpu5 = next(line for line in lines if line.startswith("   5 "))
    assert "lost" in gpu5 and "n/a" in gpu5
    assert "HEALTH" in lines and any("GPU 5" in line and "GPU is lost" in line for line in lines)
    assert any(line.startswith("  gpu-lost:") for line in lines)
    styles = {line.text: line.style for line in render(snap, 80)}  # type: ignore[arg-type]
    assert styles[gpu5] == "bad"


def test_health_faults_reach_the_row() -> None:
    snap = build_snapshot(NODE, cycle(), [], faults={U[2]: ["Xid 79", "temperature 97 C over limit 85 C"]})
    lines = [line.text for line in render(snap, 80)]
    gpu2 = next(line for line in lines if line.startswith("   2 "))
    assert "Xid 79" in gpu2
    assert any("temperature 97 C" in line for line in lines)


def test_an_empty_node_says_so() -> None:
    empty = Cycle(T, "n1", tuple(GpuSample(T, u, None, 0.0) for u in U), (), ())
    text = plain(render(build_snapshot(NODE, empty, []), 80))
    assert "no jobs hold a GPU" in text and "no process holds a GPU" in text and "VIOLATIONS" not in text
    assert text.splitlines()[0].startswith("n1 ") and "0 violations" in text.splitlines()[0]


def test_mig_devices_get_their_own_labels() -> None:
    node = load_node("a100-mig")
    gpu = next(g for g in node.gpus if g.mig_devices)
    mig = gpu.mig_devices[1]
    assert mig.uuid is not None
    c = Cycle(T, "m", (GpuSample(T, gpu.uuid, mig.uuid, None, 100.0, float(mig.memory_mib)),),
              (ProcSample(T, gpu.uuid, 7, mig.uuid, "python", 0, "root", "5", 100.0),),
              (Allocation("5", "root", 0, (mig.uuid,), T),))
    lines = [line.text for line in render(build_snapshot(node, c, []), 80)]
    label = f"{gpu.index}.{mig.index}"
    assert any(line.split()[:1] == [label] for line in lines)
    assert "ROGUE" not in row(lines, "python")  # on its own job's MIG device


def test_styles_colour_without_changing_the_text() -> None:
    lines = render(snapshot(), 80)  # type: ignore[arg-type]
    rogue = next(line for line in lines if "48211" in line.text)
    assert rogue.style == "bad" and styled(rogue) == f"\x1b[31;1m{rogue.text}\x1b[0m"
    idle = next(line for line in lines if "IDLE" in line.text and "carol" in line.text)
    assert idle.style == "warn"


def test_json_has_every_part_and_round_trips() -> None:
    data = json.loads(json.dumps(snapshot_dict(snapshot())))  # type: ignore[arg-type]
    assert [g["label"] for g in data["gpus"]] == [str(i) for i in range(8)]
    rogue = next(p for p in data["processes"] if p["pid"] == 48211)
    assert rogue["marks"] == ["rogue"] and rogue["why"] == "it is in no job" and rogue["job_id"] is None
    carol = next(j for j in data["jobs"] if j["job_id"] == "1003")
    assert carol["marks"] == ["idle"] and carol["gpus"] == ["3", "4"]
    assert {v["kind"] for v in data["violations"]} == {"rogue", "idle"}


def test_a_process_name_with_terminal_escapes_is_plain_text_on_every_viewer_s_terminal() -> None:
    """Any user names their process (prctl PR_SET_NAME: any byte but NUL) and the node's view
    shows it to every user and admin who runs ``gpuslurm status``/``watch`` there: no escape
    sequence (clear, retitle, OSC 52 clipboard) or line break of theirs reaches a terminal."""
    hostile = "\x1b]52;c;cm0K\x07\x1b[2J\rok\nx"
    c = cycle()
    procs = tuple(p._replace(name=hostile) if p.pid == 48211 else p for p in c.procs)
    rogue = ROGUE._replace(process=hostile, evidence=f"{hostile} (PID 48211) of dave, in no job")
    snap = build_snapshot(NODE, c._replace(procs=procs), [rogue],  # type: ignore[arg-type]
                          source="replay of builtin:dgx-h100", findings="monitor store")
    lines = render(snap, 132)  # type: ignore[arg-type]
    assert any("48211" in line.text for line in lines)
    assert all(line.text.isprintable() for line in lines)
    assert plain(lines).count("\n") == len(lines)
