"""Which Slurm release this is: ``X.Y[.Z]`` as ``slurmd -V`` prints it (pure parser, one call).

What gres-conf's MIG Types follow (:mod:`gpuslurm.slurm.mig_types`). Never what the hooks decide
where a job's cgroup is by: the binary installed need not be the slurmd running.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gpuslurm.errors import InputError

SLURMD = "/usr/sbin/slurmd"


class SlurmVersion(NamedTuple):
    """A Slurm release, compared as numbers (22.05.8 < 23.02.6 < 24.11)."""

    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"


# "24.11", "24.11.5", "slurm-wlm 24.11.5" (Debian's slurmd -V), "slurm 23.02.6"; a pre-release
# suffix ("-0rc1") is allowed and ignored
_VERSION = re.compile(r"^(?:slurm(?:-wlm)? )?(\d{2})\.(\d{1,2})(?:\.(\d{1,3}))?(?:-[0-9A-Za-z.]{1,16})?$")


def parse_slurm_version(text: str) -> SlurmVersion:
    """``X.Y[.Z]`` or what ``slurmd -V`` prints; InputError (exit 2) for anything else."""
    m = _VERSION.match(text.strip())
    if m is None:
        raise InputError(f"not a Slurm version: {text.strip()[:40]!r} (want X.Y or X.Y.Z, e.g. 24.11)")
    major, minor, micro = m.groups()
    return SlurmVersion(int(major), int(minor), int(micro or 0))


def installed_slurm_version(slurmd: str = SLURMD, timeout: float = 10) -> SlurmVersion | None:
    """The release of this host's slurmd (``slurmd -V``); None when there is no slurmd here."""
    from gpuslurm.errors import CommandError
    from gpuslurm.runner import run_command

    try:
        result = run_command([slurmd, "-V"], timeout=timeout, check=False,
                             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    except CommandError:  # not installed (or it hung): no release to follow
        return None
    if result.returncode != 0:
        return None
    line = (result.stdout.strip() or result.stderr.strip()).splitlines()
    return parse_slurm_version(line[0]) if line else None
