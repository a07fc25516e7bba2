"""The README, benchmarks/README.md and the docs pages name only what the repository has, and the README's layout
names everything it has. (The strict docs build, `make docs`, checks the links between the docs pages.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

README = REPO / "README.md"
PAGES = [README, REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: A path of the repository in a code span: `src/rlchain/core/envs/base.py`, `conf/experiment/`, `benchmarks/README.md`.
REPO_PATH = re.compile(r"`((?:src|conf|tests|benchmarks|docs)/[^`\s<>*]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {_github_anchor(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+?)\s*$", text)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_repository_path_exists(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md" and "docs" not in linked.relative_to(REPO).parts:
            assert anchor in _anchors(linked), f"{page.relative_to(REPO)} links to {target}: no such heading"
    for path in REPO_PATH.findall(text):
        assert (REPO / path).exists(), f"{page.relative_to(REPO)} names {path}, which does not exist"


def _items(section: str) -> list[str]:
    """The list items of a section of the README, each with its continuation lines."""
    return [item for item in re.split(r"(?m)^- ", section)[1:]]


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_readme_layout_names_every_module_script_and_folder():
    items = _items(_section("Layout"))

    def named(path: Path) -> bool:
        rel = path.relative_to(REPO)
        return any(f"`{rel}`" in item or (f"`{rel.parent}/`" in item and f"`{rel.name}`" in item) for item in items)

    modules = [p for p in (REPO / "src").rglob("*.py") if ".egg-info" not in str(p)]
    scripts = list((REPO / "benchmarks").glob("*.py"))
    missing = [str(p.relative_to(REPO)) for p in [*modules, *scripts] if not named(p)]
    assert not missing, f"the README's layout misses {missing}"
    layout = "".join(items)
    folders = [p for p in (REPO / "conf").iterdir() if p.is_dir() and p.name != "__pycache__"]
    folders += [p for p in (REPO / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    assert not [p for p in folders if f"`{p.name}/`" not in layout and f"`{p.relative_to(REPO)}/`" not in layout]


@pytest.mark.parametrize("group", ["experiment", "hparams_search", "sweep", "study", "debug"])
def test_the_readme_presets_name_every_preset(group):
    (item,) = [item for item in _items(_section("Presets")) if item.startswith(f"`conf/{group}/`")]
    missing = [p.stem for p in (REPO / "conf" / group).glob("*.yaml") if f"`{p.stem}`" not in item]
    assert not missing, f"the README's presets miss {group}={missing}"


@pytest.mark.parametrize("target", ["train", "test", "bench"])
def test_the_quick_starts_make_targets_run_the_python_they_are_given(target, tmp_path):
    # `make train PYTHON=<a virtualenv's python>` without the virtualenv activated installs into that Python; the
    # command it then runs must be that Python's too, not whatever `rlchain-train` is first on PATH.
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    python = tmp_path / "venv" / "bin" / "python"
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"PYTHON={python}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    last = dry.strip().splitlines()[-1]  # the target's own command, after the install
    assert last.startswith(f"{python} "), f"make {target} runs {last!r}, not with {python}"
