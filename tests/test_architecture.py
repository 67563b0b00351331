"""The code's shape as docs/architecture.md states it: no import cycle in the plugin or the trainer,
the plugin's packages importing only lower layers, the trainer never importing the plugin, and the
plugin's size limits (at most 10 top-level modules, 12 per package)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A package may import its own modules and those of lower layers only (docs/architecture.md).
LAYERS: dict[str, int] = {
    "records": 0,
    "markers": 0,
    "frameworks": 0,  # frameworks/__init__.py: the frameworks' names, read by every layer
    "verdict": 1,
    "options": 2,
    "reports": 2,
    "session": 3,
    "frameworks.*": 3,  # the adapters, fixtures and the end of a several-framework session
    "hookspec": 3,
    "plugin": 4,
}


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its __init__)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """The known modules ``module`` imports anywhere in its file (TYPE_CHECKING and functions too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        yield from (n for n in names if n in known and n != module)


def graph(*packages: str) -> dict[str, set[str]]:
    mods = {name: path for package in packages for name, path in modules(package).items()}
    return {name: set(imported(name, path, set(mods))) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> int:
    parts = module.split(".")[1:]  # without "pytest_rlbench"
    if not parts:
        return 0
    if parts[0] == "frameworks" and len(parts) > 1:
        return LAYERS["frameworks.*"]
    return LAYERS[parts[0]]


@pytest.mark.parametrize("package", ["pytest_rlbench", "trainer"])
def test_no_import_cycle(package: str) -> None:
    assert cycles(graph(package)) == []


def test_the_plugin_s_packages_import_only_lower_layers() -> None:
    edges = graph("pytest_rlbench")
    upward = [
        f"{a} -> {b}"
        for a, targets in edges.items()
        for b in sorted(targets)
        if a.split(".")[:2] != b.split(".")[:2] and layer(b) > layer(a)
    ]
    assert upward == []


def test_the_trainer_never_imports_the_plugin() -> None:
    mods = modules("trainer")
    plugin = set(modules("pytest_rlbench"))
    found = {m: sorted(set(imported(m, path, plugin))) for m, path in mods.items()}
    assert {m: names for m, names in found.items() if names} == {}


def test_the_plugin_s_size_limits() -> None:
    top = sorted(p.name for p in (ROOT / "pytest_rlbench").glob("*.py"))
    assert len(top) <= 10, top
    for package in sorted(p for p in (ROOT / "pytest_rlbench").iterdir() if (p / "__init__.py").is_file()):
        own = sorted(p.name for p in package.glob("*.py"))
        assert len(own) <= 12, (package.name, own)


def test_the_bundled_trainer_and_the_trl_adapter_satisfy_the_trainer_contract() -> None:
    """What the suites call on a trainer, checked on the classes (the methods) and on what an instance
    sets (the attributes); the TRL adapter may lack the method of a phase it declares absent."""
    from pytest_rlbench.frameworks.protocol import PHASE_OF_METHOD, TrainerUnderTest, missing_members
    from trainer.driver.grpo_trainer import GRPOTrainer
    from trainer.phases import PHASE_KEYS

    assert set(PHASE_OF_METHOD.values()) <= set(PHASE_KEYS)
    methods = [n for n in vars(TrainerUnderTest) if not n.startswith("_")]
    assert [n for n in methods if not callable(getattr(GRPOTrainer, n, None))] == []

    class Partial:  # a user's trainer that forgot one phase method and declares nothing absent
        cfg = loader = last_batch = None
        uses_ref = True

    missing = missing_members(Partial())
    assert "compute_advantage" in missing and "cfg" not in missing
    Partial.absent_phases = {"adv": "computed inline"}
    assert "compute_advantage" not in missing_members(Partial())
