"""The dashboard on a story as a reviewer reads it (tests/factories.story_history): a real
repository whose main merges a bigger KV cache for decoder (+8 MiB) and reverts it one
commit later, then merges a pull request that grows encoder by one intentional change,
accepted with one `Memtrack-Accept:` trailer. Every run was checked as CI checks it,
verdicts recorded. The pages are drawn by the real app (AppTest)."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from factories import (
    STORY_ACCEPT,
    STORY_MERGE,
    STORY_REASON,
    STORY_REVERT,
    MiB,
    make_measurement,
    make_run,
    story_history,
)

from memtrack.store.database import Store

pytest.importorskip("streamlit")
from apptables import table as read_table  # noqa: E402
from memtrack.dashboard.panels import LANE  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
DECODER, ENCODER = "decoder[batch=1]", "encoder[batch=8]"


@pytest.fixture(scope="module")
def reverted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The story up to four commits after the revert: the accepted step not yet made."""
    return story_history(tmp_path_factory.mktemp("reverted"), until=STORY_REVERT + 4)


@pytest.fixture(scope="module")
def accepted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The whole story: three commits after the accepted step."""
    return story_history(tmp_path_factory.mktemp("accepted"), until=STORY_ACCEPT + 3)


def _app(monkeypatch: pytest.MonkeyPatch, story: dict, **query: str) -> AppTest:
    monkeypatch.setattr(
        sys, "argv", [str(APP), "--db", str(story["db"]), "--config", str(story["config"])]
    )
    at = AppTest.from_file(str(APP), default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements).replace("\\", "")


def test_a_merge_and_its_revert_show_on_the_overview_and_the_regressions(
    monkeypatch, reverted
) -> None:
    """The gate reported the merge on main (its host peak, past its headroom) and the next
    run fixed it: the gate's regression and its fix show, on both pages, beside the step and
    its revert the step finder sees in the allocated view (8 MiB, beyond a noise of about a
    MiB: twice its headroom, for one run)."""
    merge, revert = reverted["shas"][STORY_MERGE][:10], reverted["shas"][STORY_REVERT][:10]
    table = read_table(_app(monkeypatch, reverted), "overview_table").set_index("case id")
    change = table.loc[DECODER, "last change"]
    assert not change.startswith("none in"), change
    assert re.fullmatch(
        rf"\+\d\.\d\d MiB \(\+0\.\d%\), host RSS \+\d\.\d\d MiB \(\+1\.\d%\) at {merge} "
        rf"\(the gate's regression\), fixed at {revert}",
        change,
    ), change
    assert table.loc[DECODER, "status"] == "ok"  # fixed: nothing calls for attention

    at = _app(monkeypatch, reverted, page="Regressions")
    assert "No step" not in _texts(at.success)
    row = read_table(at).set_index("commit").loc[merge]
    assert (row["case"], row["view"], row["also moved"], row["verdict"], row["fixed by"]) == (
        "decoder",
        "allocated",
        "host RSS",  # the merge grew both views, and its revert fixed both
        "regression",
        revert,
    )
    assert row["subject"] == "a bigger KV cache for decoder"
    assert "0 up and not fixed or accepted" in _texts(at.markdown)


def test_an_accepted_step_says_so_with_its_reason_on_the_overview(monkeypatch, accepted) -> None:
    step = accepted["shas"][STORY_ACCEPT][:10]
    at = _app(monkeypatch, accepted)
    table = read_table(at, "overview_table").set_index("case id")
    assert table.loc[ENCODER, "last change"] == (
        f"+48.00 MiB (+16.0%) at {step}, accepted: {STORY_REASON}"
    )
    # the pull request that brought it passes, and says what it accepted and why
    prs = read_table(at, "ov_prs").set_index("branch")
    assert prs.loc["feature/encoder-head", "verdict"] == f"passes, 3 accepted: {STORY_REASON}"
    rows = read_table(_app(monkeypatch, accepted, page="Regressions")).set_index("commit")
    assert rows.loc[step, "verdict"] == f"accepted: {STORY_REASON}"
    assert rows.loc[step, "fixed by"] == "accepted"  # not "not yet": nothing to fix


def _panels(at: AppTest) -> list[ET.Element]:
    return [ET.fromstring(e.value) for e in at.markdown if e.value.startswith("<svg")]


def _drawn(panel: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in panel.iter() if (e.get("class") or "") == cls]


def test_history_draws_a_step_as_a_step_and_says_each_verdict_once(monkeypatch, accepted) -> None:
    at = _app(monkeypatch, accepted, page="History", case=ENCODER)
    allocated = _panels(at)[0]
    assert allocated.get("data-metric") == "allocated"
    (line,) = _drawn(allocated, "line base")
    xy = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
    # every segment is flat or upright: a figure holds until the next run moves it
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(xy, xy[1:], strict=False)), xy
    assert len({y for _, y in xy}) == 2  # two levels, one step between them
    said = list(read_table(at, "h_events")["what"])
    assert f"allocated: accepted: {STORY_REASON}" in said
    # a verdict's message names its view first: said once, not 'host: host: baseline'
    events = read_table(_app(monkeypatch, accepted, page="History", case=DECODER), "h_events")
    said = [w for w in events[events["event"] == "regression"]["what"] if w.startswith("host")]
    assert len(said) == 1 and said[0].startswith("host: baseline "), said


def test_the_time_chart_keeps_a_branch_off_the_line_and_names_it(monkeypatch, accepted) -> None:
    at = _app(monkeypatch, accepted, page="History", case=ENCODER)
    time = _panels(at)[-1]
    assert time.get("data-metric") == "time"
    others = _drawn(time, "point other")
    assert len(others) == 1  # the pull request's run: a ◇ beside main's line
    assert "feature/encoder-head" in "".join(others[0].itertext())
    on_line = _drawn(time, "point median")
    assert on_line and all(" · main · " in "".join(p.itertext()) for p in on_line)
    (median,) = _drawn(time, "line median")
    assert len(median.get("points", "").split()) == len(on_line)  # main's runs only


def test_a_history_of_runs_minutes_apart_has_a_readable_time_axis(monkeypatch, tmp_path) -> None:
    db = tmp_path / "memtrack.db"
    with Store.open(db) as store:
        for i in range(8):
            peak = (100 if i < 4 else 108) * MiB
            store.write_run(
                make_run(
                    [make_measurement(peak=peak)],
                    branch="main",
                    started_at=f"2026-03-01T10:{5 * i:02d}:00+00:00",
                )
            )
    config = tmp_path / "memtrack.toml"
    config.write_text('base_branch = "main"\n')
    at = _app(monkeypatch, {"db": db, "config": config}, page="History", case="decoder")
    ticks = [t.text for t in _panels(at)[0].iter() if t.get("class") == "xtick"]
    assert len(set(ticks)) >= 3, ticks  # a span of 35 minutes, labelled along its length


def test_a_page_named_in_any_case_is_drawn_in_one_run(monkeypatch, reverted) -> None:
    """`?page=regressions` draws Regressions in the run that reads it, and says the name
    right in the address: no rerun, which could leave the page blank between the two."""
    import streamlit

    reruns: list[object] = []
    real = streamlit.rerun
    monkeypatch.setattr(streamlit, "rerun", lambda *a, **k: (reruns.append(a), real(*a, **k)))
    at = _app(monkeypatch, reverted, page="regressions")
    assert reruns == []
    assert at.radio(key="page").value == "Regressions"
    assert at.query_params["page"] in ("Regressions", ["Regressions"])
    assert [t.value for t in at.title] == ["Regressions"]


def test_a_branch_run_sits_at_its_merge_base_on_the_base_branchs_commit_time_axis(
    monkeypatch, tmp_path
) -> None:
    """Commits dated a year ahead of their runs (a clock, a rebase): main is placed by its
    commits' times, and a pull request's run at its merge-base, not at its run's start."""
    db = tmp_path / "memtrack.db"
    shas = [f"{i:x}" * 40 for i in range(1, 7)]
    with Store.open(db) as store:
        for i, sha in enumerate(shas):
            run = make_run(
                [make_measurement(peak=100 * MiB)],
                commit=sha,
                branch="main",
                started_at=f"2026-03-01T10:{i:02d}:00+00:00",
            )
            store.write_run(
                replace(run, git=replace(run.git, committed_at=f"2027-03-0{i + 1}T12:00:00+02:00"))
            )
        pr = make_run(
            [make_measurement(peak=104 * MiB)],
            branch="feature",
            started_at="2026-03-01T11:00:00+00:00",
            merge_base=shas[2],
        )
        store.write_run(pr)
    config = tmp_path / "memtrack.toml"
    config.write_text('base_branch = "main"\n')
    at = _app(monkeypatch, {"db": db, "config": config}, page="History", case="decoder")
    allocated = _panels(at)[0]
    xs = [float(p.get("cx")) for p in _drawn(allocated, "point base")]
    assert len(xs) == 6 and xs == sorted(xs) and xs[0] < xs[-1]  # spread along the axis
    (other,) = _drawn(allocated, "point other")
    x = float(other.get("d")[1:].split(",")[0])
    # at its merge-base, the third commit: in its branch's lane just right of main's point
    assert 0 < x - xs[2] <= LANE, (x, xs[2])
