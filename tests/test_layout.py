"""The package layout: qa/ holds what a training run uses, and nothing in it reaches upward.

Every module of qa/ must be reached from run_qa.py through imports (those inside functions
included); the study's model (scaling/) and the tools may use qa, never the reverse."""
import ast

from tests.helpers import REPO


def _imports(path):
    """Module names `path` imports, absolute (relative ones resolved against its package)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def _file(module):
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _project_modules(root):
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for p in (REPO / root).rglob("*.py")}


def test_every_qa_module_is_part_of_a_run():
    seen, todo = set(), ["run_qa"]
    while todo:
        module = todo.pop()
        if module in seen or _file(module) is None:
            continue
        seen.add(module)
        todo += [m for m in _imports(_file(module)) if m.split(".")[0] in ("qa", "trainer_qa")]
        todo.append(module.rpartition(".")[0])  # importing a module imports its package
    assert _project_modules("qa") - seen == set()


def test_the_runtime_package_uses_no_study_or_tool_code():
    for path in (REPO / "qa").rglob("*.py"):
        above = {m for m in _imports(path) if m.split(".")[0] in ("scaling", "tools", "bench", "run_qa", "trainer_qa")}
        assert not above, (path, above)
