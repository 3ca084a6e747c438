"""The README's layer list is the import-linter contract's, in the same order."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contract_layers(container: str = "gpuslurm") -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"]
                   if c["type"] == "layers" and c["containers"] == [container]]
    names: list[str] = []
    for layer in contract["layers"]:
        names += [part.strip().strip("()") for part in re.split(r"[|:]", layer)]
    return names


def _readme_layers() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("src/gpuslurm/   layers"):text.index("\nplugins/")]
    return [m.group(1) for m in re.finditer(r"^  ([a-z_]+)(?:/|\.py)\s", block, re.M)]


def test_the_readme_lists_the_contract_layers_in_order() -> None:
    assert _readme_layers() == _contract_layers()


def _present(src: Path) -> set[str]:
    present = {p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return present | {p.stem for p in src.glob("*.py") if p.stem not in ("__init__", "__main__")}


def test_every_package_and_module_is_in_a_layer() -> None:
    assert _present(ROOT / "src" / "gpuslurm") <= set(_contract_layers())


def test_every_hw_package_and_module_is_in_an_hw_layer() -> None:
    assert _present(ROOT / "src" / "gpuslurm" / "hw") == set(_contract_layers("gpuslurm.hw"))
