"""The GRES Type each Slurm release gives a MIG device, and which release a gres.conf is written for.

Read from Slurm's ``src/plugins/gpu/nvml/gpu_nvml.c`` (``_handle_mig`` and its caller), per tag:

* Every release: the MIG device's Type is the parent's NVML name lower-cased with spaces turned
  into ``_`` (``gpu_common_underscorify_tolower``), cut at its first ``-``, then a suffix.
* Before 23.02.6 the suffix is ``_<GI slices>g.<GiB>gb`` from ``nvmlDeviceGetAttributes``, GiB being
  ``roundl(memorySizeMB / 1024)``: an A100-80GB's 3g.40gb (40192 MiB) is ``nvidia_a100_3g.39gb``, and
  two compute instances of one GPU instance get one Type.
* From 23.02.6 (commits 04f0e4c, a7b8997, e199093; bugs 17705 and the like) the suffix is NVIDIA's
  own profile name, taken from the MIG device's NVML name after ``mig`` ("NVIDIA A100-SXM4-80GB MIG
  3g.40gb" → ``_3g.40gb``, an H200's ``_1c.3g.71gb``). Only when that name has no ``mig_`` does
  Slurm rebuild it: ``_[<CI slices>c.]<GI slices>g.<GiB>gb`` with GiB rounded *up*. gpuslurm always
  has NVIDIA's name (a capture without it is refused), so it writes the first form.
* Bug 17482 (a MultipleFiles MIG line counted once per file when GresTypes has mps or shard) is
  fixed in 23.02.7.
"""

from __future__ import annotations

from gpuslurm.gres.records import MigNaming
from gpuslurm.hw.model.node import MIG_PROFILE_RE, MigDevice, autodetect_mig_type, autodetect_type
from gpuslurm.slurm.version import SLURMD as SLURMD
from gpuslurm.slurm.version import SlurmVersion as SlurmVersion
from gpuslurm.slurm.version import installed_slurm_version as installed_slurm_version
from gpuslurm.slurm.version import parse_slurm_version as parse_slurm_version

NVML_PROFILE_NAMES = SlurmVersion(23, 2, 6)  # MIG Types take NVIDIA's profile names
SHARED_MIG_FIXED = SlurmVersion(23, 2, 7)  # bug 17482 fixed
# The first release we run that sets a node INVAL whose gres.conf Cores= is not whole sockets
# (24.11.5 and 26.05.5 do, in the test cluster; 22.05.8 takes NUMA ranges; 23.x not tried)
SOCKET_BOUNDARY_CHECK = SlurmVersion(24, 11, 0)
UNTRIED_FROM = SlurmVersion(23, 0, 0)  # the releases after 22.05 (22.05.8 takes NUMA Cores=)


def nvml_profile_type(gpu_name: str, mig: MigDevice) -> str:
    """The Type Slurm 23.02.6 and later give a MIG device: the parent's name up to its first '-',
    then NVIDIA's profile name ("NVIDIA H200", 1c.3g.71gb → "nvidia_h200_1c.3g.71gb")."""
    if MIG_PROFILE_RE.match(mig.profile) is None:
        raise ValueError(f"unknown MIG profile {mig.profile!r}")
    return autodetect_type(f"{gpu_name.split('-', 1)[0]}_{mig.profile}")


def mig_naming(version: SlurmVersion, source: str) -> MigNaming:
    """How ``version`` names and counts MIG devices; ``source`` says where the version came from."""
    newer = version >= NVML_PROFILE_NAMES
    return MigNaming(type_of=nvml_profile_type if newer else autodetect_mig_type,
                     splits_shared=version < SHARED_MIG_FIXED, release=f"{version} ({source})",
                     whole_sockets=version >= SOCKET_BOUNDARY_CHECK,
                     socket_check_untried=UNTRIED_FROM <= version < SOCKET_BOUNDARY_CHECK)


def later_naming(naming: MigNaming) -> MigNaming | None:
    """How a later release names the MIG devices ``naming`` names otherwise; None when none does."""
    if naming.type_of is autodetect_mig_type:
        return MigNaming(type_of=nvml_profile_type, splits_shared=False,
                         release=f"{NVML_PROFILE_NAMES} and later")
    return None


def target_naming(option: str | None, slurmd: str = SLURMD) -> MigNaming:
    """The naming for ``--slurm-version`` when given, else this host's slurmd, else 22.05's
    (what gpuslurm wrote before it knew releases apart), saying so in the generated file."""
    if option is not None:
        return mig_naming(parse_slurm_version(option), "--slurm-version")
    found = installed_slurm_version(slurmd)
    if found is not None:
        return mig_naming(found, f"{slurmd} -V")
    return MigNaming(release="unknown: no slurmd here and no --slurm-version; MIG Types as 22.05 "
                             "names them")
