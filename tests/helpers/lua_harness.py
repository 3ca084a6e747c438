"""Run Lua snippets against plugins/job_submit.lua under the real lua5.1 with a fake ``slurm``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "job_submit.lua"
HARNESS = Path(__file__).with_name("harness.lua")
LUA = shutil.which("lua5.1") or "/usr/bin/lua5.1"


def lua_missing() -> str | None:
    return None if Path(LUA).is_file() else "lua5.1 is not installed (apt-get install lua5.1)"


def run_lua(body: str, *, now: int = 1_900_000_000, plugin: Path = PLUGIN) -> list[str]:
    """Lines the snippet printed; fails the test with stderr if Lua errors."""
    if lua_missing():
        pytest.skip(str(lua_missing()))
    prelude = f"PLUGIN = {_lua_str(str(plugin))}\nNOW = {now}\n"
    script = prelude + HARNESS.read_text() + "\n" + body
    proc = subprocess.run([LUA, "-"], input=script, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, f"lua5.1 failed:\n{proc.stderr}\n{proc.stdout}"
    return proc.stdout.splitlines()


def lua_str(text: str) -> str:
    return _lua_str(text)


def _lua_str(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'
