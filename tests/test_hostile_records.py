"""Any record `memtrack ingest` accepts is shown as the text it holds, wherever it is shown.

A record may come from anywhere (a fork's CI, a hand-edited file), and its free text from
whoever wrote the workload or the commit. Hypothesis builds records whose text mixes what
attacks each output (Markdown images and links, autolinks, HTML, terminal escapes, bidi
overrides, line and paragraph separators, mentions, table cells) with arbitrary text; each
record that ingest accepts is then shown by `show`, `history`, `check --markdown` and every
dashboard page. None may raise, put a raw control or separator character on a terminal,
make a page fetch anything, or link anywhere but this dashboard and the configured forge.
"""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from factories import make_measurement, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtrack.cli import main
from memtrack.errors import RecordError
from memtrack.records import CIInfo, run_from_dict, to_dict
from memtrack.workload.registry import case_id

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
DASHBOARD_URL = "https://dash.example/memtrack"
FORGE = "https://github.com"

HOSTILE = [
    "![x](https://evil.example/md.png)",
    "[docs](https://evil.example/phish)",
    "<https://evil.example/auto>",
    "www.evil.example/w",
    "https://evil.example/bare",
    "ftp://evil.example/f",
    '<img src="https://evil.example/i.png">',
    '<a href="https://evil.example/a">a</a>',
    "[ref]: https://evil.example/ref",
    "\x1b[2J\x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
    "\x1b]0;title\x07",
    "\r",
    "\x07",
    "\x00",
    "\u2028",
    "\u2029",
    "\x85",
    "\u202e",
    "\u2066",
    "@octocat",
    "user@evil.example",
    "| a | b |",
    "\n# heading\n",
    "$$x^2$$",
    "`code`",
    ":red[alert]",
    "<!-- -->",
    "&lt;",
    "\\",
    "    ",
]

_text = st.lists(st.sampled_from(HOSTILE) | st.text(max_size=6), min_size=1, max_size=4).map(
    "".join
)
_fields = st.fixed_dictionaries(
    {
        "subject": _text,
        "branch": _text,
        "note": _text,
        "message": _text,
        "traceback": _text,
        "param": _text,
        "run_url": st.sampled_from(["https://evil.example/o/r/actions/runs/1", "javascript:x"])
        | _text,
        "runner": _text,
        "env_value": _text,
    }
)


def _record(f: dict[str, str]) -> dict[str, Any]:
    """A two-run-worth record: a case that ran, one that failed, one whose param is text."""
    ok = dataclasses.replace(
        make_measurement("decoder", {"batch": 1}),
        notes=(f["note"],),
        device_view_note=f["note"],
    )
    failed = dataclasses.replace(
        make_measurement("decoder", {"batch": 8}, status="error"),
        message=f["message"],
        traceback=f["traceback"],
    )
    params = {"batch": 2, "mode": f["param"]}
    odd = dataclasses.replace(
        make_measurement("decoder", params), case_id=case_id("decoder", params)
    )
    run = make_run(
        [ok, failed, odd],
        branch=f["branch"],
        subject=f["subject"],
        ci=CIInfo(
            provider="github",
            event="pull_request",
            pr_number=7,
            run_url=f["run_url"],
            runner_name=f["runner"],
            head_ref=f["branch"],
        ),
    )
    run = dataclasses.replace(
        run,
        environment=dataclasses.replace(run.environment, env_vars={"CUDA_MODULE": f["env_value"]}),
    )
    return to_dict(run)


def _accepted(data: dict[str, Any]) -> bool:
    try:
        run_from_dict(json.loads(json.dumps(data)), where="r.json")
    except RecordError:
        return False
    return True


_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _terminal_safe(out: str) -> None:
    """Nothing that acts on a terminal or breaks a line where the text had none."""
    for ch in out:
        if ch == "\n":
            continue
        assert unicodedata.category(ch) not in ("Cc", "Cs", "Zl", "Zp"), repr(ch)
        assert ch not in _BIDI, repr(ch)


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src", "srcset", "action", "formaction", "background", "poster"):
                self.found.append((tag, value or ""))
        if tag in ("img", "iframe", "script", "object", "embed", "video", "audio", "link"):
            self.found.append((tag, dict(attrs).get("src") or dict(attrs).get("href") or ""))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


