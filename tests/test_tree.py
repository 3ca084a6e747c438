"""tests/ mirrors src/gpuslurm: each folder is named after the layer whose code it tests, or is an
end-to-end suite or the helper package; no test module imports another (issue 20, item 5).

The tests of the small top-level modules (errors, names, safedir, times, tuples, ...) and the
checks of the tree itself are the files in tests/ itself; a top-level module with many tests has a
folder of its name (tests/install). A folder under a layer's folder (data, the replay
NVML suite tests/hw/nvml) belongs to that layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The suites that start real clusters or daemons, each in a folder of its own.
E2E = frozenset({
    "cluster",  # the Slurm test cluster (tests/helpers/cluster_fixture.py), every release in .ci/matrix
    "docker_slurm",  # docker-slurm's image
    "multinode",  # three Slurm nodes in namespaces of their own (tests/helpers/multinode_fixture.py)
    "pbs_cluster",  # the OpenPBS test cluster (tests/helpers/pbs_fixture.py)
    "prometheus",  # a real Prometheus scraping a monitor
})
HELPERS = "helpers"
# Scripts in tests/ that are neither tests nor helpers.
SCRIPTS = frozenset({"py_matrix.py"})


def layers(src: Path = ROOT / "src" / "gpuslurm") -> set[str]:
    """The packages and top-level modules of src/gpuslurm (the import-linter contract's layers)."""
    packages = {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    return packages | {p.stem for p in src.glob("*.py") if p.stem not in ("__init__", "__main__")}


def misnamed_folders(tests: Path, allowed: set[str]) -> list[str]:
    """The folders of ``tests`` named after no layer, e2e suite or the helper package."""
    return sorted(p.name for p in tests.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "__")) and p.name not in allowed)


def stray_helpers(tests: Path) -> list[str]:
    """Modules outside tests/helpers that are neither tests, conftest.py nor a known script."""
    out = []
    for path in tests.rglob("*.py"):
        rel = path.relative_to(tests)
        if rel.parts[0] == HELPERS or path.name.startswith("test_"):
            continue
        if path.name in ("conftest.py", "__init__.py"):
            continue
        if len(rel.parts) == 1 and path.name in SCRIPTS:
            continue
        out.append(str(rel))
    return sorted(out)


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import, at any depth; a relative import is written with its dots."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(out)


def bad_imports(tests: Path) -> list[str]:
    """Imports of a test module or a conftest, relative imports, and helpers imported by another
    name than ``tests.helpers.X``."""
    helper_names = {p.stem for p in (tests / HELPERS).glob("*.py")} | {
        p.name for p in (tests / HELPERS).iterdir() if p.is_dir() and not p.name.startswith("__")}
    out = []
    for path in sorted(tests.rglob("*.py")):
        for line, module in _imported(ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            where = f"{path.relative_to(tests.parent)}:{line}: {module}"
            if module.startswith("."):
                out.append(f"{where} (a relative import)")
            elif any(p.startswith("test_") or p == "conftest" for p in parts):
                out.append(f"{where} (a test module)")
            elif parts[0] in helper_names or (parts[0] != "tests" and HELPERS in parts):
                out.append(f"{where} (import it as tests.helpers.{parts[-1]})")
    return out


def test_every_folder_is_a_layer_an_e2e_suite_or_the_helpers() -> None:
    assert misnamed_folders(TESTS, layers() | E2E | {HELPERS}) == []


def test_the_e2e_suites_are_folders_here() -> None:
    assert all((TESTS / name).is_dir() for name in E2E), sorted(n for n in E2E if not (TESTS / n).is_dir())


def test_every_helper_module_is_in_tests_helpers() -> None:
    assert stray_helpers(TESTS) == []


def test_no_test_module_imports_another_and_helpers_are_imported_one_way() -> None:
    assert bad_imports(TESTS) == []


def test_the_checks_see_what_they_are_for(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / HELPERS).mkdir(parents=True)
    (tests / HELPERS / "site.py").write_text("X = 1\n")
    for folder in ("watch", "act", "cluster"):
        (tests / folder).mkdir()
    (tests / "watch" / "test_a.py").write_text("from tests.helpers.site import X\n")
    (tests / "watch" / "test_b.py").write_text(
        "from test_a import X\n"
        "def f():\n    from tests.watch.conftest import Y\n"
        "from . import z\n"
        "import site\n")
    (tests / "watch" / "stray.py").write_text("")
    assert misnamed_folders(tests, {"watch", "cluster", HELPERS}) == ["act"]
    assert stray_helpers(tests) == ["watch/stray.py"]
    assert [b.split(": ", 1)[1] for b in bad_imports(tests)] == [
        "test_a (a test module)", "tests.watch.conftest (a test module)", ". (a relative import)",
        "site (import it as tests.helpers.site)"]
