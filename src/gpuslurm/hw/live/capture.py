"""Write a capture bundle: everything gpuslurm needs to know about this node, in one directory.

Each piece is optional. A missing ``nvidia-smi``, ``lscpu`` or NVML is written to ``capture.log``
in the bundle and the capture goes on; only a bundle with no GPU facts at all (neither
``nvml.json`` nor an ``nvidia-smi -q`` output) is an error. Files appear atomically (written under
a temporary name, then renamed), so a reader never sees half a file.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from gpuslurm import __version__
from gpuslurm.errors import CommandError, GpuslurmError, HardwareError, InputError
from gpuslurm.hw.formats.nvml_json import dump_node
from gpuslurm.hw.live.nvml import NvmlBackend, compute_capabilities
from gpuslurm.hw.live.procfs import PROC_ROOT
from gpuslurm.runner import run_command, which

TIMEOUT = 30.0
LOG = "capture.log"
ENV_NVIDIA_SMI = "GPUSLURM_NVIDIA_SMI"
ENV_LSCPU = "GPUSLURM_LSCPU"
# Every name a bundle may hold; ``force`` removes these (and only these) before writing.
BUNDLE_FILES = ("nvidia-smi-q.xml", "nvidia-smi-q.txt", "nvidia-smi-topo.txt", "nvidia-smi-L.txt",
                "lscpu.csv", "mig-minors", "meminfo", "hostname", "nvml.json", LOG)
GPU_FACTS = ("nvml.json", "nvidia-smi-q.xml", "nvidia-smi-q.txt")


def _tool(explicit: str | None, env: str, name: str) -> str | None:
    path = explicit or os.environ.get(env) or None
    if path is None:
        return which(name)
    if not os.path.isabs(path):
        raise InputError(f"the {name} path must be absolute, not {path!r}",
                         source=None if explicit else env)
    return path


class _Bundle:
    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir
        self.written: list[str] = []
        self.log: list[str] = []

    def write(self, name: str, text: str) -> None:
        from gpuslurm.safedir import replace_file

        replace_file(str(self.dir / name), text.encode("utf-8"), 0o644)
        if name != LOG:
            self.written.append(name)

    def note(self, name: str, ok: bool, detail: str) -> None:
        self.log.append(f"{'ok' if ok else 'missing':8}{name}: {detail}")

    def command(self, name: str, argv: list[str] | None, missing: str) -> bool:
        if argv is None:
            self.note(name, False, missing)
            return False
        try:
            result = run_command(argv, timeout=TIMEOUT)
        except CommandError as exc:
            self.note(name, False, f"{' '.join(argv)}: {exc}")
            return False
        if not result.stdout.strip():
            self.note(name, False, f"{' '.join(argv)} printed nothing")
            return False
        self.write(name, result.stdout)
        self.note(name, True, " ".join(argv))
        return True

    def copy(self, name: str, source: Path) -> bool:
        try:
            text = source.read_text()
        except OSError as exc:
            self.note(name, False, f"{source}: {exc.strerror}")
            return False
        self.write(name, text)
        self.note(name, True, str(source))
        return True

    def produce(self, name: str, make: Callable[[], str], what: str) -> bool:
        try:
            text = make()
        except GpuslurmError as exc:
            self.note(name, False, f"{what}: {exc}")
            return False
        self.write(name, text)
        self.note(name, True, what)
        return True


def _prepare(out_dir: Path, force: bool) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InputError("exists and is not a directory", source=out_dir)
        if any(out_dir.iterdir()):
            if not force:
                raise InputError("exists and is not empty (use force to overwrite a bundle)",
                                 source=out_dir)
            # A stale file from an earlier capture would pass for a fact of this one.
            for name in BUNDLE_FILES:
                (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def write_capture(out_dir: Path, *, backend: NvmlBackend | None = None, nvidia_smi: str | None = None,
                  lscpu: str | None = None, force: bool = False, proc_root: Path = Path(PROC_ROOT),
                  hostname: str | None = None) -> list[str]:
    """Capture this node into ``out_dir``; returns the bundle files written (``capture.log`` aside).

    ``nvidia_smi``/``lscpu`` are absolute paths; by default ``$GPUSLURM_NVIDIA_SMI`` /
    ``$GPUSLURM_LSCPU``, else the system directories. Raises HardwareError (after writing the log)
    when no GPU facts could be captured.
    """
    smi = _tool(nvidia_smi, ENV_NVIDIA_SMI, "nvidia-smi")
    lscpu_path = _tool(lscpu, ENV_LSCPU, "lscpu")
    _prepare(out_dir, force)
    host = hostname or socket.gethostname().split(".")[0]
    bundle = _Bundle(out_dir)

    no_smi = f"nvidia-smi not found (set {ENV_NVIDIA_SMI} to its absolute path)"

    def with_smi(*args: str) -> list[str] | None:
        return None if smi is None else [smi, *args]

    if not bundle.command("nvidia-smi-q.xml", with_smi("-q", "-x"), no_smi):
        # The text report carries the same facts; readers use it when the XML is missing.
        bundle.command("nvidia-smi-q.txt", with_smi("-q"), no_smi)
    bundle.command("nvidia-smi-topo.txt", with_smi("topo", "-m"), no_smi)
    bundle.command("nvidia-smi-L.txt", with_smi("-L"), no_smi)
    bundle.command("lscpu.csv", None if lscpu_path is None else [lscpu_path, "-p=CPU,CORE,SOCKET,NODE"],
                   f"lscpu not found (set {ENV_LSCPU} to its absolute path)")
    mig_minors = proc_root / "driver/nvidia-caps/mig-minors"
    if mig_minors.exists():
        bundle.copy("mig-minors", mig_minors)
    else:
        bundle.note("mig-minors", False, f"{mig_minors} does not exist (a driver without MIG)")
    bundle.copy("meminfo", proc_root / "meminfo")
    bundle.write("hostname", host + "\n")
    bundle.note("hostname", True, host)

    nvml = backend if backend is not None else NvmlBackend(proc_root=proc_root)
    nvml_gpus = 0

    def nvml_json() -> str:
        nonlocal nvml_gpus
        node = nvml.read_node(host)
        nvml_gpus = len(node.gpus)
        bundle.log.extend(f"warning nvml.json: {w}" for w in node.warnings)
        try:  # pick --min-cc and node-conf's cc_X.Y read it; nvidia-smi does not print it
            cc = compute_capabilities(nvml)
        except HardwareError as exc:
            cc = {}
            bundle.log.append(f"warning nvml.json: no compute capabilities: {exc}")
        return dump_node(node, cc)

    if bundle.produce("nvml.json", nvml_json, "NVML") and nvml_gpus == 0:
        bundle.log.append("warning nvml.json: NVML sees no GPUs")

    has_facts = nvml_gpus > 0 or any(n in bundle.written for n in GPU_FACTS if n != "nvml.json")
    header = [f"# gpuslurm {__version__} capture of {host}, "
              f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
    bundle.write(LOG, "\n".join(header + bundle.log) + "\n")
    if not has_facts:
        raise HardwareError(f"no GPU facts could be captured (neither NVML nor nvidia-smi answered); "
                            f"see {out_dir / LOG}")
    return bundle.written