_LIVE = re.compile(
    r"(?i)(?:\b[a-z][a-z0-9+.-]*://|\bwww\.|\bmailto:|[a-z0-9._+-]+@[a-z0-9-]+\.[a-z])"
)
"""What GitHub's and Streamlit's Markdown turn into a link by itself (GFM autolinks)."""


def _home(target: str) -> bool:
    return (
        target.startswith(("?", "#", "/"))
        or target.startswith(DASHBOARD_URL + "/")
        or target.startswith(DASHBOARD_URL + "?")
        or target.startswith(FORGE + "/")
    )


def _markdown_safe(source: str) -> None:
    """Rendered as CommonMark with HTML (as GitHub and st.markdown(unsafe_allow_html) do):
    no image or embed, every link to this dashboard or the forge, and no text that a GFM
    reader would turn into a live link by itself."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(source)
    tags = _Tags()
    tags.feed(rendered)
    for tag, target in tags.found:
        assert tag == "a" and _home(target), (tag, target, source)
    text = "".join(tags.text)
    for m in _LIVE.finditer(text):
        assert _home(text[m.start() :]), (text[m.start() : m.start() + 60], source)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "wl.py").write_text(
        "import memtrack\n\n@memtrack.workload(params={'batch': [1, 8]})\n"
        "def decoder(ctx):\n    return lambda: None\n"
    )
    config = tmp_path / "memtrack.toml"
    config.write_text(f'modules = ["wl.py"]\ndashboard_url = "{DASHBOARD_URL}"\n')
    return config


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def _ingested(work: Path, data: dict[str, Any]) -> tuple[Path, Path]:
    """A project in `work` and a database holding the record, through `memtrack ingest`."""
    work.mkdir()
    config = _project(work)
    record = work / "r.json"
    record.write_text(json.dumps(data))
    db = work / "m.db"
    res = _cli("ingest", str(record), "--db", str(db), "--config", str(config))
    assert res.exit_code == 0, res.output
    return config, db


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_fields)
def test_any_accepted_record_shows_as_text_in_show_history_and_the_pr_comment(tmp_path, f):
    data = _record(f)
    if not _accepted(data):
        return  # refused at ingest, one line: the record tests hold that
    config, db = _ingested(tmp_path / data["run_id"], data)
    work = db.parent
    for args in (["show", data["run_id"]], ["history", "decoder"]):
        res = _cli(*args, "--db", str(db), "--config", str(config))
        assert res.exit_code == 0 and res.exception is None, (args, res.output)
        _terminal_safe(res.output)
    md = work / "comment.md"
    res = _cli(
        "check", "--run", data["run_id"], "--no-record", "--markdown", str(md),
        "--db", str(db), "--config", str(config),
    )  # fmt: skip
    assert res.exit_code in (0, 1) and not isinstance(res.exception, Exception), res.output
    _terminal_safe(res.output)
    _markdown_safe(md.read_text())


def _page_sources(at: Any) -> list[str]:
    """Every string a page hands Streamlit's Markdown reader (markdown, captions, headings,
    alerts, labels)."""
    out = []
    for kind in ("markdown", "caption", "title", "header", "subheader", "info", "warning",
                 "error", "success", "exception"):  # fmt: skip
        out += [str(e.value) for e in getattr(at, kind, [])]
    return out


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_fields)
def test_any_accepted_record_shows_as_text_on_every_dashboard_page(tmp_path, monkeypatch, f):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    data = _record(f)
    if not _accepted(data):
        return
    config, db = _ingested(tmp_path / data["run_id"], data)
    monkeypatch.setattr(sys, "argv", [str(APP), "--db", str(db), "--config", str(config)])
    sys.path.insert(0, str(ROOT))
    case = data["measurements"][0]["case_id"]
    for query in (
        {},
        {"page": "History", "case": case},
        {"page": "Regressions"},
        {"page": "Run detail", "run": data["run_id"]},
        {"page": "Compare", "a": data["run_id"], "b": data["run_id"]},
        {"page": "Plan"},
    ):
        at = AppTest.from_file(str(APP), default_timeout=120)
        for k, v in query.items():
            at.query_params[k] = v
        at.run()
        assert not at.exception, (query, [e.message for e in at.exception])
        for source in _page_sources(at):
            _markdown_safe(source)
            _terminal_safe(source)  # no raw control, separator or bidi character either
        for frame in at.dataframe:
            for cell in frame.value.astype(str).to_numpy().ravel():
                _terminal_safe(cell)
