"""The shape of the package, checked from its source: the floors (no import runs back up, and the two
adapters, cli/ and outside/, never import each other), no import cycle, no module over 300 lines
(kernels excepted), no private name used across modules, and the evaluator and planners built in one
place (app/build.py).

Every ``.py`` under agent/ is parsed with ``ast``; imports inside functions count (they
run too, only later), imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

AGENT = Path(__file__).resolve().parents[1] / "agent"
PACKAGE = "optagent"
MAX_LINES = 300
KERNELS = AGENT / "search" / "strategies"  # contest submissions: one file per kernel, long by nature
BUILDER = "optagent.app.build"
# The floors, lowest first: a module may import from its own floor and the floors below it, never above.
# Floor 0 holds the records and contracts both sides of the process boundary share; worker/ is the child
# side (the untrusted candidate and the trusted judge); everything above it runs in the orchestrator.
FLOORS: list[set[str]] = [
    {"enums", "schema", "settings", "secret_env", "integrity", "messages", "timer_records", "task", "protocols", "native_copy",
     "progress", "waits", "retries", "cache", "costs", "kernel_facts", "profile_facts", "ranking", "text", "contract", "job_channel",
     ""},
    {"worker"},
    {"evaluation"},
    {"runs"},
    {"llm"},
    {"search"},
    {"report"},
    {"app"},
    {"cli", "outside"},  # the adapters: side by side, and apart (ADAPTERS)
    {"__main__"},  # the program: the adapters' commands on one parser
]
ADAPTERS = ("cli", "outside")
CONCRETE = {"SandboxEvaluator", "LocalPool", "RayPool", "LLMPlanner", "OfflinePlanner", "ReplayPlanner", "OpenAICompatLLM"}


def module_name(path: Path, root: Path = AGENT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def modules(root: Path = AGENT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, leaving out the bodies of ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _base(name: str, node: ast.ImportFrom, is_package: bool) -> Optional[str]:
    """The module a ``from X import ...`` reads from, relative imports resolved."""
    if not node.level:
        return node.module
    parts = name.split(".")
    if not is_package:
        parts.pop()
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


class Imports:
    """What one module imports from the package: the modules, and the names taken from each."""

    def __init__(self, name: str, path: Path, known: set[str]):
        self.name = name
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.targets: set[str] = set()
        self.names: list[tuple[str, str, int]] = []  # (module, name, line) for `from module import name`
        self.bound: dict[str, str] = {}  # local name -> package module it is bound to
        is_package = path.name == "__init__.py"
        for node in _nodes(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _ours(alias.name):
                        self.targets.add(_nearest(alias.name, known))
                        if alias.asname:
                            self.bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _base(name, node, is_package)
                if not base or not _ours(base):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:  # `from optagent.worker import bench`: the module itself
                        self.targets.add(sub)
                        self.bound[alias.asname or alias.name] = sub
                    else:
                        self.targets.add(_nearest(base, known))
                        self.names.append((base, alias.name, node.lineno))
        self.targets.discard(name)

    def private_uses(self) -> list[str]:
        """Underscore names this module takes from another package module."""
        out = [f"line {line}: from {base} import {n}" for base, n, line in self.names
               if _private(n) and base != self.name]
        for node in _nodes(self.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = self.bound.get(node.value.id)
                if target and target != self.name:
                    out.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({target})")
        return out

    def constructions(self) -> list[str]:
        """Where this module makes one of the CONCRETE classes."""
        out = []
        for node in _nodes(self.tree):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if called in CONCRETE:
                    out.append(f"line {node.lineno}: {called}(...)")
        return out


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _nearest(name: str, known: set[str]) -> str:
    """The module a dotted import name lands in (``optagent.x.Thing`` -> ``optagent.x``)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@lru_cache(maxsize=None)
