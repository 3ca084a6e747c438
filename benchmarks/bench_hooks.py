#!/usr/bin/env python3
"""Time `gpuslurm prolog` and `gpuslurm epilog` as whole processes against `python -c pass`.

The hooks run the way slurmd runs the installed executables: the prolog/ and epilog/ templates
rendered by `gpuslurm install` (``/bin/sh`` exec'ing ``python -I -c`` with the hooks' own entry
point, ``gpuslurm.slurm.entry``), with no PATH and a job environment (SLURM_JOB_ID, SLURM_JOB_UID,
SLURM_JOB_USER, SLURM_JOB_GPUS, ...), on the replayed 8-GPU node (GPUSLURM_CAPTURE=dgx-h100). The
config puts run_dir in a temporary directory on a tmpfs (/dev/shm; /run is one on a real node)
and state_dir in one on disk, and points slurm_cgroup_conf at a cgroup.conf with ConstrainDevices=yes
(what `gpuslurm install` asks admins to set), so cgroup devices stays at its default "auto" and
MPS is not requested by the job: the hooks do whatever they do for a plain GPU job.

Each round runs the floor, the prolog, the task prolog (once, as local task 1, as root, which
reads any job's task file) and the epilog of a fresh job id, interleaved so that machine noise
hits them alike. Prints median and p90 of each, the ratios, and whether the
target "prolog median <= 3 x floor median" is met. --profile adds where the prolog's time goes
(`-X importtime`, cProfile). No assertion on time: the figures are for people to read.

The first prolog and epilog (not timed) fill the hooks' caches in run_dir (the parsed config and
the replayed node, see gpuslurm.hooks.cache), as the first job on a node does.

--server also runs the prolog and the epilog through the hook server (`gpuslurm hook-server`, see
docs/hooks.md), interleaved with the rest: the same installed executables, told where the server
listens. Their CPU is the client's (this process's children) plus the server's fork, which the
server reaps: one server for the prologs and one for the epilogs, each asked on SIGTERM for what
its forks cost, give each hook's mean fork CPU (the figure printed is client median + fork mean).
With --c-client the served prolog and epilog start the C client `gpuslurm install --c-client`
builds (with /usr/bin/cc), as that install writes them.

--site-file also writes the config to the default path, /etc/gpuslurm/gpuslurm.toml, for the run
(refused when a file is there; removed afterwards), as a site installs it: the task prolog's
cgroup v1 join reads the site's file there whatever $GPUSLURM_CONFIG says.

    python benchmarks/bench_hooks.py [--runs 30] [--gpus 0,1,2,3] [--clean-venv] [--profile]
        [--site-file] [--server [--c-client]]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 3.0
SITE_FILE = "/etc/gpuslurm/gpuslurm.toml"  # gpuslurm.configfile.DEFAULT_PATH
SOCKET_VAR = "GPUSLURM_HOOK_SOCKET"  # gpuslurm.slurm.hookclient.SOCKET_VAR
# What the installed hooks run (see prolog/gpuslurm-prolog), for the profiles
ENTRY = "from gpuslurm.slurm.entry import run; run()"


def hook_scripts(dest: Path, python: str, with_site: bool = False) -> dict[str, Path]:
    """The installed prolog, task prolog and epilog executables, rendered into ``dest``;
    ``with_site``: started as before issue 22 (``python -I``, ``site`` and its ``.pth`` files run,
    no sys.path written), to compare."""
    from gpuslurm.install import SYS_PATH_PLACEHOLDER, hook_sys_path, render_hook

    sys_path = hook_sys_path(python)
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for hook, template in (("prolog", ROOT / "prolog" / "gpuslurm-prolog"),
                           ("task-prolog", ROOT / "prolog" / "gpuslurm-task-prolog"),
                           ("epilog", ROOT / "epilog" / "gpuslurm-epilog")):
        path = dest / template.name
        text = template.read_text()
        if with_site:
            started = f" -S -c 'import sys; sys.path += {SYS_PATH_PLACEHOLDER}; "
            if started not in text:
                raise SystemExit(f"{template}: no -S start to replace")
            text = text.replace(started, " -c '")
        path.write_text(render_hook(text, python, str(template), sys_path=sys_path))
        path.chmod(0o755)
        out[hook] = path
    return out


def write_config(dest: Path, run_dir: Path) -> Path:
    cgroup_conf = dest / "cgroup.conf"
    cgroup_conf.write_text("ConstrainDevices=yes\n")
    config = dest / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{run_dir}"\nstate_dir = "{dest / "state"}"\n'
                      f'slurm_cgroup_conf = "{cgroup_conf}"\n')
    return config


def job_env(config: Path, bundle: str, gpus: str, job_id: int, context: str) -> dict[str, str]:
    """slurmd's environment for a hook: no PATH, the job's identity and GPUs."""
    return {
        "GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": bundle,
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "alice",
        "SLURM_JOB_GID": "1000", "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus,
        "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "bench",
        "SLURMD_NODENAME": "dgx-h100-01", "SLURM_SCRIPT_CONTEXT": context,
    }


CPU: list[float] = []  # the CPU time (user + sys) of each run timed() made, in order


def timed(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall time of one run (its CPU time appended to CPU); a failing run stops the benchmark with
    its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, check=False, timeout=120)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return elapsed


def p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def clean_venv(dest: Path, python: str) -> str:
    """A venv whose startup runs no ``.pth`` hooks but imports the packages ``python`` has.

    The parent's site-packages and gpuslurm's source folder are plain path lines in one ``.pth``:
    Python adds them to sys.path without processing the ``.pth`` files inside them, so the floor
    is a bare interpreter start, as on a node where gpuslurm has a venv of its own.
    """
    probe = subprocess.run(
        [python, "-c", "import sysconfig, pathlib, gpuslurm; print(sysconfig.get_paths()['purelib']); "
         "print(pathlib.Path(gpuslurm.__file__).resolve().parents[1])"],
        capture_output=True, text=True, check=True, timeout=60)
    venv = dest / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "parent-site.pth").write_text(probe.stdout)
    return str(venv / "bin" / "python")


def profile(python: str, hooks: dict[str, Path], config: Path, bundle: str, gpus: str,
            job_id: int, top: int) -> None:
    """Print the slowest imports and the cProfile top of one prolog run."""
    import pstats

    env = job_env(config, bundle, gpus, job_id, "prolog_slurmd")
    run = subprocess.run([python, "-I", "-X", "importtime", "-c", ENTRY, "prolog"], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    rows = []
    for line in run.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2, m.group(4)))
    total = sum(r[0] for r in rows)
    own = sum(r[0] for r in rows if r[3].startswith("gpuslurm"))
    print(f"\nimports (-X importtime): {len(rows)} modules, {total / 1000:.1f} ms in total, "
          f"{own / 1000:.1f} ms in gpuslurm.* itself")
    print(f"  slowest imports by cumulative time, at most two levels deep (top {top}):")
    for self_us, cum_us, depth, name in sorted((r for r in rows if r[2] <= 1), key=lambda r: -r[1])[:top]:
        print(f"    {cum_us / 1000:7.2f} ms cumulative {self_us / 1000:6.2f} ms self  "
              f"{'  ' * depth}{name}")
    timed([str(hooks["epilog"])], job_env(config, bundle, gpus, job_id, "epilog_slurmd"))

    out = config.parent / "prolog.prof"
    env = job_env(config, bundle, gpus, job_id + 1, "prolog_slurmd")
    # main(), not run(): run() leaves through os._exit, before cProfile writes its file
    script = config.parent / "prolog_main.py"
    script.write_text("import sys\nfrom gpuslurm.slurm.entry import main\nsys.exit(main())\n")
    subprocess.run([python, "-I", "-m", "cProfile", "-o", str(out), str(script), "prolog"],
                   env=env, capture_output=True, check=True, timeout=120)
    timed([str(hooks["epilog"])], job_env(config, bundle, gpus, job_id + 1, "epilog_slurmd"))
    stats = pstats.Stats(str(out))
    entries = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table here
    total_s = max(ct for _, _, _, ct, _ in entries.values())
    print(f"\ncProfile of one prolog ({total_s * 1000:.1f} ms under the profiler); gpuslurm "
          f"functions by cumulative time, imports they trigger included (top {top}):")
    ours = [(ct, tt, nc, key) for key, (_, nc, tt, ct, _) in entries.items() if "/gpuslurm/" in key[0]]
    for ct, tt, nc, (file, line, func) in sorted(ours, reverse=True)[:top]:
        short = file[file.rindex("/gpuslurm/") + 1:]
        print(f"    {ct * 1000:7.2f} ms cum {tt * 1000:6.2f} ms own {nc:5d} calls  {short}:{line} {func}")
    print(f"  all functions by own time (top {top}):")
    for ct, tt, nc, (file, line, func) in sorted(
            ((ct, tt, nc, key) for key, (_, nc, tt, ct, _) in entries.items()), key=lambda r: -r[1])[:top]:
        print(f"    {tt * 1000:7.2f} ms own {ct * 1000:7.2f} ms cum {nc:5d} calls  "
              f"{Path(file).name}:{line} {func}")


def c_client_hooks(dest: Path, python: str) -> dict[str, Path]:
    """The prolog and the epilog as `gpuslurm install --c-client` writes them: the C client built
    with the node's cc, the Python hook as its fallback."""
    from gpuslurm.install import C_CLIENT, build_c_client, hook_sys_path, render_hook

    dest.mkdir(parents=True, exist_ok=True)
    client = dest / C_CLIENT
    client.write_bytes(build_c_client())
    client.chmod(0o755)
    out = {}
    sys_path = hook_sys_path(python)
    for hook, template in (("prolog", ROOT / "prolog" / "gpuslurm-prolog"),
                           ("epilog", ROOT / "epilog" / "gpuslurm-epilog")):
        path = dest / template.name
        path.write_text(render_hook(template.read_text(), python, str(template), sys_path=sys_path,
                                    client=(str(client), hook)))
        path.chmod(0o755)
        out[hook] = path
    return out


