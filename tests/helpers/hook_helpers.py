"""Shared set-up for the hook tests: a replayable DGX H100 bundle, a config and a stand-in scontrol."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslurm.hw.source import BUILTIN_DIR, load_node


@dataclass
class HookSite:
    root: Path
    bundle: Path
    config: Path
    scontrol_log: Path
    uuids: list[str]  # the bundle's GPUs in index order

    @property
    def jobs_dir(self) -> Path:
        return self.root / "run" / "jobs"

    @property
    def summaries(self) -> Path:
        return self.root / "state" / "jobs"

    def environ(self, job_id: str = "1234", gpus: str | None = "0,1,2,3", **extra: str) -> dict[str, str]:
        env = {"GPUSLURM_CONFIG": str(self.config), "GPUSLURM_CAPTURE": str(self.bundle),
               "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "alice",
               "SLURMD_NODENAME": "node07"}
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
        env.update(extra)
        return env

    def slurm_environ(self, job_id: str, gpus: str | None = "0,1,2,3", **extra: str) -> dict[str, str]:
        """What slurmd gives an installed hook: the job's SLURM_* variables only. No PATH, and no
        GPUSLURM_CONFIG or GPUSLURM_CAPTURE: install baked both into the executable."""
        env = self.environ(job_id, gpus, **extra)
        del env["GPUSLURM_CONFIG"], env["GPUSLURM_CAPTURE"]
        return env

    def install_hooks(self, c_client: bool = False) -> Path:
        """``gpuslurm install --config CONFIG --replay BUNDLE`` into a fresh prefix below ``root``:
        the executables the hook tests run. ``root`` is root's (pytest's tmp_path), so the
        directory rule holds. ``c_client``: with ``--c-client`` (the hook server's client in C)."""
        from gpuslurm import install

        etc = self.root / "slurm-etc"
        etc.mkdir(exist_ok=True)
        prefix = self.root / "libexec" / "gpuslurm"
        plan = install.plan_install(etc, prefix, os.path.abspath(sys.executable), config=str(self.config),
                                    capture=str(self.bundle), c_client=c_client)
        install.apply_plan(plan)
        return prefix

    def run_installed(self, prefix: Path, hook: str, env: dict[str, str],
                      *args: str) -> subprocess.CompletedProcess[str]:
        """Run the installed ``gpuslurm-<hook>`` as slurmd would: its absolute path, ``env`` only."""
        return subprocess.run([str(prefix / f"gpuslurm-{hook}"), *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False, cwd="/")

    def set_health(self, facts: dict[str, Any]) -> None:
        (self.bundle / "health.json").write_text(json.dumps(facts))

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(
            "[paths]\n"
            f'run_dir = "{self.root / "run"}"\n'
            f'state_dir = "{self.root / "state"}"\n'
            f'scontrol = "{self.root / "scontrol"}"\n'
            f'squeue = "{self.root / "squeue"}"\n'
            # As on a node where Slurm constrains devices: "auto" leaves isolation to Slurm, so
            # these tests make no cgroups (tests/isolate covers gpuslurm's own).
            f'slurm_cgroup_conf = "{self.root / "cgroup.conf"}"\n'
            "[hooks]\ncommand_timeout_s = 5\n" + extra)

    def scontrol_calls(self) -> list[list[str]]:
        if not self.scontrol_log.exists():
            return []
        calls = self.scontrol_log.read_text().split("\0END\n")
        return [c.split("\0") for c in calls if c]


def make_site(root: Path, *, scontrol_exit: int = 0, builtin: str = "dgx-h100") -> HookSite:
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / builtin, bundle)
    log = root / "scontrol.log"
    script = root / "scontrol"
    # Records its argv, NUL-separated, one call per record.
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done | sed "s/\\x00$//" '
                      f'>> {log}\nprintf "\\0END\\n" >> {log}\nexit {scontrol_exit}\n')
    script.chmod(0o755)
    # Lists job 1234 with the AdminComment in admin-comment.json (a JSON string; none: empty).
    squeue = root / "squeue"
    squeue.write_text(f'#!/bin/sh\nc=$(cat {root / "admin-comment.json"} 2>/dev/null || echo \'""\')\n'
                      'printf \'{"errors": [], "jobs": [{"job_id": 1234, "user_id": 0, "nodes": "", '
                      '"job_state": "RUNNING", "admin_comment": %s}]}\\n\' "$c"\n')
    squeue.chmod(0o755)
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n")
    site = HookSite(root, bundle, root / "gpuslurm.toml", log,
                    [g.uuid for g in load_node(str(bundle)).gpus])
    site.write_config()
    return site
