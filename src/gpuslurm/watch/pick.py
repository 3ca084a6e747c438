"""``gpuslurm pick``'s use case: the node, the job's GPUs, the node's present load, the placement.

The load is read as the monitor reads it (hence watch/): one sample from NVML or a replayed
scenario, each process's owner through :mod:`gpuslurm.hw.live.procfs`, the out-of-service record and
the monitor's store window through state/; :mod:`gpuslurm.place.pick` and the engine decide. The
job's GPUs come from the scheduler adapters, passed in (``job_gpus``: this layer imports none).

Pick runs in front of every job step: modules beyond the light ones are imported where they are
needed (tests/test_tuples.py, benchmarks/bench_pick.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from gpuslurm.errors import GpuslurmError
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # not typing's: see gpuslurm.tuples

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.place.engine import DeviceState, Placement
    from gpuslurm.place.request import Request
    from gpuslurm.samples import Reading
    from gpuslurm.state.out_of_service import OutOfService

    JobGpus = Callable[[Mapping[str, str], Node], tuple[str, ...] | None]


class Wait(NamedTuple):
    """``--wait``: poll every ``poll_s`` seconds, give up after ``timeout_s`` (None: never)."""

    poll_s: float
    timeout_s: float | None = None


class Picked(NamedTuple):
    """What pick found: the node and the placement (``chosen`` None: nothing satisfies, or the
    wait gave up)."""

    node: Node
    placement: Placement


def pick_for_job(req: Request, source: HardwareSource, environ: Mapping[str, str], job_gpus: JobGpus,
                 wait: Wait | None = None, progress: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] | None = None) -> Picked:
    """Choose devices for ``req`` on this node (read from ``source``), among the
    GPUs of the job around the caller when ``environ`` is inside one (``job_gpus``, a scheduler
    adapter's :meth:`~gpuslurm.state.scheduler.Scheduler.job_gpus_from_env`). With ``wait``,
    polls until a set is free, telling ``progress`` each time. InputError for a request the node
    can never meet."""
    from gpuslurm.place.pick import check_request

    bundle = source.bundle
    node = source.node(cache_dir=cache_dir(environ))
    allowed = job_gpus(environ, node)
    check_request(node, req, allowed)
    # compute capability per GPU UUID from NVML or a bundle's nvml.json; the rest: the model table
    cc = source.capabilities() if req.min_cc is not None else None

    def decide() -> Placement:
        from gpuslurm.place.engine import place

        return place(node, req, live_states(node, bundle, environ, time.time(), warn), allowed, cc)

    if wait is None:
        return Picked(node, decide())
    from gpuslurm.place.explain import unsatisfied_line

    started = time.monotonic()
    while True:
        placement = decide()
        if placement.chosen is not None:
            return Picked(node, placement)
        waited = time.monotonic() - started
        if progress is not None:
            progress(f"waiting {waited:.0f}s: {unsatisfied_line(placement, req.n)}")
        if wait.timeout_s is not None and waited + wait.poll_s > wait.timeout_s:
            if wait.timeout_s > waited:
                time.sleep(wait.timeout_s - waited)
                placement = decide()
            return Picked(node, placement)
        time.sleep(wait.poll_s)


def cache_dir(environ: Mapping[str, str]) -> str | None:
    """Where the caller's own cache of parsed bundles lives (``$XDG_CACHE_HOME/gpuslurm``, else
    ``$HOME/.cache/gpuslurm``), or None when neither names an absolute directory.

    Only ever used when it is the caller's and private (:mod:`gpuslurm.hw.replay.bundlecache`): a path
    from the environment cannot make root read or write where a user can.
    """
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = environ.get("HOME", "")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "gpuslurm")


def live_states(node: Node, bundle: str | None, environ: Mapping[str, str], now: float,
                warn: Callable[[str], None] | None = None) -> dict[str, DeviceState]:
    """Per-device load and health: one sample (the scenario, or NVML), less the GPUs out of
    service, with the monitor's window where its store is readable."""
    from gpuslurm.place.pick import out_of_service_states, reading_states, with_window

    states: dict[str, DeviceState] = {}
    if bundle is None or environ.get("GPUSLURM_SCENARIO") or \
            os.path.isfile(os.path.join(bundle, "scenario.json")):
        # without a scenario (hw.formats.scenario's rule) every device is idle with no process: the
        # scenario module and the reading types it needs are not worth loading for that
        from gpuslurm.hw.live.procfs import owner_uid

        me = os.getuid()

        def mine(pid: int) -> bool:  # a process gone, hidden (hidepid) or replayed is not ours
            try:
                return owner_uid(pid) == me
            except OSError:
                return False

        states = reading_states(node, _read_once(node, bundle, environ, now), mine)
    states = out_of_service_states(node, states, _out_of_service(environ, warn))
    from gpuslurm.place.pick import WINDOW_S, window_uuids

    path = store_path(bundle, environ)
    if path is None or not os.access(path, os.R_OK):
        return states  # root-only on a node (/var/lib/gpuslurm): a user's pick scores one sample
    import sqlite3

    from gpuslurm.state.store import Store

    try:
        with Store.open(path, readonly=True) as store:
            stats = store.gpu_stats(window_uuids(node), now - WINDOW_S, now)
    except (GpuslurmError, sqlite3.Error, OSError):
        return states
    return with_window(states, stats)


def _read_once(node: Node, bundle: str | None, environ: Mapping[str, str], now: float) -> Reading:
    if bundle is not None:
        from pathlib import Path

        from gpuslurm.hw.replay.scenario import ScenarioSampler, scenario_path

        return ScenarioSampler(node, scenario_path(Path(bundle), dict(environ))).read(now)
    from gpuslurm.hw.live.nvml_sampler import NvmlSampler

    sampler = NvmlSampler()
    try:
        return sampler.read(now)
    finally:
        sampler.close()


def _out_of_service(environ: Mapping[str, str],
                    warn: Callable[[str], None] | None) -> Mapping[str, OutOfService]:
    """The record of GPUs out of service (``gpuslurm gpu offline``) as this user may read it."""
    from gpuslurm.config import load_config
    from gpuslurm.state.out_of_service import read_shared

    try:
        cfg = load_config(environ=environ)
    except GpuslurmError:
        return {}  # a broken config is the admin's matter, as for the store
    if not os.access(cfg.paths.state_dir, os.X_OK):  # a user, where the state directory is root's
        if os.path.isdir(cfg.paths.state_dir) and warn is not None:
            warn(f"{cfg.paths.state_dir} is not readable by this user: the record of GPUs out of "
                 "service (gpuslurm gpu list) is not consulted")
        return {}
    return read_shared(cfg.paths.state_dir)  # a corrupt record is an error: no GPU trusted blindly


def store_path(bundle: str | None, environ: Mapping[str, str]) -> str | None:
    """The monitor's store to read the load window from: $GPUSLURM_DB, else (live) the config's."""
    named = environ.get("GPUSLURM_DB", "").strip()
    if named or bundle is not None:
        return named or None
    from gpuslurm.config import load_config
    from gpuslurm.state.store import default_path

    try:
        cfg = load_config(environ=environ)
    except GpuslurmError:
        return None  # a broken config is the admin's matter; the one sample still serves
    return cfg.monitor.db or default_path(cfg.paths.state_dir)
