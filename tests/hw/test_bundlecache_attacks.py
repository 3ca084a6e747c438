"""``gpuslurm pick``'s parsed-bundle cache, attacked by an ordinary user (``nobody``, real
processes): root runs pick with ``HOME`` (or ``XDG_CACHE_HOME``) naming the user's directory, where
the user has planted a forged cache (the right key, a lying node) or a symlink to a file of root's.
Root neither reads the forgery nor writes into the user's directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import users_site

from gpuslurm.hw.replay.bundlecache import CACHE_FILE

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays root and nobody")


@pytest.fixture
def site() -> Iterator[Path]:
    # in /tmp: nobody can reach it, and run users-venv's python with this checkout's gpuslurm
    with users_site("gpuslurm-cache-attack-") as base:
        (base / "home").mkdir(mode=0o755)
        os.chown(base / "home", NOBODY, NOBODY)
        yield base


def _pick(env: dict[str, str], bundle: Path) -> dict[str, object]:
    argv = [sys.executable, "-m", "gpuslurm", "pick", "1", "--from", str(bundle), "--format", "json"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False,
                            cwd="/")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _as_nobody(base: Path, code: str) -> None:
    subprocess.run([str(base / "users-venv" / "bin" / "python"), "-c", code], check=True, user=NOBODY,
                   group=NOBODY, extra_groups=[], timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})


def _user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "HOME")}
    return {**env, "HOME": str(home)}


@pytest.mark.parametrize("via", ["HOME", "XDG_CACHE_HOME"])
def test_root_never_reads_or_writes_a_users_cache(site: Path, via: str) -> None:
    home, bundle = site / "home", site / "bundle"
    truth = _pick({**_user_env(site / "nowhere")}, bundle)
    # nobody fills their own cache (what pick does for them), then makes it lie (same key)
    cache = home / ".cache" / "gpuslurm" / CACHE_FILE
    _as_nobody(site, f"from gpuslurm.hw.source import load_node; "
                     f"load_node({str(bundle)!r}, cache_dir={str(cache.parent)!r})")
    _as_nobody(site, f"import json; p={str(cache)!r}; d=json.load(open(p)); d['node'][0]='planted'; "
                     "[g.__setitem__(1, 7 - g[1]) for g in d['node'][1]]; json.dump(d, open(p, 'w'))")
    assert json.loads(cache.read_text())["node"][0] == "planted"
    assert cache.stat().st_uid == NOBODY
    env = _user_env(home) if via == "HOME" else {**_user_env(site / "nowhere"),
                                                 "XDG_CACHE_HOME": str(home / ".cache")}
    before = sorted((str(p), p.stat().st_uid) for p in home.rglob("*"))
    assert _pick(env, bundle) == truth  # root: parsed, not the forgery
    assert sorted((str(p), p.stat().st_uid) for p in home.rglob("*")) == before  # nothing of root's


def test_a_symlink_the_user_plants_is_not_followed_by_root(site: Path) -> None:
    home, bundle = site / "home", site / "bundle"
    secret = site / "roots-file"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    _as_nobody(site, f"import os; os.makedirs('{home}/.cache', exist_ok=True); "
                     f"os.symlink('{site}', '{home}/.cache/gpuslurm')")
    truth = _pick(_user_env(site / "nowhere"), bundle)
    assert _pick(_user_env(home), bundle) == truth
    assert secret.read_text() == "root's\n" and not (site / CACHE_FILE).exists()


def test_a_fifo_at_the_cache_file_never_blocks_pick(site: Path) -> None:
    cache = site / "root-cache" / "gpuslurm"
    cache.mkdir(parents=True, mode=0o700)
    os.mkfifo(cache / CACHE_FILE, 0o600)
    env = {**_user_env(site / "nowhere"), "XDG_CACHE_HOME": str(site / "root-cache")}
    assert _pick(env, site / "bundle") == _pick(_user_env(site / "nowhere"), site / "bundle")
    assert stat.S_ISFIFO(os.lstat(cache / CACHE_FILE).st_mode)  # refused, never replaced blindly
