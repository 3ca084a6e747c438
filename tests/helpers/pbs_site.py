"""A replayed PBS node for the hook entry point without PBS: a bundle, a config and the hook events
called in-process (tests/pbs)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuslurm.hw.source import BUILTIN_DIR, load_node
from gpuslurm.pbs.entry import main


class Site:
    def __init__(self, root: Path, bundle: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.bundle = root / bundle
        shutil.copytree(BUILTIN_DIR / bundle, self.bundle)
        self.config = root / "gpuslurm.toml"
        self.config.write_text(f'[paths]\nrun_dir = "{root}/run"\nstate_dir = "{root}/state"\n'
                               f'cgroup_root = "{root}/no-cgroup"\n')
        monkeypatch.setenv("GPUSLURM_CONFIG", str(self.config))
        monkeypatch.setenv("GPUSLURM_CAPTURE", str(self.bundle))
        self.node = load_node(str(self.bundle))

    @property
    def jobs(self) -> Path:
        return self.root / "run" / "jobs"

    def call(self, event: str, **doc: Any) -> tuple[int, dict[str, Any] | None, list[str]]:
        request = {"format": 1, "event": event, "hostname": "pbshost", **doc}
        out, err = io.StringIO(), io.StringIO()
        rc = main([event], io.BytesIO(json.dumps(request).encode()), out, err)
        return rc, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue().splitlines()

    def begin(self, job: str, exec_vnode: str, user: str = "root") -> tuple[int, dict[str, Any] | None,
                                                                             list[str]]:
        return self.call("execjob_begin", job_id=job, euser=user, exec_vnode=exec_vnode,
                         exec_host="pbshost/0*4")

    def mapped(self, job: str) -> list[str]:
        return [g["uuid"] for g in json.loads((self.jobs / f"{job}.json").read_text())["gpus"]]

    def numa(self, uuid: str) -> int | None:
        return next(g.numa_node for g in self.node.gpus if g.uuid == uuid)
