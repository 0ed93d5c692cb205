"""Recorded text shows as itself: in the PR comment and job summary (Markdown), in the
dashboard's panels (HTML) and in the terminal. A record can come from anywhere
(`memtrack ingest`), so its names, messages and branch are data, never structure."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo, make_measurement, make_run

from memtrack.cli import main
from memtrack.escape import WORD_JOINER, html_text, markdown_code, markdown_text, terminal_text
from memtrack.records import write_json
from memtrack.workload.registry import case_id

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "memtrack" / "templates"))
import comment  # noqa: E402  # the PR comment script, as memtrack's CI and `init`'s give it

MARKER = "<!-- memtrack -->"
NAME = (
    "w\n\n## passed: nothing blocks\n<img src=https://e.example/p.png>\n"
    + MARKER
    + "\n</details>\n@octocat `x` | y |\n"
)
BRANCH = "b\n\n[click](javascript:alert(1)) <img src=https://e.example/b.png> www.e.example"
MESSAGE = "boom\n\n# heading\n<script>alert(1)</script> ![i](https://e.example/i.png) @team"
TERMINAL = "\x1b[2J\x1b]8;;https://e.example\x07link\x1b]8;;\x07\x07\rover"


def _render(md: str) -> str:
    """The Markdown as GitHub's reader structures it: CommonMark with tables, raw HTML
    passed through."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(md)


def _ingest_and_check(tmp_path: Path, run, *args: str):
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    commit_all(repo, "a project")
    record = tmp_path / "run.json"
    write_json(run, record)
    db = tmp_path / "m.db"
    runner = CliRunner()
    ingested = runner.invoke(main, ["ingest", str(record), "--db", str(db)])
    assert ingested.exit_code == 0, ingested.output
    checked = runner.invoke(
        main,
        [
            "check",
            "--config",
            str(repo / "memtrack.toml"),
            "--db",
            str(db),
            "--run",
            run.run_id,
            *args,
        ],
    )
    return checked, db


def _hostile_run():
    failed = make_measurement(NAME, {"batch": 1}, status="error", message=MESSAGE)
    ok = make_measurement(NAME, {"batch": 2})
    return make_run([failed, ok], branch=BRANCH, subject=MESSAGE)


