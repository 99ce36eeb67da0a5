"""The package's import graph has no cycles, between modules or between its parts.

A cycle is what makes a module impossible to read (or test) alone: ``publish`` needing
``worker`` needing ``publish``. The graph is read from the source (imports at module
level; those under ``if TYPE_CHECKING:`` or inside a function are deliberate late
bindings and left out), so the test needs nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import celery_aitp

PACKAGE = Path(celery_aitp.__file__).parent
#: The parts that must not depend on one another in a circle, and the core they share.
CORE = "celery_aitp.core"
ABOVE_CORE = ("celery_aitp.publish", "celery_aitp.worker", "celery_aitp.predict",
              "celery_aitp.middleware")


def module_names() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    statements: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Try):
            statements.extend(_module_level(node.body))
        else:
            statements.append(node)
    return statements


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base in modules:
                found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names
                         if f"{base}.{a.name}" in modules)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def part_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    assert cycles(graph()) == []


def test_no_two_parts_of_the_package_import_each_other():
    parts: dict[str, set[str]] = {}
    for module, targets in graph().items():
        parts.setdefault(part_of(module), set()).update(
            part_of(t) for t in targets if part_of(t) != part_of(module))
    assert cycles(parts) == []


def test_the_core_depends_on_none_of_the_parts_built_on_it():
    edges = graph()
    core = {m: t for m, t in edges.items() if part_of(m) == CORE}
    assert core, "celery_aitp.core is missing"
    leaks = {m: sorted(t for t in targets if part_of(t) in ABOVE_CORE)
             for m, targets in core.items()}
    assert {m: t for m, t in leaks.items() if t} == {}
