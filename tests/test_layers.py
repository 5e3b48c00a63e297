"""The package's layers (docs/architecture.md, "The layers"): every import runs down, never up,
and no modules import each other round in a circle.

The imports are read from the source (no module is loaded): those at the top of a module,
those inside functions (loaded later, but a dependency all the same) and those only for type
checkers.  An import for type checkers never runs, so it takes no part in a circle, but it
must still run down: a layer does not name what is above it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "proxy_agent"

#: The layers, lowest first, each with the modules it holds ("x.*": the package x and all in it;
#: otherwise that module alone) and the layers below it that it may import.
LAYERS: List[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = [
    ("foundation", ("proxy_agent", "proxy_agent.cli", "proxy_agent.endpoints", "proxy_agent.config",
                    "proxy_agent.manpage", "proxy_agent.simple_line", "proxy_agent.runtime.*", "proxy_agent.frontends",
                    "proxy_agent.frontends.api", "proxy_agent.frontends.api.wire"), ()),
    ("launch", ("proxy_agent.launch",), ("foundation",)),
    ("protocol", ("proxy_agent.protocol.*",), ("foundation",)),
    ("service", ("proxy_agent.service.*",), ("foundation",)),
    ("transport", ("proxy_agent.transport",), ("foundation",)),
    ("schedulers", ("proxy_agent.schedulers.*",), ("foundation", "service")),
    ("service interface", ("proxy_agent.frontends.api.*",), ("foundation", "launch", "service", "transport")),
    ("PTP front-end", ("proxy_agent.frontends.ptp.*",), ("foundation", "protocol", "service", "transport")),
    ("Invoke Server", ("proxy_agent.frontends.invoke.*", "proxy_agent.invoke"),
     ("foundation", "service", "schedulers", "service interface")),
    ("server", ("proxy_agent.server",), ("foundation", "service", "transport", "PTP front-end")),
    ("client", ("proxy_agent.client.*",), ("foundation", "protocol", "transport")),
    ("console", ("proxy_agent.console.*",), ("foundation", "launch", "protocol", "service", "client")),
    ("job list", ("proxy_agent.joblist",), ("foundation", "service", "service interface")),
    ("agent", ("proxy_agent.__main__",),
     ("foundation", "launch", "protocol", "service", "transport", "schedulers", "PTP front-end", "server",
      "job list")),
    ("service process", ("proxy_agent.daemon", "proxy_agent.daemon_log", "proxy_agent.daemon_options"),
     ("foundation", "launch", "service", "transport", "schedulers", "service interface", "PTP front-end", "server",
      "agent")),
    ("completion", ("proxy_agent.completion",),
     ("foundation", "launch", "service", "schedulers", "console", "job list", "agent")),
]

#: The only imports that run up: ``proxy-agent``'s entry (:func:`proxy_agent.launch.entry`) is
#: the launch, which must load nothing but the standard library to join a running service, and
#: which hands every other command over to the module that runs it, inside the function that
#: hands it over.
HAND_OVERS = {
    ("proxy_agent.launch", "proxy_agent.joblist"),
    ("proxy_agent.launch", "proxy_agent.completion"),
    ("proxy_agent.launch", "proxy_agent.__main__"),
    ("proxy_agent.launch", "proxy_agent.daemon"),
}


def module_names() -> Dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


class Import:
    """One import of a module of the package by another: where, and whether it runs."""

    def __init__(self, source: str, target: str, line: int, runs: bool) -> None:
        self.source, self.target, self.line, self.runs = source, target, line, runs

    def __repr__(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}" + ("" if self.runs else " (for type checkers)")


def _targets(node: ast.AST, module: str, is_package: bool, modules: Dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "proxy_agent":
                yield alias.name
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    if origin.split(".")[0] != "proxy_agent":
        return
    for alias in node.names:
        submodule = f"{origin}.{alias.name}"
        yield submodule if submodule in modules else origin


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(modules: Dict[str, Path]) -> List[Import]:
    """Every import of one of the package's modules by another, wherever it stands."""
    found: List[Import] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, runs: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(child, module, is_package, modules):
                        if target in modules and target != module:
                            found.append(Import(module, target, child.lineno, runs))
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    for part in child.body:
                        visit(ast.Module(body=[part], type_ignores=[]), False)
                    for part in child.orelse:
                        visit(ast.Module(body=[part], type_ignores=[]), runs)
                else:
                    visit(child, runs)

        visit(ast.parse(path.read_text(), str(path)), True)
    return found


def layer_of(module: str) -> str:
    """The layer holding ``module``: the entry that names it most closely."""
    best, best_length = None, -1
    for name, members, _below in LAYERS:
        for member in members:
            if member.endswith(".*"):
                prefix = member[:-2]
                if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                    best, best_length = name, len(prefix)
            elif module == member and len(member) + 1 > best_length:
                best, best_length = name, len(member) + 1
    if best is None:
        raise LookupError(f"{module} is in no layer: place it in tests/test_layers.py and docs/architecture.md")
    return best


def upward(found: List[Import]) -> List[Import]:
    """The imports that do not run down: to a layer the importer's layer may not import."""
    allowed = {name: set(below) for name, _members, below in LAYERS}
    wrong = []
    for item in found:
        source, target = layer_of(item.source), layer_of(item.target)
        if source != target and target not in allowed[source] and (item.source, item.target) not in HAND_OVERS:
            wrong.append(item)
    return wrong


def circles(found: List[Import]) -> List[List[str]]:
    """The groups of modules that import each other round (imports that run; hand-overs left out)."""
    graph: Dict[str, Set[str]] = {}
    for item in found:
        if item.runs and (item.source, item.target) not in HAND_OVERS:
            graph.setdefault(item.source, set()).add(item.target)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def strong(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            strong(node)
    return groups


@pytest.fixture(scope="module")
def package_imports() -> List[Import]:
    return imports(module_names())


def test_every_module_is_in_a_layer():
    for module in module_names():
        layer_of(module)


def test_the_layers_are_an_order():
    seen: Set[str] = set()
    for name, _members, below in LAYERS:
        assert set(below) <= seen, f"{name} may import {sorted(set(below) - seen)}, which are not below it"
        seen.add(name)


def test_every_import_runs_down(package_imports):
    assert upward(package_imports) == []


def test_no_modules_import_each_other_round(package_imports):
    assert circles(package_imports) == []


def test_the_service_imports_nothing_of_the_schedulers_and_the_client_nothing_of_the_console(package_imports):
    for item in package_imports:
        if item.source.startswith("proxy_agent.service."):
            assert not item.target.startswith("proxy_agent.schedulers"), item
        if item.source.startswith("proxy_agent.client"):
            assert not item.target.startswith("proxy_agent.console"), item


def test_the_check_sees_what_it_looks_for(tmp_path):
    """The walk finds lazy and type-only imports, an arrow up and a circle, in a made-up package."""
    root = tmp_path / "proxy_agent"
    (root / "service").mkdir(parents=True)
    (root / "schedulers").mkdir()
    for init in (root, root / "service", root / "schedulers"):
        (init / "__init__.py").write_text("")
    (root / "service" / "service.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..schedulers.base import Backend\n"
        "def later():\n    from . import model\n")
    (root / "service" / "model.py").write_text("from .service import later\n")
    (root / "schedulers" / "base.py").write_text("from ..service import model\n")
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(tmp_path).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    found = imports(modules)
    assert {repr(item) for item in upward(found)} == {
        "proxy_agent.service.service:3 -> proxy_agent.schedulers.base (for type checkers)"}
    assert circles(found) == [["proxy_agent.service.model", "proxy_agent.service.service"]]
