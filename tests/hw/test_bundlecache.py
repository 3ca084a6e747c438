"""hw.replay.bundlecache: a bundle's parsed node kept in the caller's private cache, keyed by its content."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Cpu, Gpu, Link, LinkKind, MigDevice, Node
from gpuslurm.hw.replay.bundlecache import CACHE_FILE, content_key, node_from_json
from gpuslurm.hw.source import builtin_names, bundle_path, load_node


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "node"
    shutil.copytree(str(bundle_path("dgx-h100")), path)
    return path


def _forge(cache: Path, **changes: object) -> None:
    """Rewrite the cached node's fields, keeping the key: what is loaded next shows it was read."""
    doc = json.loads((cache / CACHE_FILE).read_text())
    doc["node"] = list(node_from_json(doc["node"])._replace(**changes))
    (cache / CACHE_FILE).write_text(json.dumps(doc))


@pytest.mark.parametrize("name", builtin_names())
def test_cached_node_is_the_parsed_node(name: str, tmp_path: Path) -> None:
    parsed = load_node(name)
    first = load_node(name, cache_dir=str(tmp_path))
    assert (tmp_path / CACHE_FILE).is_file()
    again = load_node(name, cache_dir=str(tmp_path))
    assert first == parsed and again == parsed
    assert [type(g) for g in again.gpus] == [Gpu] * len(parsed.gpus)
    assert load_node(name, links=False, cache_dir=str(tmp_path)) == parsed._replace(links=None)


def test_real_captures(real_fixtures: Path, tmp_path: Path) -> None:
    xmls = sorted((real_fixtures / "nvidia-smi-q-x").glob("*.xml"))
    assert xmls
    for xml in xmls:  # minor != index (dual_a5000), MIG (a100-sxm4-mig), one GPU, two
        b = tmp_path / xml.stem
        b.mkdir()
        shutil.copy(xml, b / "nvidia-smi-q.xml")
        parsed = load_node(str(b))
        assert load_node(str(b), cache_dir=str(tmp_path / "cache")) == parsed
        assert load_node(str(b), cache_dir=str(tmp_path / "cache")) == parsed


