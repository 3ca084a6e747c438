"""Where the site configuration is and its text, without the schema (:mod:`gpuslurm.config`).

The task prolog runs once per task and only looks for its ``[paths] run_dir`` line
(:func:`gpuslurm.hooks.cache.run_dir_hint`); building the schema's classes cost it about 3 ms
of CPU a start on a 2-core node (docs/hooks.md, "Short jobs and many tasks"). This module is
what finding and reading the file takes: ``os``, and :mod:`gpuslurm.safedir` to read it.
"""

from __future__ import annotations

import os

from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NoReturn

DEFAULT_PATH = "/etc/gpuslurm/gpuslurm.toml"
ENV_VAR = "GPUSLURM_CONFIG"
MAX_CONFIG_BYTES = 1 << 20  # a config is a few KiB; a bigger file is not one
DEFAULT_RUN_DIR = "/run/gpuslurm"  # [paths] run_dir unless the file sets it


def config_path(environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """The config file to read, and whether it was named explicitly (so must exist)."""
    env = os.environ if environ is None else environ
    named = env.get(ENV_VAR, "")
    return (named, True) if named else (DEFAULT_PATH, False)


def read_config_text(path: str, explicit: bool) -> str | None:
    """The text of the config file; None when it is absent and was not ``explicit``ly named."""
    try:
        from gpuslurm.safedir import read_regular  # a FIFO or device here would hang every hook

        data = read_regular(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        if explicit:
            fail("no such file", path)
        return None
    except OSError as exc:
        fail(f"cannot read: {exc.strerror}", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"not valid TOML: not UTF-8 (byte {exc.start})", path)


def fail(message: str, source: str) -> NoReturn:
    """Raise the one-line InputError about the config ``source``."""
    from gpuslurm.errors import InputError  # only on the error path: keeps the hooks' import light

    raise InputError(message, source=source)
