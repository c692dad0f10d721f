"""The structure of the library, checked by reading its source with `ast` (nothing here imports minitensor).

The layers, ground up; a module may import its own layer and the layers below it, never one above:

    L0 minitensor.base      errors, dtypes, the device value type, C-extension builder, disk cache
    L1 minitensor.backends  the Driver protocol, nvidia, sim
    L2 minitensor.allocator caching policy over the Driver protocol        (folder allocator/)
    L3 minitensor.kernels   @triton.jit sources, launcher, plans           (folder kernels/)
    L4 minitensor.cuda      the runtime and the torch.cuda face
    L5 minitensor.core      fields, storage, layout numbers, shape arithmetic
    L6 minitensor.ops, minitensor.interop
    L7 minitensor.tensor, minitensor.creation
    L8 minitensor.serialization
    L9 minitensor           the package __init__, accelerator.py, nn, distributed: the public face

Why: the runtime (backends, allocator, kernels, cuda) then never knows tensors or ops, the import graph has no
circles, and no import has to hide inside a function to dodge one. `kernels/` and `allocator/` are installed as
`minitensor.kernels` and `minitensor.allocator` (pyproject's package-dir), so the scanner maps those folders
itself. Imports inside functions, `importlib.import_module` and `__import__` with a constant name count.
"""
import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"minitensor.base": 0, "minitensor.backends": 1, "minitensor.allocator": 2, "minitensor.kernels": 3,
          "minitensor.cuda": 4, "minitensor.core": 5, "minitensor.ops": 6, "minitensor.interop": 6,
          "minitensor.tensor": 7, "minitensor.creation": 7, "minitensor.serialization": 8, "minitensor": 9,
          "minitensor.memory_viz": 9, "minitensor.accelerator": 9, "minitensor.nn": 9,
          "minitensor.distributed": 9}
# one module each; the others are folders
FILE_LAYERS = {"minitensor.tensor", "minitensor.creation", "minitensor", "minitensor.accelerator"}

# R2-R7: (importer, "only" or "never", targets); a package may always import itself
RULES = [
    ("minitensor.base", "only", ()),
    ("minitensor.memory_viz", "only", ("minitensor.base",)),  # a tool for snapshot files, no part of the runtime
    ("minitensor.allocator", "only", ("minitensor.base",)),
    ("minitensor.backends", "only", ("minitensor.base",)),
    ("minitensor.kernels", "only", ("minitensor.base", "minitensor.backends")),
    ("minitensor.cuda", "never", ("minitensor.core", "minitensor.ops", "minitensor.interop", "minitensor.tensor",
                                  "minitensor.creation", "minitensor.serialization")),
    ("minitensor.ops", "never", ("minitensor.tensor", "minitensor.creation")),
    ("minitensor.interop", "never", ("minitensor.tensor", "minitensor.creation")),
]
LAZY_MARK, MAX_LAZY = "# lazy: import cost", 10
DRIVER_NAMES, DRIVER_CALLS = {"driver", "_driver"}, {"active_driver", "driver", "_driver"}
DRIVER_IMPLEMENTATIONS = {"minitensor/backends/nvidia.py", "minitensor/backends/sim.py",  # call their own helpers
                          "minitensor/backends/sim_graphs.py", "minitensor/backends/sim_vmm.py"}
NO_WAY_OUT = ("README.md", "docs", "minitensor", "kernels", "allocator")  # may not cite ../shared or reference/


# ------------------------------------------------------------------------------------ the scanner
@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_pkg: bool
    tree: ast.Module
    lines: list


@dataclass(frozen=True)
class Import:
    line: int
    end_line: int
    target: str  # dotted, relative imports resolved; `from a import b` gives a.b
    in_function: bool


def within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def package_dirs(root):
    """{package: folder}: `minitensor` itself plus pyproject's [tool.setuptools.package-dir] entries."""
    text = (root / "pyproject.toml").read_text()
    section = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    pairs = re.findall(r'^"?([\w.]+)"?\s*=\s*"([^"]+)"', section.group(1), re.M) if section else []
    return {"minitensor": root / "minitensor", **{pkg: root / folder for pkg, folder in pairs}}