def start_servers(python: str, where: Path) -> dict[str, tuple[subprocess.Popen[str], Path]]:
    """One hook server for the prologs and one for the epilogs, sockets in ``where`` (root's)."""
    servers = {}
    for hook in ("prolog", "epilog"):
        sock = where / f"{hook}.sock"
        proc = subprocess.Popen([python, "-m", "gpuslurm", "hook-server", "--socket", str(sock)],
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        line = proc.stderr.readline()
        if "serving" not in line:
            raise SystemExit(f"gpuslurm hook-server did not start: {line}{proc.stderr.read()}")
        servers[hook] = (proc, sock)
    return servers


def stop_server(proc: subprocess.Popen[str]) -> float:
    """SIGTERM; the mean CPU seconds of the hooks the server's forks ran (from its last line)."""
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    match = re.search(r"stopped after (\d+) hook\(s\), ([\d.]+) s of CPU", err)
    if not match or not int(match.group(1)):
        raise SystemExit(f"gpuslurm hook-server served nothing: {err}")
    return float(match.group(2)) / int(match.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="rounds of floor+prolog+epilog")
    parser.add_argument("--bundle", default="dgx-h100", help="bundle directory or built-in name")
    parser.add_argument("--gpus", default="0,1,2,3", help="SLURM_JOB_GPUS of the job")
    parser.add_argument("--python", default=sys.executable, help="interpreter the hooks run with")
    parser.add_argument("--clean-venv", action="store_true",
                        help="run everything in a throwaway venv whose start runs no .pth hooks")
    parser.add_argument("--profile", action="store_true", help="also show where the prolog's time goes")
    parser.add_argument("--with-site", action="store_true",
                        help="also time the hooks started as before issue 22 (python -I, with site), "
                             "interleaved")
    parser.add_argument("--top", type=int, default=15, help="rows of each profile to show")
    parser.add_argument("--server", action="store_true",
                        help="also time the prolog and the epilog served by `gpuslurm hook-server`")
    parser.add_argument("--c-client", action="store_true",
                        help="with --server: the served prolog and epilog start the C client "
                             "(`gpuslurm install --c-client`) instead of the Python one")
    parser.add_argument("--site-file", action="store_true",
                        help=f"also put the config at {SITE_FILE} for the run, as a site does")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.site_file and os.path.lexists(SITE_FILE):
        parser.error(f"{SITE_FILE} exists: this run would replace a real site's config")
    made_dir = args.site_file and not os.path.isdir(os.path.dirname(SITE_FILE))
    try:
        return run(args)
    finally:
        if args.site_file:
            Path(SITE_FILE).unlink(missing_ok=True)
        if made_dir and os.path.isdir(os.path.dirname(SITE_FILE)):
            os.rmdir(os.path.dirname(SITE_FILE))


def run(args: argparse.Namespace) -> int:

    # run_dir on a tmpfs, as /run is on a real node (the maps' fsync is free there); state_dir on
    # disk, as /var/lib is (the epilog's summary pays for its fsync).
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="gpuslurm-bench-hooks-") as tmp, \
            tempfile.TemporaryDirectory(prefix="gpuslurm-bench-run-", dir=shm) as run_tmp:
        dest = Path(tmp)
        run_dir = Path(run_tmp) / "run"
        python = clean_venv(dest, args.python) if args.clean_venv else args.python
        hooks = hook_scripts(dest, python)
        arms = {"": hooks, **({" (site)": hook_scripts(dest / "with-site", python, with_site=True)}
                              if args.with_site else {})}
        config = write_config(dest, run_dir)
        if args.site_file:
            os.makedirs(os.path.dirname(SITE_FILE), mode=0o755, exist_ok=True)
            Path(SITE_FILE).write_text(config.read_text())
        servers = start_servers(python, Path(run_tmp)) if args.server else {}
        served_hooks = c_client_hooks(dest / "c-client", python) if args.c_client else hooks
        floor_cmd = [python, "-c", "pass"]
        job = 1000
        # Warm the page cache and .pyc files once; this also fails early on a broken hook.
        timed([str(hooks["prolog"])], job_env(config, args.bundle, args.gpus, job, "prolog_slurmd"))
        timed([str(hooks["epilog"])], job_env(config, args.bundle, args.gpus, job, "epilog_slurmd"))
        names = ["floor"] + [f"{hook}{arm}" for arm in arms for hook in ("prolog", "task-prolog", "epilog")]
        names += [f"{hook} (served)" for hook in servers]
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}

        def run(name: str, argv: list[str], env: dict[str, str]) -> None:
            times[name].append(timed(argv, env))
            cpu[name].append(CPU[-1])

        for _ in range(args.runs):
            run("floor", floor_cmd, dict(os.environ))
            for arm, arm_hooks in arms.items():
                job += 1
                run(f"prolog{arm}", [str(arm_hooks["prolog"])],
                    job_env(config, args.bundle, args.gpus, job, "prolog_slurmd"))
                run(f"task-prolog{arm}", [str(arm_hooks["task-prolog"])],
                    {**job_env(config, args.bundle, args.gpus, job, "task_prolog"), "SLURM_LOCALID": "1"})
                run(f"epilog{arm}", [str(arm_hooks["epilog"])],
                    job_env(config, args.bundle, args.gpus, job, "epilog_slurmd"))
            if servers:
                job += 1
                for hook, (_, sock) in servers.items():
                    env = job_env(config, args.bundle, args.gpus, job, f"{hook}_slurmd")
                    run(f"{hook} (served)", [str(served_hooks[hook])], {**env, SOCKET_VAR: str(sock)})
        forks = {f"{hook} (served)": stop_server(proc) for hook, (proc, _) in servers.items()}
        if leftovers := list((run_dir / "jobs").glob("*.json")):
            raise SystemExit(f"the epilog left job maps behind: {leftovers}")

        med = {k: statistics.median(v) for k, v in times.items()}
        high = {k: p90(v) for k, v in times.items()}
        print(f"bundle {args.bundle}, SLURM_JOB_GPUS={args.gpus}, {args.runs} runs, {python}")
        for key in names:
            label = "python -c pass" if key == "floor" else f"gpuslurm {key}"
            vs = "" if key == "floor" else (f"  ratio {med[key] / med['floor']:5.2f} median, "
                                            f"{high[key] / high['floor']:5.2f} p90")
            fork = f" + fork mean {forks[key] * 1000:.1f} ms" if key in forks else ""
            print(f"{label:28} median {med[key] * 1000:7.1f} ms  p90 {high[key] * 1000:7.1f} ms{vs}"
                  f"  CPU median {statistics.median(cpu[key]) * 1000:6.1f} ms{fork}")
        for arm in arms:
            columns = [cpu[f"{hook}{arm}"] for hook in ("prolog", "task-prolog", "epilog")]
            per_job = statistics.median(sum(v) for v in zip(*columns, strict=True))
            print(f"CPU of the three hooks per job{arm}: median {per_job * 1000:.1f} ms")
        if servers:
            per_job = (statistics.median(cpu["prolog (served)"]) + forks["prolog (served)"]
                       + statistics.median(cpu["task-prolog"])
                       + statistics.median(cpu["epilog (served)"]) + forks["epilog (served)"])
            print(f"CPU of the three hooks per job, prolog and epilog served: {per_job * 1000:.1f} ms "
                  "(sum of medians and fork means; the task prolog is never served)")
        ratio = med["prolog"] / med["floor"]
        verdict = "met" if ratio <= TARGET else "NOT met"
        print(f"target prolog <= {TARGET:g} x floor: {verdict} ({ratio:.2f} x)")
        if args.profile:
            profile(python, hooks, config, args.bundle, args.gpus, job + 1, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
