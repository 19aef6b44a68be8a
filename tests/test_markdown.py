"""Every Markdown file of the project renders as written: each code fence is closed by a bare
fence line, and every heading and table row written outside a code block comes out as a heading
or a table. (A fence glued to text, "``` `--flag` ...", is no closing fence: the code block runs
on and swallows the sections after it, as happened to the README once.) Rendered with
markdown-it-py, a CommonMark parser, with tables on as GitHub renders them."""
import re
import subprocess

import pytest

from tests.helpers import REPO, rendering_problems


def markdown_files():
    """The project's Markdown files: those git tracks, or, outside a git checkout, those under the
    repository but not in hidden folders, virtual environments or run outputs."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.md"], capture_output=True, text=True,
                                timeout=30, check=True).stdout.split()
        if listed:
            return sorted(REPO / name for name in listed)
    except (OSError, subprocess.SubprocessError):
        pass
    skip = {"runs", "venv", "node_modules", "site-packages"}
    return sorted(p for p in REPO.rglob("*.md")
                  if not any(part.startswith(".") or part in skip for part in p.relative_to(REPO).parts))


def test_the_check_finds_a_fence_glued_to_text():
    broken = "# Title\n\n```bash\nrun it\n``` `--flag` does this\n\n## Section\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    problems = rendering_problems(broken)
    assert any("never closed" in p for p in problems), problems
    assert any("'## Section' does not render as a heading" in p for p in problems), problems
    assert any("table row '| a | b |'" in p for p in problems), problems
    fixed = broken.replace("``` `--flag` does this", "```\n\n`--flag` does this")
    assert rendering_problems(fixed) == []
    # a fence opened with an info string where a closing one was meant
    assert rendering_problems("```bash\nx\n```bash\ny\n```\n") != []


def test_markdown_files_are_found():
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/slurm.md", "docs/scaling.md", "bench/README.md"} <= names, names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_markdown_renders_as_written(path):
    problems = rendering_problems(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.relative_to(REPO)}:\n" + "\n".join(problems)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings_and_links(text: str):
    """The anchors of a Markdown text's headings, and the targets of its links (code excluded)."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    anchors, links, seen = set(), [], {}
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            title = "".join(child.content for child in tokens[i + 1].children if child.type in ("text", "code_inline"))
            anchor = github_anchor(title)
            anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
        for child in token.children or []:
            if child.type == "link_open":
                links.append(child.attrs["href"])
    return anchors, links


def test_the_link_check_reads_headings_as_github_does():
    anchors, links = headings_and_links("# The fast path's choices\n\n## `job_ft3.sh`: one GPU\n\n## Notes\n\n"
                                        "## Notes\n\nSee [a](docs/x.md#y) and `[b](c.md)`.\n\n```\n[d](e.md)\n```\n")
    assert anchors == {"the-fast-paths-choices", "job_ft3sh-one-gpu", "notes", "notes-1"}
    assert links == ["docs/x.md#y"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_resolve(path):
    """Every relative link names a file of the repository and, after '#', a heading of that file."""
    broken = []
    for link in headings_and_links(path.read_text(encoding="utf-8"))[1]:
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in headings_and_links(file.read_text(encoding="utf-8"))[0]:
            broken.append(f"{link}: no heading with the anchor #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{path.relative_to(REPO)}:\n" + "\n".join(broken)


def test_the_readme_gives_its_figures_after_the_quickstart():
    """A newcomer reads what the project is, the two commands and the cluster quickstart before any speed figure
    (throughput, MFU): those come after, in a section of their own, each linking to the page that holds its detail."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:3] == ["The two commands", "On a SLURM cluster: quickstart", "Measured"], headings
    before, _, measured = text.partition("\n## Measured\n")
    measured = measured.split("\n## ")[0]
    speed = re.compile(r"\d[\d,.]*\s*(?:samples|windows|tokens|sequences)/s|MFU (?:is |of )?\d|\d(?:\.\d+)?x the")
    assert not speed.findall(before), speed.findall(before)
    assert speed.findall(measured)
    items = re.findall(r"^- (.+?)(?=^- |\Z)", measured, flags=re.M | re.S)
    assert items and all(re.search(r"\]\(docs/[\w.-]+\.md#[\w-]+\)", item) for item in items), items


def test_every_job_is_submitted_as_the_docs_advise():
    """docs/slurm.md warns that a job runs and writes in the folder it is submitted from (gigabytes of checkpoints,
    small $HOME quotas), yet submitted some examples from the repository: every sbatch of a job script names it by
    $REPO_DIR (from a submit folder on $LUSTRE), or names the output folder on $LUSTRE."""
    submitted, wrong = 0, []
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for command in re.findall(r"sbatch\b[^`#\n]*?\bjob_(?:ft3|ddp)\.sh[^`#\n]*", line):
                submitted += 1
                if "$REPO_DIR/job_" not in command and not re.search(r"(OUTPUT_DIR=|--output_dir )\$LUSTRE/", command):
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {command.strip()}")
    assert submitted > 10 and not wrong, "\n".join(wrong)
