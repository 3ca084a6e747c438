"""nvidia-smi parsers (-q -x, -q, -L) against real captures."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.smi_text import merge_listing, parse_smi_list, parse_smi_query_text
from gpuslurm.hw.formats.smi_xml import (
    SmiReport,
    is_placeholder_uuid,
    parse_smi_xml,
    synthetic_gpu_uuid,
    synthetic_mig_uuid,
)
from gpuslurm.hw.model.node import MIG_PROFILE_RE

PLACEHOLDER_AB = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"

# file -> [(minor, bus id, uuid)] in index order
XML_EXPECTED: dict[str, list[tuple[int, str, str]]] = {
    "a100-sxm4-mig-v12.xml": [(1, "00000000:01:00.0", "GPU-513536b6-7d19-9063-b049-1e69664bb298")],
    "a10g.xml": [(0, "00000000:00:1E.0", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94")],
    "dual_2080-v13.xml": [
        (0, "00000000:01:00.0", PLACEHOLDER_AB),
        (1, "00000000:02:00.0", "GPU-00000000-0000-0000-ffff-000200000000"),
    ],
    "dual_a5000-v13.xml": [
        (1, "00000000:81:00.0", PLACEHOLDER_AB),
        (0, "00000000:C1:00.0", "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"),
    ],
    "pro-6000-maxq-blackwell-v13.xml": [(0, "00000000:61:00.0", PLACEHOLDER_AB)],
    "tesla-t4.xml": [(0, "00000000:00:1E.0", "GPU-d37e67a5-91dd-3774-a5cb-99096249601a")],
}


def _xml(real: pathlib.Path, name: str) -> str:
    return (real / "nvidia-smi-q-x" / name).read_text(encoding="utf-8")


def _section(capture: pathlib.Path, title: str) -> str:
    """The body of one '# <title>' section of a multi-command capture."""
    lines = capture.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == f"# {title}")
    while not lines[start].startswith("####"):  # the rule that closes the header block
        start += 1
    end = start + 1
    while not lines[end].startswith("####"):
        end += 1
    return "".join(lines[start + 1:end])


def _capture(real: pathlib.Path, stem: str) -> pathlib.Path:
    (path,) = (real / "multi").glob(f"{stem}__*.txt")
    return path


def _single_line_error(exc: pytest.ExceptionInfo[CaptureError], source: str) -> str:
    text = str(exc.value)
    assert source in text
    assert "\n" not in text
    return text


def test_every_xml_fixture_has_expectations(real_fixtures: pathlib.Path) -> None:
    assert sorted(p.name for p in (real_fixtures / "nvidia-smi-q-x").glob("*.xml")) == sorted(XML_EXPECTED)


@pytest.mark.parametrize("name", sorted(XML_EXPECTED))
def test_xml_fixture_loads(real_fixtures: pathlib.Path, name: str) -> None:
    report = parse_smi_xml(_xml(real_fixtures, name), name)
    got = [(g.minor, g.bus_id, g.uuid) for g in report.gpus]
    assert got == XML_EXPECTED[name]
    assert [g.index for g in report.gpus] == list(range(len(report.gpus)))
    assert len({g.uuid for g in report.gpus}) == len(report.gpus)
    assert all(g.memory_mib > 1000 and g.name.startswith(("NVIDIA", "Tesla")) for g in report.gpus)
    assert all(g.numa_node is None and g.cpu_affinity == () for g in report.gpus)
    assert report.driver_version and report.cuda_version


def test_dual_a5000_minor_differs_from_index(real_fixtures: pathlib.Path) -> None:
    report = parse_smi_xml(_xml(real_fixtures, "dual_a5000-v13.xml"), "x")
    first = report.gpus[0]
    assert (first.index, first.minor, first.bus_id) == (0, 1, "00000000:81:00.0")
    assert first.name == "NVIDIA RTX A5000" and first.memory_mib == 24564 and first.mig_mode is None
    assert report.warnings == ()
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("590.44.01", "13.1", 2)


def test_a100_attached_gpus_mismatch_and_mig(real_fixtures: pathlib.Path) -> None:
    report = parse_smi_xml(_xml(real_fixtures, "a100-sxm4-mig-v12.xml"), "a100")
    assert report.attached_gpus == 4 and len(report.gpus) == 1
    assert len(report.warnings) == 1 and "4" in report.warnings[0] and "1 GPU" in report.warnings[0]
    gpu = report.gpus[0]
    assert gpu.mig_mode is True and gpu.memory_mib == 81920
    got = [(m.index, m.gi_id, m.ci_id) for m in gpu.mig_devices]
    assert got == [(0, 3, 0), (1, 4, 0), (2, 5, 0), (3, 6, 0)]
    assert {(m.memory_mib, m.sm_count, m.profile, m.uuid) for m in gpu.mig_devices} == {(19968, 14, "", None)}


def test_dual_2080_duplicate_uuid_becomes_synthetic(real_fixtures: pathlib.Path) -> None:
    text = _xml(real_fixtures, "dual_2080-v13.xml")
    report = parse_smi_xml(text, "dual_2080")
    second = report.gpus[1]
    assert second.uuid == synthetic_gpu_uuid("00000000:02:00.0")
    assert is_placeholder_uuid(second.uuid) and not is_placeholder_uuid(report.gpus[0].uuid)
    (warning,) = report.warnings
    assert PLACEHOLDER_AB in warning and second.uuid in warning and "00000000:02:00.0" in warning
    assert parse_smi_xml(text, "again") == report  # stable across runs


def test_mig_mode_disabled_in_xml(real_fixtures: pathlib.Path) -> None:
    text = _xml(real_fixtures, "a100-sxm4-mig-v12.xml").replace(
        "<current_mig>Enabled</current_mig>", "<current_mig>Disabled</current_mig>")
    assert parse_smi_xml(text, "x").gpus[0].mig_mode is False


def test_synthetic_uuids_do_not_collide() -> None:
    buses = ["00000000:00:00.0", "00000000:01:00.0", "00000001:00:00.0", "00000000:00:01.0",
             "00000000:00:00.1"]
    gpu_ids = {synthetic_gpu_uuid(b) for b in buses}
    mig_ids = {synthetic_mig_uuid(b, gi, ci) for b in buses for gi in (0, 1) for ci in (0, 1)}
    assert len(gpu_ids) == len(buses) and len(mig_ids) == 4 * len(buses)
    assert "GPU-00000000-0000-0000-0000-000000000000" not in gpu_ids  # the masked placeholder
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-ffff-[0-9a-f]{12}", u) for u in gpu_ids)


# --- nvidia-smi -q text ---------------------------------------------------------------------------

TEXT_EXPECTED = {
    # stem: (bus id, name, memory MiB, mig_mode, [(gi, ci, MiB, SMs)], -L profiles)
    "h200-mig": ("00000000:83:00.0", "NVIDIA H200", 143771, True,
                 [(2, 0, 71424, 16), (2, 1, 71424, 32), (3, 0, 33280, 32), (9, 0, 16384, 16),
                  (10, 0, 16384, 16)],
                 ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]),
    "h100-mig": ("00000000:00:09.0", "NVIDIA H100 80GB HBM3", 81559, True,
                 [(2, 0, 40448, 60), (3, 0, 20096, 32), (9, 0, 9984, 16), (10, 0, 9984, 16)],
                 ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
    "h100-80gb-hbm3": ("00000000:00:09.0", "NVIDIA H100 80GB HBM3", 81559, False, [], []),
    "l40s": ("00000000:01:00.0", "NVIDIA L40S", 46068, None, [], []),
}


def test_every_multi_capture_has_expectations(real_fixtures: pathlib.Path) -> None:
    stems = sorted(p.name.split("__")[0] for p in (real_fixtures / "multi").glob("*.txt"))
    assert stems == sorted(TEXT_EXPECTED)


@pytest.mark.parametrize("state", ["idle", "load"])
@pytest.mark.parametrize("stem", sorted(TEXT_EXPECTED))
def test_query_text(real_fixtures: pathlib.Path, stem: str, state: str) -> None:
    capture = _capture(real_fixtures, stem)
    report = parse_smi_query_text(_section(capture, f"{state} :: query (-q)"), capture.name)
    bus, name, memory, mig_mode, migs, _ = TEXT_EXPECTED[stem]
    (gpu,) = report.gpus
    assert (gpu.index, gpu.minor, gpu.bus_id, gpu.name, gpu.memory_mib) == (0, 0, bus, name, memory)
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu.mig_mode is mig_mode
    assert [(m.gi_id, m.ci_id, m.memory_mib, m.sm_count) for m in gpu.mig_devices] == migs
    assert [m.index for m in gpu.mig_devices] == list(range(len(migs)))
    assert report.attached_gpus == 1 and report.warnings == ()
    assert report.driver_version == capture.name.split("__")[1].removesuffix(".txt")


@pytest.mark.parametrize("stem", sorted(TEXT_EXPECTED))
def test_list_and_merge(real_fixtures: pathlib.Path, stem: str) -> None:
    capture = _capture(real_fixtures, stem)
    report = parse_smi_query_text(_section(capture, "idle :: query (-q)"), "q")
    listing = parse_smi_list(_section(capture, "capabilities :: list (-L)"), "L")
    (listed,) = listing
    assert (listed.index, listed.name) == (0, TEXT_EXPECTED[stem][1])
    merged = merge_listing(report, listing, "L")
    migs = merged.gpus[0].mig_devices
    assert [m.profile for m in migs] == TEXT_EXPECTED[stem][5]
    masked = [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(len(migs))]
    assert [m.uuid for m in migs] == masked
    assert all(MIG_PROFILE_RE.match(m.profile) for m in migs)
    assert merged.warnings == ()


def test_merge_renames_repeated_mig_uuids(real_fixtures: pathlib.Path) -> None:
    capture = _capture(real_fixtures, "h200-mig")
    report = parse_smi_query_text(_section(capture, "idle :: query (-q)"), "q")
    # The capture's README masks every UUID to zeros; older captures repeat one MIG UUID.
    masked = re.sub(r"MIG-[0-9a-f-]+", "MIG-00000000-0000-0000-0000-000000000000",
                    _section(capture, "capabilities :: list (-L)"))
    merged = merge_listing(report, parse_smi_list(masked, "L"), "L")
    uuids = [m.uuid for m in merged.gpus[0].mig_devices]
    assert uuids[0] == "MIG-00000000-0000-0000-0000-000000000000"
    assert uuids[1] == synthetic_mig_uuid("00000000:83:00.0", 2, 1)
    assert len(set(uuids)) == 5 and len(merged.warnings) == 4
    assert all("MIG device" in w for w in merged.warnings)


def test_merge_rejects_disagreeing_listing(real_fixtures: pathlib.Path) -> None:
    capture = _capture(real_fixtures, "h200-mig")
    report = parse_smi_query_text(_section(capture, "idle :: query (-q)"), "q")
    listing = parse_smi_list(_section(capture, "capabilities :: list (-L)"), "L")
    with pytest.raises(CaptureError, match="lists 2 GPU") as exc:
        merge_listing(report, listing * 2, "nvidia-smi-L.txt")
    _single_line_error(exc, "nvidia-smi-L.txt")
    with pytest.raises(CaptureError, match="MIG devices"):
        merge_listing(report, (dataclasses.replace(listing[0], migs=listing[0].migs[:4]),), "L")
    real = report.gpus[0]._replace(uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298")
    other = dataclasses.replace(listing[0], uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a")
    with pytest.raises(CaptureError, match="in nvidia-smi -L"):
        merge_listing(report._replace(gpus=(real,)), (other,), "L")


# --- bad input ------------------------------------------------------------------------------------

def test_truncated_xml(real_fixtures: pathlib.Path) -> None:
    text = _xml(real_fixtures, "dual_a5000-v13.xml")
    with pytest.raises(CaptureError, match=r"not well-formed XML: .* \(line \d+\)") as exc:
        parse_smi_xml(text[: len(text) // 2], "bundle/nvidia-smi-q.xml")
    _single_line_error(exc, "bundle/nvidia-smi-q.xml")


def test_wrong_root(real_fixtures: pathlib.Path) -> None:
    text = _xml(real_fixtures, "tesla-t4.xml").replace("nvidia_smi_log", "nvsmi")
    with pytest.raises(CaptureError, match="root element is <nvsmi>") as exc:
        parse_smi_xml(text, "t4.xml")
    _single_line_error(exc, "t4.xml")


@pytest.mark.parametrize(("old", "new", "message"), [
    (re.compile(r"<minor_number>1</minor_number>"), "", "no <minor_number>"),
    (re.compile(r"<minor_number>1</minor_number>"), "<minor_number>N/A</minor_number>",
     "expected an integer"),
    (re.compile(r"<uuid>[^<]*</uuid>"), "", "no <uuid>"),
    (re.compile(r"<total>24564 MiB</total>"), "<total>24 GiB</total>", "expected '<n> MiB'"),
    (re.compile(r"<pci_bus_id>00000000:81:00.0</pci_bus_id>"), "<pci_bus_id>bogus</pci_bus_id>",
     "not a PCI bus id"),
    (re.compile(r"<minor_number>1</minor_number>"), "<minor_number>0</minor_number>", "same minor number"),
    (re.compile(r"<!DOCTYPE[^>]*>"), '<!DOCTYPE x [<!ENTITY a "b">]>', "entities"),
])
def test_bad_xml_fields(real_fixtures: pathlib.Path, old: re.Pattern[str], new: str, message: str) -> None:
    text, count = old.subn(new, _xml(real_fixtures, "dual_a5000-v13.xml"), count=1)
    assert count == 1
    with pytest.raises(CaptureError, match=re.escape(message)) as exc:
        parse_smi_xml(text, "a5000.xml")
    _single_line_error(exc, "a5000.xml")


def test_junk_mig_profile_in_listing(real_fixtures: pathlib.Path) -> None:
    text = _section(_capture(real_fixtures, "h200-mig"), "capabilities :: list (-L)")
    with pytest.raises(CaptureError, match=re.escape("'7x.junk'")) as exc:
        parse_smi_list(text.replace("MIG 2g.35gb", "MIG 7x.junk"), "bundle/nvidia-smi-L.txt")
    _single_line_error(exc, "bundle/nvidia-smi-L.txt")


def test_listing_rejects_other_text(real_fixtures: pathlib.Path) -> None:
    text = _section(_capture(real_fixtures, "h200-mig"), "idle :: query (-q)")
    with pytest.raises(CaptureError, match="not a GPU or MIG line") as exc:
        parse_smi_list(text, "L.txt")
    _single_line_error(exc, "L.txt")


def test_query_text_rejects_other_text(real_fixtures: pathlib.Path) -> None:
    capture = _capture(real_fixtures, "l40s")
    with pytest.raises(CaptureError, match="NVSMI LOG") as exc:
        parse_smi_query_text(_section(capture, "capabilities :: list (-L)"), "q.txt")
    _single_line_error(exc, "q.txt")
    text = _section(capture, "idle :: query (-q)").replace("Minor Number", "Minor Nr", 1)
    with pytest.raises(CaptureError, match="no Minor Number"):
        parse_smi_query_text(text, "q.txt")


def test_report_is_frozen(real_fixtures: pathlib.Path) -> None:
    report = parse_smi_xml(_xml(real_fixtures, "a10g.xml"), "a10g")
    assert isinstance(report, SmiReport)
    with pytest.raises(AttributeError):
        report.gpus = ()  # type: ignore[misc]
