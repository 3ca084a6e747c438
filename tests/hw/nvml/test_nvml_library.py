"""NVML found without ``LD_LIBRARY_PATH``: ``[paths] nvml_library`` and a baked-in nvml.json.

slurmd gives the hooks it runs only the job's SLURM_* variables, so neither ``LD_LIBRARY_PATH``
nor ``GPUSLURM_NVML_REPLAY`` reaches them. Here the installed executables (``gpuslurm install``
without ``--replay``) run as slurmd runs them, with that environment only: the config names the
library, the library was built with its nvml.json's path, and both are checked as root's files.
The same through the real slurmd is ``test_slurmd_hooks.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site
from tests.helpers.nvml_replay import MakeLiveNode

from gpuslurm import install


@dataclass
class LiveSite:
    """A hook site whose node is served by the replay library the config names."""

    site: HookSite
    make: MakeLiveNode
    nvml_dir: Path  # root's, 0755: libnvidia-ml.so.1 and the nvml.json it serves

    @property
    def library(self) -> Path:
        return self.nvml_dir / "libnvidia-ml.so.1"

    @property
    def nvml_json(self) -> Path:
        return self.nvml_dir / "nvml.json"

    def serve(self) -> None:
        """Dump the bundle as it is now (health.json included) where the library reads it."""
        node = self.make(self.site.bundle)
        self.nvml_json.write_text(node.nvml_json.read_text())
        self.nvml_json.chmod(0o644)
        if not self.library.exists():
            shutil.copy(node.lib.serving(self.nvml_json).directory / "libnvidia-ml.so.1", self.library)
            self.library.chmod(0o644)

    def configure(self, library: str | None) -> None:
        self.site.write_config()
        if library is not None:
            text = self.site.config.read_text()
            self.site.config.write_text(text.replace("[hooks]", f'nvml_library = "{library}"\n[hooks]', 1))

    def install(self) -> Path:
        """``gpuslurm install --config CONFIG`` (no ``--replay``): the live node's executables."""
        etc = self.site.root / "slurm-etc-live"
        etc.mkdir(exist_ok=True)
        prefix = self.site.root / "libexec-live" / "gpuslurm"
        install.apply_plan(install.plan_install(etc, prefix, os.path.abspath(sys.executable),
                                                config=str(self.site.config)))
        return prefix

    def status(self, **env: str) -> subprocess.CompletedProcess[str]:
        """``gpuslurm status --json`` with the site's config and no library environment."""
        return subprocess.run([sys.executable, "-m", "gpuslurm.cli.main", "status", "--json"],
                              env={**_bare_environ(), "GPUSLURM_CONFIG": str(self.site.config), **env},
                              capture_output=True, text=True, timeout=120, check=False, cwd="/")


def _bare_environ() -> dict[str, str]:
    """This process's environment without anything that would find NVML or a bundle for gpuslurm."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "GPUSLURM_CAPTURE", "GPUSLURM_CONFIG")
            and not k.startswith("GPUSLURM_NVML_REPLAY")}


@pytest.fixture
def live(tmp_path: Path, live_node: MakeLiveNode) -> LiveSite:
    tmp_path.chmod(0o755)
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir(mode=0o755)
    site = LiveSite(make_site(tmp_path / "site"), live_node, nvml_dir)
    site.serve()
    site.configure(str(site.library))
    return site


def _job_map(site: HookSite, job: str) -> list[str] | None:
    path = site.jobs_dir / f"{job}.json"
    return [g["uuid"] for g in json.loads(path.read_text())["gpus"]] if path.exists() else None


def test_installed_hooks_read_nvml_through_the_configured_library(live: LiveSite) -> None:
    site = live.site
    replayed = site.install_hooks()  # the same executables with the bundle baked in (--replay)
    prefix = live.install()
    assert "GPUSLURM_CAPTURE" not in (prefix / "gpuslurm-prolog").read_text()
    env = site.slurm_environ("41", gpus="1,3")
    done = site.run_installed(prefix, "prolog", env)
    assert done.returncode == 0, done.stderr
    assert _job_map(site, "41") == [site.uuids[1], site.uuids[3]]
    done = site.run_installed(prefix, "epilog", env)
    assert done.returncode == 0, done.stderr
    assert _job_map(site, "41") is None and site.scontrol_calls() == []

    # a health fault the library serves drains, with the reason replaying the bundle gives
    site.set_health({site.uuids[3]: {"ecc_uncorrectable": 2}})
    live.serve()
    done = site.run_installed(prefix, "prolog", site.slurm_environ("42", gpus="1,3"))
    assert done.returncode == 1, done.stderr
    [live_call] = site.scontrol_calls()
    assert f"GPU index 3 (/dev/nvidia3, {site.uuids[3]})" in live_call[-1], live_call
    done = site.run_installed(replayed, "prolog", site.slurm_environ("43", gpus="1,3"))
    assert done.returncode == 1, done.stderr
    assert site.scontrol_calls() == [live_call, live_call]
    assert _job_map(site, "42") is None


def test_without_the_key_nvml_is_not_found(live: LiveSite) -> None:
    """What the key does: the same executables without it find no NVML under slurmd's environment."""
    live.configure(None)
    prefix = live.install()
    done = live.site.run_installed(prefix, "prolog", live.site.slurm_environ("44", gpus="0"))
    assert done.returncode == 3, done.stderr
    assert "NVML is not available" in done.stderr


