"""What `memtrack check` prints, writes as Markdown and as JSON for a recorded history stays
what it was: the realistic history of tests/factories (150 main commits of real reruns with a
step, a creep, an OOM and a torch upgrade, and ten pull requests), checked as CI checks it,
against the outputs kept in tests/data/check-output/. A change to the code that moves a
character of them fails here; a change meant to move them rewrites them with

    MEMTRACK_WRITE_GOLDEN=1 python -m pytest tests/test_check_output.py

and the diff of tests/data/check-output/ shows, in review, what a user will read differently.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import GROW_PR, OOM_AT, STEP_AT, realistic_history

from memtrack.cli import main

GOLDEN = Path(__file__).parent / "data" / "check-output"
WRITE = os.environ.get("MEMTRACK_WRITE_GOLDEN") == "1"
RUNS = {
    "pr-grows-a-cache": f"{GROW_PR:04d}" + "e" * 28,
    "pr-unchanged": f"{0:04d}" + "e" * 28,
    "main-step": f"{STEP_AT:04d}" + "d" * 28,
    "main-oom": f"{OOM_AT:04d}" + "d" * 28,
    "main-first": f"{1:04d}" + "d" * 28,
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("golden")
    realistic_history(work / "memtrack.db")
    (work / "memtrack.toml").write_text(
        'base_branch = "main"\ndashboard_url = "https://memtrack.example.org"\n'
    )
    return work


def _check(work: Path, name: str, *args: str) -> dict[str, str]:
    md, js = work / f"{name}.md", work / f"{name}.json"
    res = CliRunner().invoke(
        main,
        [
            "check",
            "--config",
            str(work / "memtrack.toml"),
            "--db",
            str(work / "memtrack.db"),
            "--no-record",
            "--markdown",
            str(md),
            "--json",
            str(js),
            *args,
        ],
        env={"COLUMNS": "200", "GITHUB_STEP_SUMMARY": ""},
    )
    assert res.exit_code in (0, 1), res.output
    outputs = {
        "txt": res.output + f"exit {res.exit_code}\n",
        "md": md.read_text(),
        "json": js.read_text(),
    }
    # what differs from one checkout or one minute to the next
    return {k: _stable(v, work) for k, v in outputs.items()}


def _stable(text: str, work: Path) -> str:
    text = text.replace(str(work), "<work>")
    return re.sub(r'"checked_at": "[^"]*"', '"checked_at": "<when>"', text)


def _compare(name: str, outputs: dict[str, str]) -> None:
    for ext, text in outputs.items():
        path = GOLDEN / f"{name}.{ext}"
        if WRITE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            continue
        assert path.is_file(), f"{path} missing: write it with MEMTRACK_WRITE_GOLDEN=1"
        assert text == path.read_text(), f"{path.name} differs from what check printed"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_check_prints_what_it_printed(recorded: Path, name: str) -> None:
    _compare(name, _check(recorded, name, "--run", RUNS[name]))


def test_check_history_prints_what_it_printed(recorded: Path) -> None:
    outputs = _check(recorded, "history", "--history")
    json.loads(outputs["json"])
    _compare("history", outputs)
