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
    from memtrack.judge.memory import PROVISIONAL as PROVISIONAL_BLOCK_FRACTION

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


def test_the_docs_speak_of_the_project_and_nothing_else():
    """The README and the docs site describe memtrack: how a machine is lent to whoever
    develops it, its output folder's name there or its time budget are no part of it."""
    lent = re.compile(r"\$OUT\b|\blent\b|device machine|minutes of device time|/work/\.library")
    for page in [README, *PAGES]:
        found = [m.group() for m in lent.finditer(page.read_text())]
        assert not found, (page.name, found)


def _shipped_suite() -> dict[str, list[dict[str, object]]]:
    """The shipped example suite as `memtrack run` finds it in a clone: each workload's
    cases' params."""
    from memtrack.config import Config
    from memtrack.workload.registry import discover, select_cases

    suite: dict[str, list[dict[str, object]]] = {}
    for case in select_cases(discover(Config(path=None, root=ROOT))):
        suite.setdefault(case.workload, []).append(case.params)
    return suite


def _quick_start(page: Path) -> str:
    text = " ".join(page.read_text().split())
    start = text.index("This runs the shipped example suite")
    return text[start : text.index("imported torch once.", start)]


def test_the_readme_and_getting_started_describe_what_a_fresh_clone_runs_alike():
    """One account of the shipped suite, in both places a newcomer reads it: the number of
    cases and workloads, every case named as `memtrack run`'s table names it (a workload of
    one case by its name, the others by the params that tell them apart), and one measured
    time, said with how it was measured."""
    suite = _shipped_suite()
    cases = sum(len(c) for c in suite.values())
    readme, started = _quick_start(README), _quick_start(DOCS / "getting-started.md")
    assert readme == started
    assert f"{cases} cases of {len(suite)} workloads" in readme
    for workload, params in suite.items():
        if len(params) == 1:
            assert f"`{workload}`" in readme, workload
            continue
        differ = sorted(k for k in params[0] if len({str(p[k]) for p in params}) > 1)
        for p in params:
            label = f"{workload}[{','.join(f'{k}={p[k]}' for k in differ)}]"
            assert f"`{label}`" in readme, label
    took = re.search(r"took (\d+)(?: to (\d+))? s on 2 CPU cores \(`time memtrack run`", readme)
    assert took, readme


def test_the_server_page_shows_a_socket_url_the_database_made_first_and_a_clones_install():
    """docs/storage.md shows a unix-socket URL beside the TCP one and says the database must
    exist first; the install of the server extra is a clone's, as the quick start's."""
    storage = (DOCS / "storage.md").read_text()
    assert "'postgresql:///memtrack?host=/var/run/postgresql'" in storage
    assert "createdb" in storage and "must exist" in storage
    for page in [README, *PAGES]:
        text = page.read_text()
        assert "pip install 'memtrack[postgres]'" not in text, page.name
        if "[postgres]" in text:
            assert 'pip install -e ".[postgres]"' in text, page.name