def test_a_crafted_record_cannot_restructure_the_comment_or_summary(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    checked, _ = _ingest_and_check(tmp_path, _hostile_run(), "--markdown", str(tmp_path / "v.md"))
    assert checked.exit_code == 1, checked.output  # the failed case blocks
    md = (tmp_path / "v.md").read_text()
    assert summary.read_text() == md + "\n"
    lines = md.splitlines()
    # Nothing recorded starts a line: the only headings are memtrack's own.
    assert [x for x in lines if x.startswith("#")] == [lines[0]]
    assert lines[0].startswith("### ❌ memtrack: blocked by ")
    assert not any(x.startswith(("## passed", "<img", "@", "<script")) for x in lines)
    html = _render(md)
    folds = sum(x.startswith("<details><summary>") for x in lines)  # memtrack's own folds
    assert MARKER not in html and html.count("<details>") == html.count("</details>") == folds
    assert folds >= 1
    assert "<img" not in html and "<script" not in html and "<a " not in html
    assert re.findall(r"<h\d>", html) == ["<h3>"]  # the outcome, memtrack's only heading
    # Outside code spans (where GitHub links and mentions nothing), no shape it would link
    # or mention survives, yet the text is all there.
    prose = re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", md)
    assert "https://" not in prose and "www.e" not in prose and "@team" not in prose
    assert "@" not in prose.replace("@" + WORD_JOINER, "")
    plain = md.replace(WORD_JOINER, "")
    assert "https://e.example/p.png" in plain and "@octocat" in plain and "www.e.example" in plain
    # Every table row keeps its seven cells: a '|' in a name does not add one.
    rows = [x for x in lines if x.startswith("| ") and "memtrack check" not in x]
    cells = {len(re.split(r"(?<!\\)\|", x)) for x in rows}
    assert cells == {9}, rows

    # Posted as the PR comment, the body carries one marker and closes what it opened.
    body = comment.body_of(md)
    assert _render(body).count(MARKER) == 1 and body.startswith(MARKER)
    long = md.replace("\n</details>", "\n" + "| more |\n" * 20_000 + "</details>")
    cut = _render(comment.body_of(long))
    assert cut.count(MARKER) == 1 and cut.count("<details>") == cut.count("</details>") >= 1


def test_the_history_markdown_escapes_recorded_subjects():
    from memtrack.judge.history import HistoryResult, Step
    from memtrack.report.history import history_markdown

    step = Step(
        case_id=case_id(NAME, {"batch": 1}),
        metric="allocated",
        commit="a" * 40,
        previous_commit="b" * 40,
        subject=MESSAGE,
        before=1.0,
        after=2.0,
        delta=1.0,
        delta_pct=100.0,
        headroom=0.5,
    )
    h = HistoryResult(
        base_branch="main",
        series=1,
        commits=2,
        fingerprint="f" * 16,
        anchor_label="the run 50 commits ago",
        steps=(step,),
        creeps=(),
    )
    md = history_markdown(h)
    html = _render(md)
    assert "<img" not in html and "<script" not in html and "<h1>" not in html
    assert MARKER not in html and "<a " not in html
    prose = re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", md)
    assert "https://" not in prose and "boom # heading" in prose


def test_recorded_control_characters_never_reach_the_terminal(tmp_path):
    """An escape sequence from a record would clear the screen, retitle the window or
    plant a hyperlink: `show`, `history` and `check` print it as visible text."""
    m = make_measurement(
        "w" + TERMINAL,
        {"batch": 1},
        status="error",
        message="failed" + TERMINAL,
        traceback="".join(f"  frame {i}\n" for i in range(40)) + "Error: tb" + TERMINAL,
        notes=("note" + TERMINAL,),
    )
    run = make_run([m], branch="main", subject="s" + TERMINAL)
    run = replace(run, git=replace(run.git, branch="b" + TERMINAL))
    checked, db = _ingest_and_check(tmp_path, run)
    runner = CliRunner()
    shown = runner.invoke(main, ["show", run.run_id, "--db", str(db)])
    history = runner.invoke(main, ["history", "w" + TERMINAL, "--db", str(db)])
    assert shown.exit_code == 0 and history.exit_code == 0, shown.output + history.output
    for result in (checked, shown, history):
        out = result.output
        assert not set(out) & {"\x1b", "\x07", "\r", "\x9b"}, out
        assert "\\x1b[2J" in out  # what was recorded is shown, visibly
    assert "failed\\x1b" in shown.output and "note\\x1b" in shown.output
    # a failed case's traceback is shown, its end where the error is
    assert "Error: tb\\x1b" in shown.output and "frame 39" in shown.output
    assert "earlier lines: --json has them)" in shown.output
    assert not re.search(r"frame [0-9]\b", shown.output)  # the first lines are cut


@pytest.mark.parametrize(
    "text",
    [
        NAME,
        BRANCH,
        MESSAGE,
        TERMINAL,
        "1. list",
        "- item",
        "> quote",
        "***",
        "a|b",
        "``",
        "$x$",
        ":red[x]",
    ],
)
def test_each_output_kind_keeps_the_text_inert(text):
    md = markdown_text(text)
    html = _render(f"| a |\n|---|\n| {md} |\n\nx {md}\n\n{md}\n")
    assert "<img" not in html and "<a " not in html and "<h" not in html
    assert "<script" not in html and "<li>" not in html and "<blockquote>" not in html
    assert "<hr" not in html and "<em>" not in html and "<strong>" not in html
    assert "\n" not in md and "\n" not in markdown_code(text) and "\n" not in html_text(text)
    code = markdown_code(text, in_table=True)
    assert _render(f"| a |\n|---|\n| {code} |\n").count("<td>") == 1
    assert "<" not in html_text(text) and "\x1b" not in terminal_text(text)
    assert json.dumps(terminal_text(text)).count("\\u001b") == 0


def test_a_number_starts_a_list_only_as_a_list_marker():
    from memtrack.escape import markdown_text

    assert markdown_text("1. first") == "1\\. first"
    assert markdown_text("2)") == "2\\)"
    assert markdown_text("189.30 KiB (50.0%)") == "189.30 KiB (50.0%)"