def scan(dirs):
    """{dotted name: Module} for every .py under each package folder."""
    modules = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *(p for p in parts if p != "__init__")))
            text = path.read_text()
            modules[name] = Module(name, path, path.name == "__init__.py", ast.parse(text), text.splitlines())
    return modules


def _absolute(module, name, level):
    """The absolute name of `from <level dots><name> import ...` written in `module`."""
    if not level:
        return name
    parts = module.name.split(".") if module.is_pkg else module.name.split(".")[:-1]
    return ".".join(parts[:len(parts) - level + 1] + ([name] if name else []))


def _dynamic_target(module, call):
    """`importlib.import_module("x")`, `import_module("x")` or `__import__("x")` with a constant name."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    level = len(arg.value) - len(arg.value.lstrip("."))  # relative: as if package=__package__
    return _absolute(module, arg.value[level:], level)


def imports(module):
    """Every import in `module`, at any depth; `in_function` when an enclosing scope is a function."""
    found = []

    def visit(node, in_function):
        end = getattr(node, "end_lineno", None)
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, end, a.name, in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.module, node.level)
            found.extend(Import(node.lineno, end, f"{base}.{a.name}", in_function) for a in node.names)
        elif isinstance(node, ast.Call) and (target := _dynamic_target(module, node)):
            found.append(Import(node.lineno, end, target, in_function))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(module.tree, False)
    return found


def resolve(target, modules):
    """The scanned module an import runs: the longest known prefix, so `from pkg import name` is pkg.name when
    that is a submodule, else pkg's __init__. None outside `modules`."""
    parts = target.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)


def layer(name, is_pkg=True):
    """The layer of a module, or None. The longest matching prefix decides; a folder layer (minitensor.ops)
    does not take a flat module of that name (minitensor/ops.py), and bare `minitensor` only its __init__."""
    for key in sorted(LAYERS, key=len, reverse=True):
        if name.startswith(key + "."):
            return None if key == "minitensor" else LAYERS[key]
        if name == key and (is_pkg or key in FILE_LAYERS):
            return LAYERS[key]
    return None


def module_layer(name, modules):
    return layer(name, modules[name].is_pkg if name in modules else True)


def edges(modules):
    """{(importer, imported): [lines]} between the scanned modules."""
    graph = {}
    for module in modules.values():
        for imp in imports(module):
            target = resolve(imp.target, modules)
            if target and target != module.name:
                graph.setdefault((module.name, target), set()).add(imp.line)
    return {edge: sorted(lines) for edge, lines in graph.items()}


