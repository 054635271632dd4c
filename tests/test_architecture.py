"""The package's rooms and their one-way doors, checked by walking every module's imports (ast).

    core    kernels, learner, model, persistence    numpy, scipy, numba, threadpoolctl only
    stream  codec, join buffer, processor           core
    ops     metrics, logs, process, faults          core, stream        (never kafka, never tools)
    kafka   the worker loop and its collaborators   core, stream, ops
    tools   the CLI and its commands                anything; nothing imports tools but iolstream.__main__

Also: no import cycle between modules, no private name (``_x``) of another module imported or used,
and every module lives in a room. The imports of doctest examples count as the module's own. docs/architecture.md names modules that must exist.

Module size: a module over 600 lines (measured on formatted code: ``ruff format``, 110 columns, as ``make lint``
checks) is reported as a warning, not a failure: a module ends where its concept ends, and one cut at a line
count is harder to read than a long one. The warning asks whether two concepts share the file.
"""

from __future__ import annotations

import ast
import doctest
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "iolstream"
DOCS = PACKAGE.parent / "docs" / "architecture.md"

ROOMS = ("core", "stream", "ops", "kafka", "tools")
MAY_IMPORT = {
    "core": {"core"},
    "stream": {"core", "stream"},
    "ops": {"core", "stream", "ops"},
    "kafka": {"core", "stream", "ops", "kafka"},
    "tools": set(ROOMS) | {"top"},
    "top": {"core", "top"},  # iolstream/__init__.py, estimators.py: the public API over core
}
THIRD_PARTY = {  # per room, what it may import from outside the standard library (None: anything)
    "core": {"numpy", "scipy", "numba", "threadpoolctl", "llvmlite"},
    "stream": {"numpy", "scipy", "numba", "orjson"},
    "ops": {"numpy", "orjson", "prometheus_client"},
    "kafka": {"numpy", "orjson", "yaml", "confluent_kafka"},
    "tools": None,
    "top": {"numpy", "scipy", "sklearn"},  # estimators.py is the scikit-learn API
}
ENTRY_POINTS = {"iolstream.__main__"}  # may import tools


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ROOMS:
        return parts[1]
    if module in ("iolstream", "iolstream.estimators") or module in ENTRY_POINTS:
        return "top"
    return None


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def doctest_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports of every doctest example in the docstrings of ``tree`` (module, classes, functions), each
    with the line of the file it stands on: an example is code of the module's room, run by ``pytest
    --doctest-modules``, and its imports go through the same doors."""
    parser, found = doctest.DocTestParser(), []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            continue
        if not isinstance(body[0].value.value, str):
            continue
        for example in parser.get_examples(body[0].value.value):
            try:
                example_tree = ast.parse(example.source)
            except SyntaxError:
                continue  # not Python (an example of output, a shell line): nothing imported
            for imp in ast.walk(example_tree):
                if isinstance(imp, (ast.Import, ast.ImportFrom)):
                    imp.lineno = body[0].lineno + example.lineno  # the docstring's line + the example's
                    found.append(imp)
    return found


def imports_of(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import, relative ones resolved; the imports of
    doctest examples included."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in [*ast.walk(tree), *doctest_imports(tree)]:
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [a.name for a in node.names]
            known = modules()
            # `from pkg import mod`: the dependency is on pkg.mod when it is a module
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            if subs:
                out += [(sub, [], node.lineno) for sub in subs]
                rest = [n for n in names if f"{base}.{n}" not in known]
                if rest:
                    out.append((base, rest, node.lineno))
            else:
                out.append((base, names, node.lineno))
    return out


def private_uses(path: Path, imported_aliases: set[str]) -> list[tuple[str, int]]:
    """``alias._name`` where ``alias`` is an imported iolstream module."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (f"{node.value.id}.{node.attr}", node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imported_aliases
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def violations() -> list[str]:
    found = []
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    stdlib = set(sys.stdlib_module_names)
    for module, path in known.items():
        room = room_of(module)
        if room is None:
            found.append(f"{module}: in no room ({', '.join(ROOMS)})")
        aliases = set()
        for target, names, line in imports_of(module, path):
            top = target.split(".")[0]
            where = f"{module}:{line}"
            if top == "iolstream":
                if target not in known and target.rsplit(".", 1)[0] in known:
                    target = target.rsplit(".", 1)[0]
                other = room_of(target)
                if room is None:
                    pass  # its own place is reported above; names and cycles are still checked
                elif other is None and target != "iolstream":
                    found.append(f"{where}: imports {target}, in no room")
                elif other == "tools" and room != "tools" and module not in ENTRY_POINTS:
                    found.append(f"{where}: imports {target}: nothing imports tools")
                elif other is not None and other not in MAY_IMPORT[room] and module not in ENTRY_POINTS:
                    found.append(f"{where}: {room} imports {other} ({target})")
                for name in names:
                    if name.startswith("_") and not name.startswith("__"):
                        found.append(f"{where}: imports the private name {target}.{name}")
                if target in known and target != module:
                    graph[module].add(target)
                    aliases.add(target.rsplit(".", 1)[-1])
            elif top not in stdlib and top != "__future__" and room is not None:
                allowed = THIRD_PARTY[room]
                if allowed is not None and top not in allowed:
                    found.append(f"{where}: {room} imports {top}")
        for use, line in private_uses(path, aliases):
            found.append(f"{module}:{line}: uses the private name {use} of another module")
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_go_through_the_doors_one_way():
    found = violations()
    assert not found, "\n".join(found)


LONG_MODULE_LINES = 600


def test_modules_over_600_lines_are_reported():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > LONG_MODULE_LINES}
    for module, lines in sorted(long.items()):
        warnings.warn(
            f"{module} has {lines} formatted lines (over {LONG_MODULE_LINES}): does it hold two concepts?",
            stacklevel=1,
        )


@pytest.mark.skipif(not DOCS.exists(), reason="docs/architecture.md not written yet")
def test_every_module_the_architecture_page_names_exists():
    text = DOCS.read_text()
    named = set(re.findall(r"`(iolstream(?:/[a-z_]+)+\.py)`", text))
    assert named, "docs/architecture.md names no module as `iolstream/.../x.py`"
    missing = sorted(n for n in named if not (PACKAGE.parent / n).exists())
    assert not missing, missing
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name in ROOMS}
    assert rooms == set(ROOMS)


def test_the_public_names_load_on_first_use_and_are_listed():
    """``import iolstream`` loads no room (``iolstream --help`` must not wait for Numba), yet ``dir`` lists every
    public name and each one resolves to its home."""
    code = (
        "import sys, iolstream\n"
        "assert not [m for m in sys.modules if m.startswith(('iolstream.', 'numba'))], sorted(sys.modules)\n"
        "print(sorted(set(iolstream.__all__) - set(dir(iolstream))))\n"
        "print(iolstream.EdRVFL.__module__, iolstream.load_snapshot.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "iolstream.core.model iolstream.core.snapshot_file"], (
        out.stdout
    )