def test_the_cache_is_read_while_the_content_is_the_same(bundle: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node(str(bundle), cache_dir=str(cache))
    _forge(cache, hostname="from-the-cache")
    os.utime(bundle / "nvidia-smi-q.xml")  # a new mtime, same bytes: still the same content
    assert load_node(str(bundle), cache_dir=str(cache)).hostname == "from-the-cache"


@pytest.mark.parametrize("change", ["edit", "same-size-edit", "add", "remove"])
def test_any_change_of_a_node_file_means_parsing_again(bundle: Path, tmp_path: Path, change: str) -> None:
    cache = tmp_path / "cache"
    load_node(str(bundle), cache_dir=str(cache))
    _forge(cache, hostname="stale")
    topo = bundle / "nvidia-smi-topo.txt"
    if change == "edit":
        topo.write_text(topo.read_text().replace("NV18", "NV6"))
    elif change == "same-size-edit":  # GPU0-GPU1 NV18 becomes NV17: same size, same second
        st_before = topo.stat()
        topo.write_text(topo.read_text().replace("NV18", "NV17", 1))
        os.utime(topo, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    elif change == "add":
        (bundle / "hostname").write_text("renamed\n")
    else:
        (bundle / "hostname").unlink()
    node = load_node(str(bundle), cache_dir=str(cache))
    assert node == load_node(str(bundle))
    assert node.hostname != "stale"


def test_other_files_are_not_part_of_the_key(bundle: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node(str(bundle), cache_dir=str(cache))
    _forge(cache, hostname="from-the-cache")
    (bundle / "scenario.json").write_text('{"steps": []}')
    (bundle / "notes.txt").write_text("an admin's note")
    assert load_node(str(bundle), cache_dir=str(cache)).hostname == "from-the-cache"


def test_a_cache_of_someone_else_is_not_read(bundle: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the cache file to another user")
    cache = tmp_path / "cache"
    load_node(str(bundle), cache_dir=str(cache))
    _forge(cache, hostname="planted")
    os.chown(cache / CACHE_FILE, 65534, 65534)
    node = load_node(str(bundle), cache_dir=str(cache))
    assert node.hostname != "planted" and node == load_node(str(bundle))


@pytest.mark.parametrize("attack", ["group-writable-dir", "symlinked-file", "symlinked-dir", "writable-file"])
def test_an_unsafe_cache_is_neither_read_nor_written_through(bundle: Path, tmp_path: Path,
                                                             attack: str) -> None:
    cache = tmp_path / "cache"
    load_node(str(bundle), cache_dir=str(cache))
    _forge(cache, hostname="planted")
    target = tmp_path / "elsewhere"
    if attack == "group-writable-dir":
        cache.chmod(0o770)
    elif attack == "writable-file":
        (cache / CACHE_FILE).chmod(0o666)
    elif attack == "symlinked-file":
        (cache / CACHE_FILE).rename(target)
        (cache / CACHE_FILE).symlink_to(target)
    else:
        cache.rename(target)
        cache.symlink_to(target)
    node = load_node(str(bundle), cache_dir=str(cache))
    assert node == load_node(str(bundle))  # parsed, not the planted one
    if attack == "symlinked-file":
        assert json.loads(target.read_text())["node"][0] == "planted"  # never written through


@pytest.mark.parametrize("payload", [b"", b"not json", b"[]", b'{"format": 1}', b"\xff\xfe",
                                     b'{"format": 1, "gpuslurm": "0.1.0", "key": "x", "node": []}'])
def test_a_malformed_cache_means_parsing_again_and_rewriting(bundle: Path, tmp_path: Path,
                                                              payload: bytes) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / CACHE_FILE).write_bytes(payload)
    (cache / CACHE_FILE).chmod(0o600)
    assert load_node(str(bundle), cache_dir=str(cache)) == load_node(str(bundle))
    assert json.loads((cache / CACHE_FILE).read_text())["key"] == content_key(str(bundle))


def test_a_bundle_file_the_reader_skips_or_refuses_is_not_cached(bundle: Path, tmp_path: Path) -> None:
    (bundle / "lscpu.csv").unlink()
    os.mkfifo(bundle / "lscpu.csv")
    assert content_key(str(bundle)) is None
    node = load_node(str(bundle), cache_dir=str(tmp_path / "cache"))  # the reader skips it
    assert node == load_node(str(bundle)) and not node.cpus
    assert not (tmp_path / "cache" / CACHE_FILE).exists()
    (bundle / "nvidia-smi-q.xml").write_bytes(b"\xff not utf-8")
    with pytest.raises(CaptureError, match="UTF-8"):
        load_node(str(bundle), cache_dir=str(tmp_path / "cache"))


def test_an_unwritable_cache_only_costs_time(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert load_node(str(bundle), cache_dir=str(tmp_path / "file" / "cache")) == load_node(str(bundle))


# --- the JSON form, both ways -----------------------------------------------------------------

_text = st.text(max_size=8)
_opt_int = st.none() | st.integers(-3, 300)
_migs = st.builds(MigDevice, st.integers(0, 7), st.integers(0, 14), st.integers(0, 7), _text,
                  st.integers(0, 80_000), st.none() | _text, _opt_int, _opt_int, _opt_int)
_gpus = st.builds(Gpu, _text, st.integers(0, 64), st.integers(0, 64), _text, _text, st.integers(0, 10**6),
                  _opt_int, st.lists(st.integers(0, 255), max_size=4).map(tuple),
                  st.none() | st.booleans(), st.lists(_migs, max_size=3).map(tuple))
_cpus = st.builds(Cpu, st.integers(0, 255), st.integers(0, 127), st.integers(0, 3), _opt_int)
_links = st.builds(Link, st.sampled_from(list(LinkKind)), st.integers(0, 18))


@st.composite
def _nodes(draw: st.DrawFn) -> Node:
    gpus = tuple(draw(st.lists(_gpus, max_size=4)))
    links = tuple(tuple(draw(_links) for _ in gpus) for _ in gpus) if draw(st.booleans()) else None
    return Node(draw(_text), gpus, tuple(draw(st.lists(_cpus, max_size=4))), links,
                draw(st.none() | _text), draw(st.none() | _text), draw(_opt_int), draw(_text),
                tuple(draw(st.lists(_text, max_size=2))))


@given(_nodes())
def test_json_round_trip(node: Node) -> None:
    back = node_from_json(json.loads(json.dumps(node)))
    assert back == node and type(back) is Node
    assert all(type(link.kind) is LinkKind for row in back.links or () for link in row)


_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=10)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=40)


@given(_json)
def test_anything_else_is_refused_with_value_or_type_error(doc: object) -> None:
    try:
        node_from_json(doc)
    except (ValueError, TypeError):
        pass


@given(_nodes(), st.data())
def test_a_value_of_the_wrong_type_is_refused(node: Node, data: st.DataObject) -> None:
    doc = json.loads(json.dumps(node))
    doc[0] = data.draw(st.integers() | st.none() | st.lists(st.integers(), max_size=1))  # hostname
    with pytest.raises((ValueError, TypeError)):
        node_from_json(doc)
