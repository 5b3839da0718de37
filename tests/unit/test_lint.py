"""The code style the project keeps: `ruff check` with the settings in pyproject.toml."""


from support import REPO


def test_the_package_has_no_import_cycle():
    """No module of src/ imports one that imports it back, not even from inside a function (an
    import moved into a function to dodge a cycle counts): each job sits in one module that
    the modules needing it import. Entry-point blocks (``if __name__ == "__main__"``) run
    only as scripts and are left out."""
    import ast

    import networkx as nx

    src = REPO / "src"
    modules = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p for p in src.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        entry_points = {id(n) for block in tree.body if isinstance(block, ast.If) and "__main__" in ast.unparse(block.test)
                        for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in entry_points or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                # importing a.b.c imports a and a.b first: their __init__ modules count too
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    if (imported := ".".join(parts[:i])) in modules and imported != name:
                        graph.add_edge(name, imported)
        parent = name.rpartition(".")[0]
        if parent in modules:
            graph.add_edge(name, parent)
    cycles = sorted(" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(graph))
    assert graph.number_of_edges() > 50 and "scalelab.config" in graph
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


LONGEST_FUNCTION = 80
"""Lines a function of the package may run to (issue #42): past it, a function does more than one thing."""


def test_no_function_runs_past_eighty_lines():
    import ast

    long = []
    for path in sorted((REPO / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert long == [], long


def test_the_guide_shows_the_layers_as_the_contract_orders_them():
    """docs/contributing.md's map of src/scalelab/ is generated from the layers contract and the packages'
    docstrings (devtools.layout): a package added, moved or described anew shows there, and
    every package of src/scalelab/ is in a layer."""
    from devtools.layout import PACKAGE_DIR, layers, layout

    guide = (REPO / "docs" / "contributing.md").read_text()
    assert layout() in guide, "docs/contributing.md's layout is stale: PYTHONPATH=tests python -m devtools.layout --write"
    placed = {name.removeprefix("scalelab.") for layer in layers() for name in layer}
    packages = {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE_DIR.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules == placed, f"in no layer: {sorted((packages | modules) - placed)}; gone: {sorted(placed - packages - modules)}"
