"""The README is a newcomer's path and the docs site holds together: the README stays short,
keeps the two quick-start commands that CI runs, and no link in it or in docs/ leads nowhere.

`mkdocs build --strict` (in .ci/run) checks the site's own links too; this test needs no
MkDocs, so a broken link fails the test suite on any machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """The heading anchors of a page, as GitHub and MkDocs both spell them."""
    headings = re.findall(r"^#+ (.*)$", _FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)]


def test_readme_is_a_short_path():
    assert len(README.read_text().splitlines()) <= 300


def test_readme_keeps_the_two_quick_start_commands_that_ci_runs():
    blocks = _bash_blocks(README.read_text())
    assert "pip install -e . && memtrack run" in blocks
    assert 'pip install -e ".[test]" && pytest -n auto' in blocks
    # .ci/run runs the README's test command as written there.
    assert 'pip install -e ".[test]" && pytest -n auto' in (ROOT / ".ci" / "run").read_text()


def test_every_docs_page_is_in_the_site_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^theme:\n  name: material$", config, re.M)
    for page in PAGES:
        assert re.search(rf"^  - [^:\n]+: {re.escape(page.name)}$", config, re.M), page.name


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_names_a_file_and_anchor_that_exist(page):
    text = _FENCE.sub("", page.read_text())
    links = [link for link in _LINK.findall(text) if not re.match(r"[a-z]+:", link)]
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name}: {link}: no such file"
        if anchor:
            assert anchor in _anchors(target), f"{page.name}: {link}: no such heading"


def test_the_docs_state_the_one_provisional_rule_the_gate_applies():
    """Every page that says how far a provisional regression must jump says the jump the
    code uses: one rule, written once in the code, the same in every page."""
    from memtrack.judge.memory import PROVISIONAL_BLOCK_FRACTION

    rule = f"{PROVISIONAL_BLOCK_FRACTION:.0%}".replace("%", " %")
    said = {}
    for page in [README, *PAGES]:
        text = _FENCE.sub("", page.read_text())
        for sentence in re.split(r"(?<=[.|])\s", text.replace("\n", " ")):
            if "provisional" in sentence.lower():
                for pct in re.findall(r"(\d+(?:\.\d+)?) ?%(?! of the)", sentence):
                    said.setdefault(f"{pct} %", []).append(page.name)
    assert rule in said, "no page states the provisional rule"
    assert set(said) == {rule}, said
    # gate.md states it in full, and each short form points there
    assert f"a regression blocks only past a {rule} jump" in (DOCS / "gate.md").read_text()


def test_ci_runs_the_readme_test_command_in_a_fresh_venv_and_times_its_stages():
    """As a newcomer runs it: in a venv made for the run, never the machine's own Python."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    command = lines.index('pip install -e ".[test]" && pytest -n auto')
    made = max(i for i, line in enumerate(lines[:command]) if "-m venv --clear" in line)
    activated = max(i for i, line in enumerate(lines[:command]) if line.startswith("source "))
    assert made < activated < command
    assert "deactivate" not in lines[activated:command]
    assert sum(line.startswith("stage ") for line in lines) >= 5  # each stage prints its time