def test_status_uses_the_configured_library(live: LiveSite) -> None:
    done = live.status()
    assert done.returncode == 0, done.stderr
    uuids = [g["uuid"] for g in json.loads(done.stdout)["gpus"]]
    assert uuids == live.site.uuids


def _group_writable(live: LiveSite) -> str:
    live.library.chmod(0o664)
    return "writable by group or others (mode 0664)"


def _symlink(live: LiveSite) -> str:
    link = live.nvml_dir / "libnvidia-ml.so"
    link.symlink_to(live.library)
    live.configure(str(link))
    return "is a symlink"


def _open_directory(live: LiveSite) -> str:
    live.nvml_dir.chmod(0o777)
    return "writable by group or others (mode 0777)"


def _other_owner(live: LiveSite) -> str:
    os.chown(live.library, 65534, 65534)
    return "owned by uid 65534"


def _not_a_library(live: LiveSite) -> str:
    live.library.write_text("not ELF\n")
    return "cannot load"


def _other_soname(live: LiveSite) -> str:
    # libcjson (the replay library's own dependency): a real shared object, soname libcjson.so.1
    [cjson] = sorted(Path("/usr/lib").glob("*/libcjson.so.1"))[:1] or [Path("/usr/lib/libcjson.so.1")]
    shutil.copy(cjson, live.library)
    live.library.chmod(0o644)
    return "not loaded under the name libnvidia-ml.so.1"


def _relative(live: LiveSite) -> str:
    live.configure("nvml/libnvidia-ml.so.1")
    return "must be an absolute path"


def _missing(live: LiveSite) -> str:
    live.configure(str(live.nvml_dir / "absent.so"))
    return "No such file"


REFUSED = {"group-writable": _group_writable, "symlink": _symlink, "open directory": _open_directory,
           "another owner": _other_owner, "not a library": _not_a_library, "other soname": _other_soname,
           "relative": _relative, "missing": _missing}


@pytest.mark.parametrize("spoil", REFUSED.values(), ids=list(REFUSED))
def test_a_library_root_must_not_load_is_refused_in_one_line(live: LiveSite, spoil: object) -> None:
    if os.geteuid() != 0 and spoil is _other_owner:
        pytest.skip("chown needs root")
    expected = spoil(live)  # type: ignore[operator]
    done = live.status()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nvml_library" in lines[0] and expected in lines[0], done.stderr


def _json_group_writable(live: LiveSite) -> str:
    live.nvml_json.chmod(0o664)
    return "the file writable by group or others (mode 0664)"


def _json_symlink(live: LiveSite) -> str:
    moved = live.nvml_dir / "real.json"
    live.nvml_json.rename(moved)
    live.nvml_json.symlink_to(moved)
    return "cannot open nvml.json (missing, or a symlink)"


def _json_open_directory(live: LiveSite) -> str:
    live.nvml_dir.chmod(0o757)  # the library itself is still loaded: only the file check is hit
    return "a directory writable by group or others (mode 0757)"


BAKED = {"group-writable": _json_group_writable, "symlink": _json_symlink,
         "open directory": _json_open_directory}


@pytest.mark.parametrize("spoil", BAKED.values(), ids=list(BAKED))
def test_the_baked_in_nvml_json_is_checked_as_roots(live: LiveSite, spoil: object, tmp_path: Path) -> None:
    """The library serves its baked-in file only if it is root's and nobody else could change it."""
    expected = spoil(live)  # type: ignore[operator]
    log = tmp_path / "library.log"
    if spoil is _json_open_directory:  # gpuslurm refuses the directory first; the library is asked directly
        live.nvml_dir.chmod(0o755)
        code = (f"import ctypes; lib = ctypes.CDLL({str(live.library)!r}); import os; "
                f"os.chmod({str(live.nvml_dir)!r}, 0o757); print(lib.nvmlInit_v2())")
        done = subprocess.run([sys.executable, "-c", code], env={**_bare_environ(),
                              "GPUSLURM_NVML_REPLAY_LOG": str(log)}, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.stdout.strip() == "999", done.stderr  # NVML_ERROR_UNKNOWN
    else:
        done = live.status(GPUSLURM_NVML_REPLAY_LOG=str(log))
        assert done.returncode == 3, done.stderr
        assert "nvmlInit failed" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert expected in log.read_text() and str(live.nvml_json) in log.read_text()
