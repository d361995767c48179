"""agentbolt's modules import one way: no cycle among runtime imports, top-level packages in layers.

The rules (also in docs/architecture.md, "Module layering"): no cycle among modules nor among top-level packages;
``semconv``, ``env_var`` and ``types`` import nothing of agentbolt's, ``utils`` and ``store`` only what lies below
them; nothing imports ``agentbolt.cli`` (the top), and its command modules do not import ``cli/app.py``.

Imports are read from the source with :mod:`ast`, so the test needs no optional dependency. Every ``import`` and
``from ... import`` counts, wherever it sits (module level or inside a function), except in an
``if TYPE_CHECKING:`` block: those never run. ``from package import name`` is an import of ``package.name`` when
that is a module of ours, else of ``package``; importing ``a.b.c`` is an edge to ``a.b.c`` only (the parent
packages' ``__init__`` modules are not counted as separate edges).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

import agentbolt

ROOT = Path(agentbolt.__file__).resolve().parent
PACKAGE = "agentbolt"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_modules() -> Dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking_test(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_import_nodes(tree: ast.AST) -> Iterator[ast.stmt]:
    """Import statements that can run: everything but the body of ``if TYPE_CHECKING:`` blocks."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking_test(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> Optional[str]:
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def runtime_imports(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    """The graph of runtime imports among agentbolt's own modules: module name -> imported module names."""
    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: Set[str] = set()
        for node in _runtime_import_nodes(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            assert isinstance(node, ast.ImportFrom)
            source = _resolve_from(module, path.name == "__init__.py", node)
            if source is None:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in modules else source)
        graph[module] = {target for target in targets if target in modules and target != module}
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _describe(graph: Dict[str, Set[str]], component: List[str]) -> str:
    members = set(component)
    edges = [f"  {source} -> {target}" for source in component for target in sorted(graph[source] & members)]
    return "\n".join([f"cycle of {len(component)} modules:", *edges])


@pytest.fixture(scope="module")
def graph() -> Dict[str, Set[str]]:
    return runtime_imports(_all_modules())


def test_runtime_imports_form_no_cycle(graph: Dict[str, Set[str]]) -> None:
    cycles = find_cycles(graph)
    assert not cycles, "\n".join(_describe(graph, component) for component in cycles)


def _top_level(module: str) -> str:
    """The top-level package or module of ``module`` (``agentbolt.store.sqlite`` -> ``agentbolt.store``)."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    packages: Dict[str, Set[str]] = {_top_level(module): set() for module in graph}
    for source, targets in graph.items():
        packages[_top_level(source)].update(_top_level(target) for target in targets)
    for package, targets in packages.items():
        targets.discard(package)
    return packages


def test_top_level_packages_form_layers(graph: Dict[str, Set[str]]) -> None:
    packages = _package_graph(graph)
    cycles = find_cycles(packages)
    assert not cycles, "\n".join(_describe(packages, component) for component in cycles)


# What the lowest layers may import of agentbolt (anything else is above them).
BOTTOM_LAYERS: Dict[str, Set[str]] = {
    f"{PACKAGE}.semconv": set(),
    f"{PACKAGE}.env_var": set(),
    f"{PACKAGE}.types": set(),
    f"{PACKAGE}.utils": {f"{PACKAGE}.types", f"{PACKAGE}.semconv", f"{PACKAGE}.env_var"},
    f"{PACKAGE}.store": {f"{PACKAGE}.types", f"{PACKAGE}.utils", f"{PACKAGE}.env_var"},
}


@pytest.mark.parametrize("package", sorted(BOTTOM_LAYERS))
def test_bottom_layers_import_only_what_lies_below(graph: Dict[str, Set[str]], package: str) -> None:
    assert _package_graph(graph)[package] <= BOTTOM_LAYERS[package]


def test_nothing_below_the_cli_imports_it(graph: Dict[str, Set[str]]) -> None:
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if not source.startswith(f"{PACKAGE}.cli") and source != f"{PACKAGE}.__main__"
        for target in targets
        if target == f"{PACKAGE}.cli" or target.startswith(f"{PACKAGE}.cli.")
    )
    assert not upward, upward


def test_cli_commands_do_not_import_the_application(graph: Dict[str, Set[str]]) -> None:
    app = f"{PACKAGE}.cli.app"
    importers = sorted(source for source, targets in graph.items() if app in targets)
    assert importers == [f"{PACKAGE}.cli"], importers


def test_the_checker_sees_imports_inside_functions_and_skips_type_checking_blocks(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"}

    assert runtime_imports(modules) == {"pkg": set(), "pkg.a": set(), "pkg.b": {"pkg.a"}}
    assert find_cycles(runtime_imports(modules)) == []
    (package / "a.py").write_text("from pkg import b\n")
    assert find_cycles(runtime_imports(modules)) == [["pkg.a", "pkg.b"]]
