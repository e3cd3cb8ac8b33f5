"""The layer tables of the README and of the design page say what the import-linter contract in
``pyproject.toml`` keeps: the same modules, layer by layer, in the same order, and every module
of ``src/nightcrew`` is in a layer (a module left out of the contract would be unchecked)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "nightcrew"


def _contract() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    [layers] = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [
        {name.strip().removeprefix("nightcrew.") for name in re.split(r"[|:]", layer)}
        for layer in layers["layers"]
    ]


def _table(doc: Path) -> list[set[str]]:
    """The modules column of the doc's layer table: `cli/`, `http.py` … as module names."""
    text = doc.read_text(encoding="utf-8")
    start = text.index("| layer | modules")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[2]
        names = re.findall(r"`([^`]+)`", cell)
        rows.append({n.removesuffix("/").removesuffix(".py") for n in names})
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/design/code.md"])
def test_the_layer_table_is_the_contract(doc: str) -> None:
    assert _table(ROOT / doc) == _contract()


def test_every_module_is_in_a_layer() -> None:
    modules = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    in_layers = set().union(*_contract())
    assert modules == in_layers
