"""The package's module graph: imports go one way, with no cycle; trainers ask the registries.

Every import counts, those inside functions included (only ``if TYPE_CHECKING:`` blocks are
left out), so no import inside a function can be hiding a cycle. A module importing one of
its own parent packages is not an edge: Python has imported the parents first anyway.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "envs": "searchgym.envs",
    "memory": "searchgym.memory",
    "policies": "searchgym.policies",
    "trainers": "searchgym.trainers",
    "configs": "searchgym.configs",
    "searchgym": "searchgym",
}


def _module_name(path: Path, root: Path, packages: dict[str, str]) -> str:
    rel = path.relative_to(root)
    parts = [*rel.parts[1:-1], rel.stem]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([packages[rel.parts[0]], *parts])


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(name: str, path: Path) -> set[str]:
    """Every dotted name ``path`` imports (a ``from`` import adds the module and module.name)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def import_graph(root: Path = ROOT, packages: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    """``{module: package modules it imports}`` over the whole package."""
    modules = {_module_name(p, root, packages): p for top in packages for p in (root / top).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in _imported(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_graph_sees_a_cycle_closed_inside_a_function(tmp_path):
    """The checker itself: two modules whose only link back is an import inside a function."""
    pkg = tmp_path / "trainers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from .a import x\n")
    assert cycles(import_graph(tmp_path, {"trainers": "searchgym.trainers"})) == [
        ["searchgym.trainers.a", "searchgym.trainers.b"]
    ]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"import cycles (imports inside functions included): {found}"


def test_imports_go_one_way_between_the_layers():
    order = ["searchgym.envs", "searchgym.memory", "searchgym.policies", "searchgym.trainers"]
    graph = import_graph()
    for name, edges in graph.items():
        layer = next((i for i, top in enumerate(order) if name == top or name.startswith(top + ".")), None)
        if layer is None:
            continue
        for target in edges:
            later = [top for top in order[layer + 1 :] if target == top or target.startswith(top + ".")]
            assert not later, f"{name} imports {target}, a layer above it"


def _scheme_names() -> set[str]:
    from searchgym.envs.rewards import REWARDS
    from searchgym.memory.config import MEMORY_KINDS
    from searchgym.trainers.advantages import ESTIMATORS

    return (set(REWARDS) | set(MEMORY_KINDS) | set(ESTIMATORS)) - {"none"}


def _name_branches(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Comparisons of a value with a scheme's name (``x == "lightsearcher"``, ``x in ("tsas",)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        constants = []
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            constants += [c.value for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        hits = sorted(set(constants) & names)
        if hits:
            found.append(f"{path.relative_to(root)}:{node.lineno} compares with {hits}")
    return found


@pytest.mark.parametrize(
    "path", sorted((ROOT / "trainers").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_trainers_ask_the_registries_instead_of_branching_on_scheme_names(path):
    assert _name_branches(path, _scheme_names()) == []


def test_the_branch_finder_finds_a_branch(tmp_path):
    path = tmp_path / "x.py"
    path.write_text('if reward == "lightsearcher" or kind in ("hiexp", "x"):\n    pass\n')
    assert _name_branches(path, {"lightsearcher", "hiexp"}, tmp_path) == [
        "x.py:1 compares with ['lightsearcher']",
        "x.py:1 compares with ['hiexp']",
    ]
