"""Every ``--json`` output is one object with ``schema`` and (for one node) ``node``, and matches its
JSON Schema in gpuslurm/schemas: checked on the real captures of ../shared/fixtures/real (and the
built-in bundles where a real capture lacks what a command needs, MIG for pick), run through the
real commands."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
from tests.helpers.report_helpers import CONFIG as REPORT_CONFIG
from tests.helpers.report_helpers import END, T0, make_store
from tests.helpers.scheduler_stand_in import no_jobs_config

from gpuslurm.cli.main import cli, main
from gpuslurm.cli.pick_cmd import main as pick_main
from gpuslurm.hw.source import load_node
from gpuslurm.jsondoc import VERSIONS, schema_id, schema_path

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"
XMLS = sorted(p.name for p in (SHARED / "nvidia-smi-q-x").glob("*.xml")) if SHARED.is_dir() else []
MULTI = sorted(p.name for p in (SHARED / "multi").glob("*.txt")) if SHARED.is_dir() else []
PLACEMENT_INPUT = Path(__file__).resolve().parents[1] / "place" / "data" / "scontrol-show-d-job-l40s.txt"

# Each click command that prints JSON, and the shape it prints; pick (no click) is separate.
JSON_COMMANDS = {
    ("discover",): "discover", ("topo",): "topo", ("mig", "show"): "mig-show",
    ("gpu", "list"): "gpu-list", ("health",): "health", ("status",): "status",
    ("monitor",): "monitor-cycle", ("placement",): "placement", ("hogs",): "hogs",
    ("throttle", "list"): "throttle-list", ("fairshare-report",): "fairshare-report",
    ("jobstats",): "jobstats",
}


def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(schema_path(name)).read_text())
    return loaded


def check(name: str, doc: Any) -> dict[str, Any]:
    """``doc`` validated against the schema ``name`` (and its ``schema`` value that name's id)."""
    jsonschema.validate(doc, schema(name), cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == schema_id(name)
    assert isinstance(doc, dict)
    return doc


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config of this test's own: a stand-in squeue (no jobs), state and run directories here."""
    config = no_jobs_config(tmp_path)
    monkeypatch.setenv("GPUSLURM_CONFIG", str(config))
    monkeypatch.delenv("GPUSLURM_CAPTURE", raising=False)
    monkeypatch.delenv("GPUSLURM_SCENARIO", raising=False)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str, ok: tuple[int, ...] = (0,)) -> Any:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code in ok, err
    return json.loads(out)


def xml_bundle(tmp_path: Path, name: str) -> str:
    bundle = tmp_path / name.removesuffix(".xml")
    bundle.mkdir()
    shutil.copy(SHARED / "nvidia-smi-q-x" / name, bundle / "nvidia-smi-q.xml")
    return str(bundle)


@pytest.mark.parametrize("name", XMLS)
def test_node_views_of_each_real_capture_match_their_schemas(
        site: Path, real_fixtures: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    bundle = xml_bundle(site, name)
    node = load_node(bundle, links=False).hostname
    for args, shape in [(["discover"], "discover"), (["topo"], "topo"), (["mig", "show"], "mig-show"),
                        (["gpu", "list"], "gpu-list"), (["status"], "status")]:
        doc = check(shape, run(capsys, *args, "--from", bundle, "--json"))
        if shape != "status":  # status's node is the Slurm node it runs on (issue 21's view bullets)
            assert doc["node"] == node
    health = check("health", run(capsys, "health", "--from", bundle, "--json", ok=(0, 1)))
    assert [g["uuid"] for g in health["gpus"]] == [g.uuid for g in load_node(bundle, links=False).gpus]
    assert check("monitor-cycle", _monitor_once(capsys, bundle))["gpus"]


def _monitor_once(capsys: pytest.CaptureFixture[str], bundle: str) -> Any:
    capsys.readouterr()
    assert main(["monitor", "--once", "--json", "--from", bundle]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


@pytest.mark.parametrize("name", MULTI)
def test_topo_and_discover_of_each_imported_capture_match(
        site: Path, real_fixtures: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    bundle = site / "bundle"
    assert main(["capture", "import", str(real_fixtures / "multi" / name), str(bundle)]) == 0
    check("topo", run(capsys, "topo", "--from", str(bundle), "--json"))
    check("discover", run(capsys, "discover", "--from", str(bundle), "--json"))
    check("mig-show", run(capsys, "mig", "show", "--from", str(bundle), "--json"))


def test_pick_json_matches_on_a_real_capture_and_on_mig(
        site: Path, real_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = xml_bundle(site, "dual_a5000-v13.xml")
    for argv in (["1", "--from", bundle, "--format", "json"],
                 ["2", "--from", "a100-mig", "--mig", "1g.10gb", "--format", "json"]):
        capsys.readouterr()
        assert pick_main(argv) == 0
        doc = check("pick", json.loads(capsys.readouterr().out))
        assert doc["node"] == load_node(argv[2], links=False).hostname


def test_placement_json_matches(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = check("placement", run(capsys, "placement", "--from", "l40s-4x", "--node", "l40s01",
                                 "--input", str(PLACEMENT_INPUT), "--json"))
    assert doc["node"] == "l40s01" and len(doc["jobs"]) == 3  # the recording's node and its jobs


@pytest.fixture
def rogue_seen(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """One real monitor cycle in which a real process of no job uses GPU 3 of dgx-h100."""
    sleeper = subprocess.Popen(["/bin/sleep", "60"])
    gpu = load_node("dgx-h100").gpus[3].uuid
    scenario = site / "scenario.json"
    scenario.write_text(json.dumps({"gpus": {gpu: {"util": 97}},
                                    "procs": [{"pid": sleeper.pid, "gpu": gpu, "mem_mib": 4000}]}))
    monkeypatch.setenv("GPUSLURM_SCENARIO", str(scenario))
    monkeypatch.setenv("GPUSLURM_CAPTURE", "dgx-h100")
    assert main(["monitor", "--once"]) == 0
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def test_hogs_json_matches_from_the_store_and_the_shared_directory(
        site: Path, rogue_seen: int, capsys: pytest.CaptureFixture[str]) -> None:
    doc = check("hogs", run(capsys, "hogs", "--json"))
    assert [v["pid"] for v in doc["violations"]] == [rogue_seen]
    shared = check("hogs", run(capsys, "hogs", "--json", "--violations-dir", str(site / "violations")))
    assert [v["pid"] for v in shared["violations"]] == [rogue_seen]


def test_throttle_list_json_matches(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(site / "throttle")
    capsys.readouterr()
    assert main(["throttle", "add", "alice", "--file", path, "--for", "2h", "--cap", "2",
                 "--reason", "fair share"]) == 0
    doc = check("throttle-list", run(capsys, "throttle", "list", "--file", path, "--json"))
    assert [(t["user"], t["mode"], t["value"]) for t in doc["throttles"]] == [("alice", "cap", 2)]


def test_fairshare_report_json_matches(site: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = site / "report.toml"
    cfg.write_text(REPORT_CONFIG)
    monkeypatch.setenv("GPUSLURM_CONFIG", str(cfg))
    db = make_store(site / "monitor.db", rolled=True)
    for by in ("user", "process"):
        window = ["--since", f"@{int(T0)}", "--until", f"@{int(END)}"]
        doc = check("fairshare-report", run(capsys, "fairshare-report", "--db", str(db), *window, "--by", by,
                                            "--format", "json"))
        assert doc["rows"]


def test_jobstats_json_matches(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(make_store(site / "monitor.db", rolled=True))
    for job in ("1", "2", "3"):
        doc = check("jobstats", run(capsys, "jobstats", job, "--db", db, "--json"))
        assert doc["job"]["id"] == job and doc["node"] == "n1"


def _json_commands(group: click.Group, ctx: click.Context,
                   path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _json_commands(command, ctx, (*path, name))
            continue
        for param in command.params:
            choices = getattr(param.type, "choices", ())
            if param.name == "as_json" or (isinstance(param, click.Option) and "json" in choices):
                yield (*path, name)


def test_every_json_output_has_a_schema_and_a_test_here() -> None:
    with click.Context(cli) as ctx:
        found = set(_json_commands(cli, ctx, ()))
    assert found == set(JSON_COMMANDS)
    assert set(VERSIONS) == {*JSON_COMMANDS.values(), "pick"}
    for name in VERSIONS:
        jsonschema.Draft202012Validator.check_schema(schema(name))
        assert schema(name)["properties"]["schema"] == {"const": schema_id(name)}


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_an_output_missing_a_required_key_fails_its_schema(name: str) -> None:
    """Each schema's required keys, taken away one at a time from a document that otherwise
    passes, fail validation; so does the old bare-list shape."""
    shape = schema(name)
    required = shape["required"]
    assert {"schema", "node"} & set(required) == ({"schema"} if name in ("hogs", "throttle-list",
                                                                          "fairshare-report")
                                                  else {"schema", "node"})
    validator = jsonschema.Draft202012Validator(shape)
    assert not validator.is_valid([])
    good = _minimal(shape, shape)
    assert validator.is_valid(good), list(validator.iter_errors(good))
    for key in required:
        assert not validator.is_valid({k: v for k, v in good.items() if k != key}), key


def _minimal(node: dict[str, Any], root: dict[str, Any]) -> Any:
    """The smallest document ``node`` accepts (required keys only, empty arrays)."""
    if "$ref" in node:
        return _minimal(root["$defs"][node["$ref"].rsplit("/", 1)[1]], root)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node["enum"][0]
    kind = node.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        return {k: _minimal(node["properties"][k], root) for k in node.get("required", [])}
    return {"array": [], "string": "x", "integer": 0, "number": 0.0, "boolean": False, "null": None,
            None: None}[kind]


def test_a_real_output_missing_its_node_fails(site: Path, real_fixtures: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    doc = check("discover", run(capsys, "discover", "--from", xml_bundle(site, "tesla-t4.xml"), "--json"))
    del doc["node"]
    with pytest.raises(jsonschema.ValidationError, match="'node' is a required property"):
        check("discover", doc)
    renamed = {"hostname" if k == "node" else k: v for k, v in doc.items()}
    assert not jsonschema.Draft202012Validator(schema("discover")).is_valid(renamed)
