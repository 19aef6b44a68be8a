"""The package layout: qa/ holds what a training run uses, and nothing in it reaches upward.

Every module of qa/ must be reached from run_qa.py through imports (those inside functions
included); the study's model (scaling/) and the tools may use qa, never the reverse. utils_qa.py
(SQuAD's pre- and post-processing and metric) sits between: it uses qa's readers and checks, and
the entry points (run_qa.py, trainer_qa.py, answer_qa.py, score_qa.py) use it. No import goes round in
a cycle. A script's `if __name__ == "__main__":` block is left out: it runs as the module __main__,
never when the module is imported; utils_qa.py imports no entry point even there."""
import ast

from tests.helpers import REPO


def _imports(path):
    """Module names `path` imports, absolute (relative ones resolved against its package)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    tree = ast.parse(path.read_text())
    tree.body = [node for node in tree.body if not _script_block(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def _script_block(node) -> bool:
    """`if __name__ == "__main__":` at the top level of a module."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__"))


def _file(module):
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _project_modules(root):
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for p in (REPO / root).rglob("*.py")}


def _graph():
    """{module: the project modules it imports} for qa/ and the top-level modules."""
    top = {p.stem for p in REPO.glob("*.py")}
    modules = _project_modules("qa") | top
    return {m: {i for i in _imports(_file(m)) if i in modules} for m in modules}


def test_every_qa_module_is_part_of_a_run():
    seen, todo = set(), ["run_qa"]
    while todo:
        module = todo.pop()
        if module in seen or _file(module) is None:
            continue
        seen.add(module)
        todo += [m for m in _imports(_file(module)) if m.split(".")[0] in ("qa", "trainer_qa", "utils_qa")]
        todo.append(module.rpartition(".")[0])  # importing a module imports its package
    assert _project_modules("qa") - seen == set()


def test_the_runtime_package_uses_no_study_or_tool_code():
    upward = ("scaling", "tools", "bench", "run_qa", "trainer_qa", "utils_qa", "answer_qa", "score_qa", "check_qa")
    for path in (REPO / "qa").rglob("*.py"):
        above = {m for m in _imports(path) if m.split(".")[0] in upward}
        assert not above, (path, above)


def test_utils_qa_sits_between_qa_and_the_entry_points():
    graph = _graph()
    assert {m.split(".")[0] for m in graph["utils_qa"]} <= {"qa"}, graph["utils_qa"]
    assert {m for m in graph if "utils_qa" in graph[m]} == {"run_qa", "trainer_qa", "answer_qa", "score_qa"}
    # Its script block too: scoring is score_qa.py's (bert-squad-score), which imports utils_qa, never the reverse
    tree = ast.parse((REPO / "utils_qa.py").read_text())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.split(".")[0] in {p.stem for p in REPO.glob("*.py")}}, imported


def test_the_import_graph_has_no_cycle():
    graph, done = _graph(), set()

    def visit(module, path):
        assert module not in path, " -> ".join([*path, module])
        if module not in done:
            for imported in sorted(graph[module]):
                visit(imported, [*path, module])
            done.add(module)
    for module in sorted(graph):
        visit(module, [])
