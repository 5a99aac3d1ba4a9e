"""The package's layers point one way: a module imports only modules of its own layer or the layers below, and no
modules import each other in a circle.

Read from the source (every `import`, at the top of a module or inside a function; a `TYPE_CHECKING` import is a
type, not a dependency), so a lazy import cannot hide an arrow back up. `LAYERS` is the architecture, bottom
first; a module belongs to the layer of the longest name in it that is a prefix of its own.
"""

from __future__ import annotations

import ast
import pathlib
import re

from tests.support.paths import REPO_ROOT

ROOT = pathlib.Path(REPO_ROOT) / "jaxgrpo"

#: The layers, bottom first: (what it is, the modules and packages in it).
LAYERS = [
    ("helpers every layer may use", ["jaxgrpo.errors", "jaxgrpo.distributed", "jaxgrpo.intervals",
                                     "jaxgrpo.profiling", "jaxgrpo.rng"]),
    ("kernels (the package root re-exports them)", ["jaxgrpo.kernels", "jaxgrpo"]),
    ("models, rewards, environments", ["jaxgrpo.models", "jaxgrpo.rewards", "jaxgrpo.envs"]),
    ("tasks and their data, the sampler and the rollout engine", ["jaxgrpo.data", "jaxgrpo.sampler", "jaxgrpo.engine"]),
    ("the method's stages: which kernel each config field selects, the fields they read",
     ["jaxgrpo.train.stages", "jaxgrpo.train.inputs", "jaxgrpo.train.trackers"]),
    ("the config (it asks the stages to check the kernels it names)", ["jaxgrpo.config"]),
    ("run machinery: run directories, checkpoints, metrics", ["jaxgrpo.run"]),
    ("training", ["jaxgrpo.train"]),
    ("evaluation and studies, the kernel catalog, the tools: run reading, checkpoint evaluation, studies, the "
     "catalog's generators, the command line, compile reports and their calibration, export",
     ["jaxgrpo.evaluation", "jaxgrpo.catalog", "jaxgrpo.tools"]),
]


def sources(root: pathlib.Path = ROOT) -> dict[str, str]:
    """{module name: source} of every module of the package under `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def _type_checking_imports(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def imports(modules: dict[str, str]) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, resolved to modules that exist (`from pkg import name` is the
    module `pkg.name` where there is one, else `pkg`)."""
    edges = {}
    for name, source in modules.items():
        tree = ast.parse(source)
        skip = _type_checking_imports(tree)
        # What a relative import is relative to: the package itself for its __init__, else the module's package.
        package = name if any(other.startswith(name + ".") for other in modules) else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        edges[name] = found
    return edges


def layer_of(module: str) -> int:
    best, layer = -1, None
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if (module == member or module.startswith(member + ".")) and len(member) > best:
                best, layer = len(member), index
    if layer is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py's LAYERS; add it to one")
    return layer


def back_arrows(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a higher layer, as 'a -> b (layer a < layer b)'."""
    return [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
            for a in sorted(edges) for b in sorted(edges[a]) if layer_of(b) > layer_of(a)]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import each other in a circle (strongly connected components of more than one)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm, iterative over each node's imports
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_layer_and_imports_none_above_it():
    assert back_arrows(imports(sources())) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(imports(sources())) == []


def test_docs_architecture_lists_the_layers():
    """docs/architecture.md's table is `LAYERS`: the same modules in the same layers, bottom first."""
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    rows = [line.split("|")[1:3] for line in text.splitlines() if re.match(r"\| [0-9]+ \|", line)]
    documented = [(int(number), re.findall(r"`([a-z_.]+)`", modules)) for number, modules in rows]
    assert documented == [(i, members) for i, (_, members) in enumerate(LAYERS)]


def test_a_planted_back_import_and_a_planted_circle_are_found():
    """The checks above fail on the arrows they exist to stop: a kernel importing the trainer (lazily, inside a
    function), and the sampler and the engine importing each other."""
    modules = sources()
    modules["jaxgrpo.kernels.kl"] += "\n\ndef _planted():\n    from jaxgrpo.train import loop\n"
    modules["jaxgrpo.sampler.requests"] += "\nfrom jaxgrpo.engine import engine\n"
    edges = imports(modules)
    assert any(arrow.startswith("jaxgrpo.kernels.kl ") and "-> jaxgrpo.train.loop " in arrow
               for arrow in back_arrows(edges))
    assert any({"jaxgrpo.sampler.requests", "jaxgrpo.engine.engine"} <= set(circle) for circle in circles(edges))
    # A type-only import is no arrow.
    modules = sources()
    modules["jaxgrpo.kernels.kl"] += "\nif TYPE_CHECKING:\n    from jaxgrpo.config import Config\n"
    assert back_arrows(imports(modules)) == []


#: A module a reader can hold in mind, and a function they can read in one screen or two.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
#: Functions allowed past MAX_FUNCTION_LINES, each with the reason stated in a comment above it.
LONG_FUNCTIONS = {"jaxgrpo.kernels.losses.sequence.disco"}


def oversized(modules: dict[str, str]) -> list[str]:
    """Every module over MAX_MODULE_LINES and every function (its docstring included) over MAX_FUNCTION_LINES that
    `LONG_FUNCTIONS` does not allow, as "name: N lines"."""
    found = []
    for module, source in modules.items():
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from `def` (a kernel's registration is its decorator's)
                if lines > MAX_FUNCTION_LINES and f"{module}.{node.name}" not in LONG_FUNCTIONS:
                    found.append(f"{module}.{node.name}: {lines} lines")
    return found


def test_no_module_over_600_lines_and_no_function_over_80():
    assert oversized(sources()) == []


def test_a_planted_long_function_and_a_planted_long_module_are_found():
    modules = sources()
    modules["jaxgrpo.kernels.kl"] += "\n\ndef _planted():\n" + "    x = 1\n" * 80
    modules["jaxgrpo.rng"] += "\n" * MAX_MODULE_LINES
    long_module = f"jaxgrpo.rng: {len(modules['jaxgrpo.rng'].splitlines())} lines"
    assert sorted(oversized(modules)) == ["jaxgrpo.kernels.kl._planted: 81 lines", long_module]