def import_graph(root: Path = AGENT) -> dict[str, Imports]:
    found = modules(root)
    known = set(found)
    return {name: Imports(name, path, known) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in graph}
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path: list[str] = [start]
        stack = [iter(sorted(graph[start]))]
        colour[start] = GREY
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                stack.pop()
            elif colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt) == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def top(module: str) -> str:
    """A module's folder under agent/ (or its own name at the top: optagent.schema -> schema)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor_of(module: str, floors: list[set[str]] = FLOORS) -> int:
    name = top(module)
    for i, members in enumerate(floors):
        if name in members:
            return i
    raise AssertionError(f"{module}: on no floor (add agent/{name} to FLOORS in tests/test_architecture.py)")


def wrong_way(graph: dict[str, "Imports"], floors: list[set[str]] = FLOORS) -> list[str]:
    """Every import that runs up a floor, or across between the two adapters."""
    out = []
    for name, imp in sorted(graph.items()):
        for target in sorted(imp.targets):
            a, b = top(name), top(target)
            if floor_of(target, floors) > floor_of(name, floors):
                out.append(f"{name} -> {target} (floor {floor_of(name, floors)} up to {floor_of(target, floors)})")
            elif a != b and a in ADAPTERS and b in ADAPTERS:
                out.append(f"{name} -> {target} (between the adapters)")
    return out


# --- the package itself ---

def test_no_import_runs_back_up_a_floor():
    graph = import_graph()
    found = wrong_way(graph)
    assert not found, "imports against the floor order (tests/test_architecture.py FLOORS): " + "; ".join(found)



def test_no_import_cycle():
    graph = {name: imp.targets for name, imp in import_graph().items()}
    assert len(graph) > 50  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_over_300_lines():
    long = {str(p.relative_to(AGENT.parent)): n for p in modules().values()
            if KERNELS not in p.parents and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in sorted(long.items()))


def test_no_private_name_used_across_modules():
    found = [f"{name} {use}" for name, imp in import_graph().items() for use in imp.private_uses()]
    assert not found, "private names used from another module (make them public): " + "; ".join(found)


def test_the_evaluator_and_planners_are_built_in_one_place():
    graph = import_graph()
    assert graph[BUILDER].constructions()  # the builder is where they are made
    found = [f"{name} {c}" for name, imp in graph.items() if name != BUILDER for c in imp.constructions()]
    assert not found, f"concrete classes made outside {BUILDER} (use its build_* functions): " + "; ".join(found)


# --- the checks themselves can fail ---

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "agent"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "cli/__init__.py": "",
        "cli/main.py": "def build():\n    from optagent.cli.runs import add\n",
        "cli/runs.py": "from optagent.cli import main\n",
        "schema.py": "",
    })
    graph = {name: imp.targets for name, imp in import_graph(root).items()}
    assert find_cycle(graph) == ["optagent.cli.main", "optagent.cli.runs", "optagent.cli.main"]
    del graph["optagent.cli.runs"]
    graph["optagent.cli.main"] = {"optagent.schema"}
    assert find_cycle(graph) is None


def test_type_checking_imports_and_relative_imports(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from optagent import b\n",
        "b.py": "from . import a\nfrom .a import thing\n",
    })
    graph = {name: imp.targets for name, imp in import_graph(root).items()}
    assert graph["optagent.a"] == set()
    assert graph["optagent.b"] == {"optagent.a"}


def test_private_names_across_modules_are_found(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "worker/__init__.py": "",
        "worker/bench.py": "_clock = 1\ndef _own():\n    return _clock\n",
        "worker/candidate.py": "from optagent.worker import bench\nfrom optagent.worker.bench import _own, __doc__\n"
                               "t = bench._clock\nd = bench.__name__\n",
    })
    uses = import_graph(root)["optagent.worker.candidate"].private_uses()
    assert uses == ["line 2: from optagent.worker.bench import _own", "line 3: bench._clock (optagent.worker.bench)"]
    assert import_graph(root)["optagent.worker.bench"].private_uses() == []


def test_a_construction_outside_the_builder_is_found(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "cli/__init__.py": "",
                            "cli/main.py": "from optagent.evaluation import evaluator as E\n"
                                           "def f(task):\n    return E.SandboxEvaluator(task, 'cpu', [])\n"})
    assert import_graph(root)["optagent.cli.main"].constructions() == ["line 3: SandboxEvaluator(...)"]


def test_an_upward_import_and_an_import_between_the_adapters_are_found(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "", "schema.py": "", "worker/__init__.py": "", "evaluation/__init__.py": "",
        "cli/__init__.py": "", "outside/__init__.py": "",
        "worker/judge.py": "def f():\n    from optagent.evaluation import checks\n",  # lazy, still counted
        "evaluation/checks.py": "from optagent import schema\n",
        "evaluation/pool.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from optagent.cli import views\n",
        "cli/views.py": "from optagent.outside import server\n",
        "outside/server.py": "from optagent.evaluation import checks\n",
    })
    assert wrong_way(import_graph(root)) == [
        "optagent.cli.views -> optagent.outside.server (between the adapters)",
        "optagent.worker.judge -> optagent.evaluation.checks (floor 1 up to 2)",
    ]
    (root / "worker" / "judge.py").write_text("from optagent import schema\n")
    (root / "cli" / "views.py").write_text("from optagent.evaluation import checks\n")
    import_graph.cache_clear()
    assert wrong_way(import_graph(root)) == []
