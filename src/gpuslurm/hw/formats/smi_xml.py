"""Parse ``nvidia-smi -q -x`` (DTD v11–v13) into a :class:`SmiReport`.

Decisions on odd input, shared with :mod:`gpuslurm.hw.formats.smi_text`:

- ``<attached_gpus>`` differing from the number of ``<gpu>`` elements (nvidia-smi run with ``-i``,
  or an edited capture): the GPUs present are described and a warning names both numbers.
- GPUs are indexed by document order; nvidia-smi lists them in NVML order (PCI bus order).
- A UUID repeated by a later GPU (masked or placeholder captures) is kept on the first GPU; each
  later one gets a synthetic UUID built from its bus id, with a warning. The same applies to MIG
  UUIDs across the whole node. Synthetic UUIDs carry ``ffff`` in the fourth group: real UUIDs are
  RFC 4122 variant (first digit 8–b there) and masked ones have ``0000``, so neither can collide.
- Two GPUs with one bus id or one minor number, or two MIG devices of one GPU with one index or
  one GI/CI pair, cannot happen on a real node: :class:`CaptureError`.
- A current MIG mode other than Enabled, Disabled or N/A is a CaptureError rather than a guess.
- The XML carries neither MIG profile names nor MIG UUIDs (``nvidia-smi -L`` does), nor NUMA or
  CPU affinity (``topo -m`` does): those fields are left empty.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pyexpat import ErrorString
from typing import NamedTuple

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Gpu, MigDevice, normalise_bus_id

__all__ = [
    "SmiReport",
    "dedupe_uuids",
    "finish_report",
    "is_placeholder_uuid",
    "parse_bus_id",
    "parse_int",
    "parse_mib",
    "parse_mig_mode",
    "parse_optional_int",
    "parse_smi_xml",
    "synthetic_gpu_uuid",
    "synthetic_mig_uuid",
    "xml_root",
]


class SmiReport(NamedTuple):
    """The node facts one nvidia-smi query output carries."""

    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[Gpu, ...]
    warnings: tuple[str, ...] = ()
    attached_gpus: int | None = None


_MIB_RE = re.compile(r"^(\d+)\s*MiB$")
_NOT_SUPPORTED = frozenset({"N/A", "[N/A]", "Not Supported", "[Not Supported]"})
_SYNTHETIC_MARK = "ffff"  # fourth UUID group; see the module docstring


MAX_ID = (1 << 20) - 1  # Linux minor numbers are 20 bits; GPU indices and instance ids are far below
MAX_MIB = 1 << 40  # an exbibyte: more than any GPU or node


def parse_mib(value: str | None, what: str, source: str) -> int:
    """``"24564 MiB"`` → 24564; anything else is a CaptureError naming ``what``."""
    m = _MIB_RE.match((value or "").strip())
    if m is None:
        raise CaptureError(f"{what} is {value!r}, expected '<n> MiB'", source)
    if len(m.group(1)) > len(str(MAX_MIB)) or int(m.group(1)) > MAX_MIB:
        raise CaptureError(f"{what} is {_short(value)}, more memory than any GPU has", source)
    return int(m.group(1))


def parse_int(value: str | None, what: str, source: str, most: int = MAX_ID) -> int:
    """A whole number from 0 to ``most`` (indices, minors, instance ids); else a CaptureError."""
    text = (value or "").strip()
    if not (text.isascii() and text.isdigit()):
        raise CaptureError(f"{what} is {_short(value)}, expected an integer", source)
    if len(text) > len(str(most)) or int(text) > most:
        raise CaptureError(f"{what} is {_short(value)}, expected at most {most}", source)
    return int(text)


def parse_optional_int(value: str | None) -> int | None:
    text = (value or "").strip()
    ok = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_ID)) and int(text) <= MAX_ID
    return int(text) if ok else None


def _short(value: str | None) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_mig_mode(value: str | None, what: str, source: str) -> bool | None:
    """Current MIG mode: True/False, None when the GPU has no MIG (or the field is absent)."""
    if value is None:
        return None
    text = value.strip()
    if text == "Enabled":
        return True
    if text == "Disabled":
        return False
    if text in _NOT_SUPPORTED:
        return None
    raise CaptureError(f"{what} is {value!r}, expected Enabled, Disabled or N/A", source)


def parse_bus_id(value: str, what: str, source: str) -> str:
    try:
        return normalise_bus_id(value)
    except ValueError:
        raise CaptureError(f"{what} is {value!r}, not a PCI bus id", source) from None


def _bus_parts(bus_id: str) -> tuple[int, int, int, int]:
    domain, bus, devfn = bus_id.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def synthetic_gpu_uuid(bus_id: str) -> str:
    """A stable stand-in UUID for the GPU at ``bus_id`` (normalised form)."""
    domain, bus, dev, fn = _bus_parts(bus_id)
    return f"GPU-{domain:08x}-0000-0000-{_SYNTHETIC_MARK}-{bus:04x}{dev:04x}{fn:04x}"


def synthetic_mig_uuid(bus_id: str, gi_id: int, ci_id: int) -> str:
    """A stable stand-in UUID for MIG device GI/CI of the GPU at ``bus_id``."""
    domain, bus, dev, fn = _bus_parts(bus_id)
    return f"MIG-{domain:08x}-{gi_id:04x}-{ci_id:04x}-{_SYNTHETIC_MARK}-{bus:04x}{dev:04x}{fn:04x}"


def is_placeholder_uuid(uuid: str) -> bool:
    """True for masked (all-zero digits) and synthetic UUIDs, which identify nothing."""
    body = uuid.split("-", 1)[1] if "-" in uuid else uuid
    groups = body.split("-")
    if len(groups) == 5 and groups[3] == _SYNTHETIC_MARK:
        return True
    return set(body) <= {"0", "-"}


def _check_unique_hardware(gpus: list[Gpu], source: str) -> None:
    for attr, label in (("bus_id", "bus id"), ("minor", "minor number")):
        seen: dict[object, int] = {}
        for gpu in gpus:
            value = getattr(gpu, attr)
            if value in seen:
                raise CaptureError(f"GPU {seen[value]} and GPU {gpu.index} have the same {label} {value}",
                                   source)
            seen[value] = gpu.index
    for gpu in gpus:
        indexes: set[int] = set()
        pairs: set[tuple[int, int]] = set()
        for mig in gpu.mig_devices:
            if mig.index in indexes:
                raise CaptureError(f"GPU {gpu.index} lists MIG device index {mig.index} twice", source)
            if (mig.gi_id, mig.ci_id) in pairs:
                raise CaptureError(f"GPU {gpu.index} lists GPU instance {mig.gi_id} / compute instance "
                                   f"{mig.ci_id} twice", source)
            indexes.add(mig.index)
            pairs.add((mig.gi_id, mig.ci_id))


def dedupe_uuids(gpus: tuple[Gpu, ...], source: str) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """Apply the duplicate-UUID rule (module docstring) to GPU and MIG UUIDs."""
    warnings: list[str] = []
    seen: dict[str, str] = {}  # uuid -> who has it
    out: list[Gpu] = []

    def claim(uuid: str, owner: str, synthetic: str) -> str:
        if uuid not in seen:
            seen[uuid] = owner
            return uuid
        if synthetic in seen:
            raise CaptureError(f"{owner}: synthetic UUID {synthetic} is already used by {seen[synthetic]}",
                               source)
        warnings.append(f"{owner} repeats UUID {uuid} of {seen[uuid]} (masked or placeholder capture); "
                        f"using {synthetic}")
        seen[synthetic] = owner
        return synthetic

    # GPU UUIDs first, so a MIG UUID can never displace a GPU's.
    gpu_uuids = [claim(g.uuid, f"GPU {g.index} ({g.bus_id})", synthetic_gpu_uuid(g.bus_id)) for g in gpus]
    for gpu, uuid in zip(gpus, gpu_uuids, strict=True):
        migs = []
        for mig in gpu.mig_devices:
            if mig.uuid is not None:
                owner = f"MIG device {mig.index} of GPU {gpu.index} ({gpu.bus_id})"
                mig = mig._replace(uuid=claim(mig.uuid, owner,
                                              synthetic_mig_uuid(gpu.bus_id, mig.gi_id, mig.ci_id)))
            migs.append(mig)
        out.append(gpu._replace(uuid=uuid, mig_devices=tuple(migs)))
    return tuple(out), tuple(warnings)


def finish_report(driver_version: str | None, cuda_version: str | None, attached_gpus: int | None,
                  gpus: list[Gpu], source: str, attached_label: str) -> SmiReport:
    """Validate parsed GPUs, apply the duplicate-UUID and attached-count rules, build the report."""
    _check_unique_hardware(gpus, source)
    deduped, warnings = dedupe_uuids(tuple(gpus), source)
    notes = list(warnings)
    if attached_gpus is not None and attached_gpus != len(gpus):
        notes.insert(0, f"{attached_label} is {attached_gpus} but {len(gpus)} GPU(s) are described; "
                        f"using the {len(gpus)} present")
    return SmiReport(driver_version, cuda_version, deduped, tuple(notes), attached_gpus)


def _text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _parse_mig(elem: ET.Element, what: str, source: str) -> MigDevice:
    index = parse_int(_text(elem, "index"), f"{what} <index>", source)
    memory = _text(elem, "fb_memory_usage/total")
    if memory is None:  # newer DTDs may name it after the text output's "Shared FB Memory Usage"
        memory = _text(elem, "shared_fb_memory_usage/total")
    return MigDevice(
        index=index,
        gi_id=parse_int(_text(elem, "gpu_instance_id"), f"{what} <gpu_instance_id>", source),
        ci_id=parse_int(_text(elem, "compute_instance_id"), f"{what} <compute_instance_id>", source),
        profile="",
        memory_mib=parse_mib(memory, f"{what} <fb_memory_usage><total>", source),
        uuid=None,
        sm_count=parse_optional_int(_text(elem, "device_attributes/shared/multiprocessor_count")),
    )


def _parse_gpu(elem: ET.Element, index: int, source: str) -> Gpu:
    what = f"<gpu> {index}"
    uuid = _text(elem, "uuid")
    if not uuid:
        raise CaptureError(f"{what} has no <uuid>", source)
    minor_text = _text(elem, "minor_number")
    if minor_text is None:
        raise CaptureError(f"{what} has no <minor_number>", source)
    bus_text = _text(elem, "pci/pci_bus_id") or elem.get("id")
    if not bus_text:
        raise CaptureError(f"{what} has no <pci_bus_id> nor id attribute", source)
    mig_root = elem.find("mig_devices")
    migs = () if mig_root is None else tuple(
        _parse_mig(m, f"{what} <mig_device> #{pos}", source)
        for pos, m in enumerate(mig_root.findall("mig_device")))
    return Gpu(
        uuid=uuid,
        index=index,
        minor=parse_int(minor_text, f"{what} <minor_number>", source),
        bus_id=parse_bus_id(bus_text, f"{what} bus id", source),
        name=_text(elem, "product_name") or "",
        memory_mib=parse_mib(_text(elem, "fb_memory_usage/total"), f"{what} <fb_memory_usage><total>",
                             source),
        mig_mode=parse_mig_mode(_text(elem, "mig_mode/current_mig"), f"{what} <current_mig>", source),
        mig_devices=migs,
    )


def xml_root(text: str, source: str) -> ET.Element:
    """The ``<nvidia_smi_log>`` element of ``nvidia-smi -q -x`` output, parsed safely."""
    if "<!ENTITY" in text:
        # nvidia-smi never declares entities; refusing them rules out entity-expansion bombs.
        raise CaptureError("XML declares entities, which nvidia-smi never does", source)
    try:
        # ElementTree never fetches the external DTD named in <!DOCTYPE>, and entities are refused
        # above, so untrusted input cannot reach the network or expand without bound.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError as exc:
        line = exc.position[0]
        raise CaptureError(f"not well-formed XML: {ErrorString(exc.code)} (line {line})", source) from None
    if root.tag != "nvidia_smi_log":
        raise CaptureError(f"root element is <{root.tag}>, expected <nvidia_smi_log>", source)
    return root


def parse_smi_xml(text: str, source: str) -> SmiReport:
    """Parse the output of ``nvidia-smi -q -x``; ``source`` names the file for error messages."""
    root = xml_root(text, source)
    attached_text = _text(root, "attached_gpus")
    attached = None if attached_text is None else parse_int(attached_text, "<attached_gpus>", source)
    gpus = [_parse_gpu(elem, i, source) for i, elem in enumerate(root.findall("gpu"))]
    return finish_report(_text(root, "driver_version"), _text(root, "cuda_version"), attached, gpus, source,
                         "<attached_gpus>")