def strongly_connected(nodes, graph):
    """Tarjan's algorithm, iterative: the components of more than one node."""
    succ = {n: sorted(b for a, b in graph if a == n) for n in nodes}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def enter(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(succ[node])

    for start in sorted(nodes):
        if start in index:
            continue
        work = [enter(start)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while node not in component:
                        component.add(stack.pop())
                    on_stack -= component
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                work.append(enter(child))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def closing_edges(component, graph, rank):
    """The imports that close a component's circles: those to a higher `rank`, and the back edges of a
    depth-first walk over the others. Without all of them the component has no circle."""
    inside = sorted((a, b) for a, b in graph if a in component and b in component)
    up = [(a, b) for a, b in inside if rank(b) > rank(a)]
    succ = {n: [b for a, b in inside if a == n and (a, b) not in up] for n in component}
    state, back = {}, []
    for start in sorted(component):
        if start in state:
            continue
        state[start], work = "open", [(start, iter(succ[start]))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                state[node] = "done"
                work.pop()
            elif child not in state:
                state[child] = "open"
                work.append((child, iter(succ[child])))
            elif state[child] == "open":
                back.append((node, child))
    return sorted(up + back)


def cycle_report(modules, root):
    """Per circle: its modules, then each closing import as `path:lines: importer -> imported`. A module in
    no layer ranks below L0 here (most leftovers today are leaves like errors or dtypes)."""
    graph = edges(modules)
    rank = lambda name: -1 if module_layer(name, modules) is None else module_layer(name, modules)
    out = []
    for component in strongly_connected(modules, graph):
        out.append(f"circle of {len(component)} modules: {', '.join(sorted(component))}")
        out += [f"  {rel(modules[a].path, root)}:{','.join(map(str, graph[a, b]))}: {a} -> {b}"
                for a, b in closing_edges(component, graph, rank)]
    return out


def rel(path, root=ROOT):
    return path.relative_to(root).as_posix()


def where(module, line, root=ROOT):
    return f"{rel(module.path, root)}:{line}"


def layer_violations(modules, root=ROOT):
    """R1: each import of a minitensor module points to the importer's layer or below."""
    bad = []
    for module in modules.values():
        own = layer(module.name, module.is_pkg)
        for imp in (i for i in imports(module) if own is not None and within(i.target, "minitensor")):
            name = resolve(imp.target, modules) or imp.target
            theirs = module_layer(name, modules)
            if theirs is None:
                bad.append(f"{where(module, imp.line, root)}: L{own} {module.name} imports {name}, in no layer")
            elif theirs > own:
                bad.append(f"{where(module, imp.line, root)}: L{own} {module.name} imports L{theirs} {name}")
    return list(dict.fromkeys(bad))  # `from x import a, b` once


def rule_violations(modules, root=ROOT):
    """R2-R7, as RULES lists them."""
    bad = []
    for module in modules.values():
        for importer, kind, targets in (r for r in RULES if within(module.name, r[0])):
            for imp in imports(module):
                name = resolve(imp.target, modules) or imp.target
                if not within(name, "minitensor") or within(name, importer):
                    continue
                if (kind == "only") != any(within(name, t) for t in targets):
                    said = f"only {', '.join(targets) or 'itself'}" if kind == "only" else f"never {', '.join(targets)}"
                    bad.append(f"{where(module, imp.line, root)}: {module.name} imports {name} "
                               f"({importer} imports {said})")
    return list(dict.fromkeys(bad))


def lazy_imports(modules):
    """[(module, first line, last line, targets)], one per statement importing a minitensor module inside a
    function (third-party imports there are free)."""
    found = {}
    for m in modules.values():
        for imp in (i for i in imports(m) if i.in_function and within(i.target, "minitensor")):
            found.setdefault((m.name, imp.line), (m, imp.line, imp.end_line, []))[3].append(imp.target)
    return list(found.values())


def driver_declared(path):
    """Names declared in the body of `class Driver`: methods and class attributes."""
    body = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Driver").body
    names = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return names | {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _is_driver(node):
    """`driver`, `_driver`, `self.driver`, `self._driver`, `active_driver()`, `driver()`, `_driver()`."""
    if isinstance(node, ast.Name):
        return node.id in DRIVER_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in DRIVER_NAMES and isinstance(node.value, ast.Name) and node.value.id == "self"
    if isinstance(node, ast.Call) and not node.args:
        return (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)) \
            in DRIVER_CALLS
    return False


def driver_uses(module):
    """(line, attribute) for each attribute read on a driver object, called or not."""
    return sorted((n.lineno, n.attr) for n in ast.walk(module.tree)
                  if isinstance(n, ast.Attribute) and _is_driver(n.value))


def markdown_links(text):
    """(line, target) of each relative markdown link, #fragment stripped (web links and pure anchors skipped)."""
    for line_no, line in enumerate(text.splitlines(), 1):
        for target in re.findall(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            if not re.match(r"(https?|mailto):|#", target):
                yield line_no, target.split("#")[0]


def paths_out(text):
    """(line, found) for each `../shared` or path starting `reference/`."""
    return [(n, found) for n, line in enumerate(text.splitlines(), 1)
            for found in re.findall(r"\.\./shared|(?<![\w./-])reference/", line)]


# ------------------------------------------------------------------------------------ the tree
def library():
    return scan(package_dirs(ROOT))


def failure(title, lines):
    return f"{title} ({len(lines)}):\n" + "\n".join(lines)


def test_every_module_is_in_a_layer():
    bad = [f"{rel(m.path)}:1: {m.name} is not in any layer" for m in library().values()
           if layer(m.name, m.is_pkg) is None]
    assert not bad, failure("modules outside the layer map", bad)


def test_imports_point_down():
    bad = layer_violations(library())
    assert not bad, failure("imports of a higher layer (R1)", bad)


def test_special_rules():
    bad = rule_violations(library())
    assert not bad, failure("imports against R2-R7", bad)


def test_no_import_circles():
    out = cycle_report(library(), ROOT)
    assert not out, failure("import circles in minitensor/, kernels/, allocator/ (the imports closing them indented)",
                            out)


def test_no_import_circles_in_bench():
    out = cycle_report(scan({"bench": ROOT / "bench"}), ROOT)
    assert not out, failure("import circles in bench/ (the imports closing them indented)", out)


def test_lazy_imports_are_few_and_marked():
    lazy = lazy_imports(library())
    bad = [f"{where(m, first)}: import of {', '.join(targets)} inside a function without '{LAZY_MARK}'"
           for m, first, last, targets in lazy if not any(LAZY_MARK in m.lines[i - 1] for i in range(first, last + 1))]
    if len(lazy) > MAX_LAZY:
        bad.insert(0, f"{len(lazy)} imports of minitensor modules inside functions, at most {MAX_LAZY}")
    assert not bad, failure("imports inside functions (R9)", bad)


def test_subpackage_inits_only_reexport():
    bad = []
    for m in (m for m in library().values() if m.is_pkg and m.name != "minitensor"):
        if len(m.lines) > 40:
            bad.append(f"{rel(m.path)}:{len(m.lines)}: {len(m.lines)} lines, at most 40")
        bad += [f"{rel(m.path)}:{n.lineno}: defines {n.name}" for n in ast.walk(m.tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not bad, failure("sub-package __init__.py files that do more than re-export (R8)", bad)


def test_module_and_class_sizes():
    bad = []
    for m in library().values():
        if len(m.lines) > 500:
            bad.append(f"{rel(m.path)}:{len(m.lines)}: module of {len(m.lines)} lines, at most 500")
        bad += [f"{rel(m.path)}:{n.lineno}: class {n.name} of {n.end_lineno - n.lineno + 1} lines, at most 400"
                for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > 400]
    assert not bad, failure("modules over 500 lines, classes over 400", bad)


def test_driver_protocol_is_complete():
    declared = driver_declared(ROOT / "minitensor" / "backends" / "base.py")
    bad = [f"{rel(m.path)}:{line}: Driver has no {attr}" for m in library().values()
           if rel(m.path) not in DRIVER_IMPLEMENTATIONS for line, attr in driver_uses(m) if attr not in declared]
    assert not bad, failure("driver calls missing from backends.base.Driver", bad)


def test_doc_links_resolve():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{rel(doc)}:{line}: link to {target}, which does not exist"
           for doc in docs if doc.exists() for line, target in markdown_links(doc.read_text())
           if target and not (doc.parent / target).exists()]
    assert not bad, failure("relative links that do not resolve", bad)


def test_no_paths_out_of_the_repo():
    files = [p for top in map(ROOT.joinpath, NO_WAY_OUT) for p in ([top] if top.is_file() else sorted(top.rglob("*")))
             if p.is_file() and "__pycache__" not in p.parts]
    bad = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # a binary file
            continue
        bad += [f"{rel(path)}:{line}: '{found}' leaves the repository" for line, found in paths_out(text)]
    assert not bad, failure("paths that leave the repository", bad)


# ------------------------------------------------------------------------------------ the scanner's own tests
FIXTURE = {
    "pyproject.toml": '[tool.setuptools.package-dir]\n"minitensor.kernels" = "kern"\n\n[tool.pytest]\nx = "y"\n',
    "minitensor/__init__.py": "from . import cuda\nfrom .cuda import streams\n",
    "minitensor/base/__init__.py": "",
    "minitensor/base/errors.py": "",
    "minitensor/cuda/__init__.py": "from .streams import Stream\n",
    "minitensor/cuda/streams.py": ("from ..base import errors\nfrom . import Stream\n"
                                   "def f():\n    import importlib\n"
                                   "    importlib.import_module('minitensor.kernels.launcher')  # lazy: import cost\n"
                                   "    return __import__('minitensor.base.errors')\n"),
    "minitensor/ops.py": "import minitensor.tensor\n",
    "kern/__init__.py": "",
    "kern/launcher.py": ("from ..cuda import streams\nfrom .. import base\n"
                         "def g(driver):\n    return driver.launch(), driver.name\n"),
}


def make_fixture(tmp_path):
    for name, text in FIXTURE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return scan(package_dirs(tmp_path))


def test_scanner_maps_package_dirs_and_resolves_imports(tmp_path):
    modules = make_fixture(tmp_path)
    assert package_dirs(tmp_path) == {"minitensor": tmp_path / "minitensor", "minitensor.kernels": tmp_path / "kern"}
    assert modules["minitensor.kernels.launcher"].path == tmp_path / "kern" / "launcher.py"
    assert modules["minitensor.kernels"].is_pkg and not modules["minitensor.cuda.streams"].is_pkg
    found = lambda name: [(i.line, i.target, i.in_function) for i in imports(modules[name])]
    assert found("minitensor.cuda.streams") == [
        (1, "minitensor.base.errors", False), (2, "minitensor.cuda.Stream", False), (4, "importlib", True),
        (5, "minitensor.kernels.launcher", True), (6, "minitensor.base.errors", True)]
    assert found("minitensor.kernels.launcher") == [(1, "minitensor.cuda.streams", False),
                                                    (2, "minitensor.base", False)]
    assert found("minitensor") == [(1, "minitensor.cuda", False), (2, "minitensor.cuda.streams", False)]
    assert resolve("minitensor.cuda.Stream", modules) == "minitensor.cuda"  # a name, not a submodule
    assert resolve("numpy.linalg", modules) is None


def test_scanner_layers_and_rules(tmp_path):
    modules = make_fixture(tmp_path)
    assert layer("minitensor.ops", is_pkg=False) is None and layer("minitensor.ops.copy") == 6
    assert layer("minitensor.tensor", is_pkg=False) == 7 and layer("minitensor", is_pkg=True) == 9
    assert layer("minitensor.pointwise", is_pkg=False) is None and layer("minitensor.kernels") == 3
    assert layer_violations(modules, tmp_path) == [
        "kern/launcher.py:1: L3 minitensor.kernels.launcher imports L4 minitensor.cuda.streams"]
    assert rule_violations(modules, tmp_path) == [
        "kern/launcher.py:1: minitensor.kernels.launcher imports minitensor.cuda.streams "
        "(minitensor.kernels imports only minitensor.base, minitensor.backends)"]
    assert [(m.name, first, targets) for m, first, _, targets in lazy_imports(modules)] == [
        ("minitensor.cuda.streams", 5, ["minitensor.kernels.launcher"]),
        ("minitensor.cuda.streams", 6, ["minitensor.base.errors"])]
    assert driver_uses(modules["minitensor.kernels.launcher"]) == [(4, "launch"), (4, "name")]


def test_scanner_finds_circles(tmp_path):
    modules = make_fixture(tmp_path)
    graph = edges(modules)
    assert graph[("minitensor.cuda.streams", "minitensor.kernels.launcher")] == [5]
    assert ("minitensor.cuda.streams", "minitensor.cuda") in graph  # `from . import Stream`: the package
    assert [sorted(c) for c in strongly_connected(modules, graph)] == [
        ["minitensor.cuda", "minitensor.cuda.streams", "minitensor.kernels.launcher"]]
    assert cycle_report(modules, tmp_path) == [
        "circle of 3 modules: minitensor.cuda, minitensor.cuda.streams, minitensor.kernels.launcher",
        "  minitensor/cuda/streams.py:2: minitensor.cuda.streams -> minitensor.cuda",
        "  kern/launcher.py:1: minitensor.kernels.launcher -> minitensor.cuda.streams"]


def test_scanner_reads_docs():
    text = "see [a](docs/a.md#x), [web](https://x.org), [top](#top)\n![img](<pics/b.png> \"t\") `reference/x.md`"
    assert list(markdown_links(text)) == [(1, "docs/a.md"), (2, "pics/b.png")]
    assert paths_out("the ../shared/API.md\nsee reference/allocator.md, not docs/reference/x") == [
        (1, "../shared"), (2, "reference/")]
