"""The dashboard through Streamlit's AppTest, on a real SQLite store seeded through Store."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from factories import CPU_ENV, GPU_ENV, MiB, make_measurement, make_run

from memtrack.records import CIInfo
from memtrack.store.database import Store

pytest.importorskip("streamlit")
from apptables import table, tables  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
sys.path.insert(0, str(ROOT))

from memtrack.dashboard import model  # noqa: E402

D1 = "decoder[batch=1]"
D8 = "decoder[batch=8]"
TRAIN = "training[batch=4]"
VISION = "vision[res=512]"
REPO = "https://github.com/acme/model"

CONFIG = """
base_branch = "main"

[[budgets]]
workload = "decoder[batch=8]"
limit = "350 MiB"
metric = "allocated"
reason = "one serving slice"

[[budgets]]
workload = "decoder"
limit = "200 MiB"
metric = "allocated"
reason = "every decoder case fits a small slice"
"""

MAIN = 14
"""Commits on main, one a day from 2026-01-01: 01aaaa... to 14aaaa..."""


def commit(i: int) -> str:
    return f"{i:02d}" + "a" * 38


def _suite(i: int, gpu: bool) -> list:
    """Commit i's figures: decoder[batch=1] grows its KV cache by 2 MiB at commit 6 and is
    fixed at 10; decoder[batch=8] steps from 256 to 320 MiB at 9 and stays; training grows
    its optimizer state by 8 MiB at 12 (accepted); vision fails at 11 and 14."""
    kw = dict(device="cuda") if gpu else {}

    def figures(peak: int) -> dict:
        # Host RSS moves by a few MiB run to run; the allocator's counters are exact.
        out: dict = dict(host=300 * MiB + (i * 7919 % 5) * MiB, host_step=20 * MiB)
        if gpu:
            out.update(reserved=peak + 20 * MiB, device_peak=peak + 520 * MiB + (i % 2) * 2 * MiB)
        return out

    d1 = (182 if 6 <= i < 10 else 180) * MiB
    d8 = (320 if i >= 9 else 256) * MiB
    train = (708 if i >= 12 else 700) * MiB
    vision_failed = i in (11, MAIN)
    return [
        make_measurement(
            "decoder",
            {"batch": 1},
            peak=d1,
            **kw,
            **figures(d1),
            caches_bytes=(34 if 6 <= i < 10 else 32) * MiB,
        ),
        make_measurement("decoder", {"batch": 8}, peak=d8, **kw, **figures(d8)),
        make_measurement(
            "training",
            {"batch": 4},
            peak=train,
            **kw,
            **figures(train),
            gradients_bytes=100 * MiB,
            optimizer_state_bytes=(208 if i >= 12 else 200) * MiB,
            time_s=0.02,
        ),
        make_measurement(
            "vision",
            {"res": 512},
            peak=90 * MiB,
            **kw,
            **figures(90 * MiB),
            status="oom" if vision_failed else "ok",
            message="CUDA out of memory. Tried to allocate 2.00 GiB" if vision_failed else None,
            traceback="Traceback (most recent call last):\n  ...\n"
            "torch.OutOfMemoryError: CUDA out of memory"
            if vision_failed
            else None,
        ),
    ]


@pytest.fixture
def seeded(tmp_path: Path) -> dict:
    return seed_store(tmp_path)


def _verdict(store: Store, run_id: str, case: str, kind: str, context: str, **fields) -> None:
    row = {
        "run_id": run_id,
        "case_id": case,
        "workload": case.split("[")[0],
        "metric": "allocated",
        "kind": kind,
        "blocking": int(kind in ("regression", "over_budget") and context != "base"),
        "provisional": 0,
        "context": context,
        "checked_at": "2026-01-15T00:00:00+00:00",
        **fields,
    }
    store.conn.execute(
        f"insert into verdicts ({', '.join(row)}) values ({', '.join('?' for _ in row)})",
        list(row.values()),
    )


def seed_store(tmp_path: Path, repo: str = REPO) -> dict:
    """A realistic history: 14 commits on main, a day apart (two on the CPU, then the GPU:
    an environment change), with the steps of `_suite`; the gate's base-branch verdicts
    (the regressions at 6 and 9, the acceptance at 12); a pull request that slims
    decoder[batch=1] and one that puts decoder[batch=8] over its budget. Each run of main
    records its CI run at `repo`."""
    db = tmp_path / "memtrack.db"
    runs = []
    for i in range(1, MAIN + 1):
        gpu = i >= 3
        runs.append(
            make_run(
                _suite(i, gpu),
                commit=commit(i),
                branch="main",
                subject=f"main commit {i}",
                started_at=f"2026-01-{i:02d}T12:00:00+00:00",
                env=GPU_ENV if gpu else CPU_ENV,
                ci=CIInfo(
                    provider="github-actions",
                    event="push",
                    run_url=f"{repo}/actions/runs/{1000 + i}",
                ),
            )
        )
    slim = make_run(
        [
            make_measurement(
                "decoder",
                {"batch": 1},
                peak=150 * MiB,
                device="cuda",
                reserved=170 * MiB,
                device_peak=690 * MiB,
            )
        ],
        commit="f" * 40,
        branch="feature/slim",
        subject="slimmer decoder cache",
        started_at="2026-01-15T12:00:00+00:00",
        env=GPU_ENV,
    )
    big = make_run(
        [
            make_measurement(
                "decoder",
                {"batch": 8},
                peak=400 * MiB,
                device="cuda",
                reserved=420 * MiB,
                device_peak=920 * MiB,
            )
        ],
        commit="e" * 40,
        branch="feature/long-context",
        subject="longer context",
        started_at="2026-01-15T13:00:00+00:00",
        env=GPU_ENV,
    )
    with Store.open(db) as store:
        for r in [*runs, slim, big]:
            store.write_run(r)
        _verdict(
            store,
            runs[5].run_id,
            D1,
            "regression",
            "base",
            baseline_value=180 * MiB,
            threshold=181 * MiB,
            candidate_value=182 * MiB,
            delta=2 * MiB,
            component="caches",
            component_delta=2 * MiB,
            message="regression: decoder[batch=1] allocated +2.00 MiB (+1.1%)",
        )
        _verdict(
            store,
            runs[8].run_id,
            D8,
            "regression",
            "base",
            baseline_value=256 * MiB,
            threshold=258 * MiB,
            candidate_value=320 * MiB,
            delta=64 * MiB,
            message="regression: decoder[batch=8] allocated +64.00 MiB (+25.0%)",
        )
        _verdict(
            store,
            runs[13].run_id,
            D8,
            "ok",
            "base",
            baseline_value=320 * MiB,
            threshold=322 * MiB,
            candidate_value=320 * MiB,
            budget_bytes=350 * MiB,
        )
        _verdict(
            store,
            runs[11].run_id,
            TRAIN,
            "accepted",
            "base",
            baseline_value=700 * MiB,
            threshold=702 * MiB,
            candidate_value=708 * MiB,
            component="optimizer state",
            component_delta=8 * MiB,
            accepted_reason="AdamW state in fp32, reviewed",
            message="accepted: training[batch=4] allocated +8.00 MiB",
        )
        _verdict(
            store,
            big.run_id,
            D8,
            "over_budget",
            "pull_request",
            baseline_value=320 * MiB,
            threshold=322 * MiB,
            candidate_value=400 * MiB,
            budget_bytes=350 * MiB,
            budget_reason="one serving slice",
            message="over budget: decoder[batch=8] allocated 400.00 MiB > 350.00 MiB",
        )
    config = tmp_path / "memtrack.toml"
    config.write_text(CONFIG)
    return {"db": db, "config": config, "runs": runs, "slim": slim, "big": big}


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, seeded: dict):
    """An AppTest factory over the seeded store; query parameters make deep links."""

    def make(db: Path | None = None, config: Path | None = None, **query: str) -> AppTest:
        monkeypatch.setattr(
            sys,
            "argv",
            [
                str(APP),
                "--db",
                str(db or seeded["db"]),
                "--config",
                str(config or seeded["config"]),
            ],
        )
        at = AppTest.from_file(str(APP), default_timeout=60)
        for k, v in query.items():
            at.query_params[k] = v
        return at.run()

    return make


def _ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.message for e in at.exception]
    return at


def _texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def _plain(text: str) -> str:
    """Shown text less the backslashes that keep it from being Markdown."""
    return text.replace("\\", "")


def _table(at: AppTest, which: int | str = 0):
    return table(at, which)


# -- pages ----------------------------------------------------------------------------


def _charts(at: AppTest) -> list[dict]:
    """The Vega-Lite specs drawn, in page order."""
    return [json.loads(e.proto.spec) for e in at.get("vega_lite_chart")]


def _chart_data(at: AppTest, which: int = 0) -> dict[str, Any]:
    """A drawn chart's named datasets (an Altair chart's data travels beside its spec)."""
    import pyarrow as pa

    proto = at.get("vega_lite_chart")[which].proto
    return {d.name: pa.ipc.open_stream(d.data.data).read_pandas() for d in proto.datasets}


def _panels(at: AppTest) -> list[ET.Element]:
    """History's SVG panels, in page order."""
    return [ET.fromstring(e.value) for e in at.markdown if e.value.startswith("<svg")]


def _drawn(panel: ET.Element, cls: str) -> list[ET.Element]:
    """The panel's elements of a class ('point other', 'mark', 'budget', ...)."""
    return [
        e for e in panel.iter() if cls in (e.get("class") or "").split(" ") or e.get("class") == cls
    ]


def _domain(panel: ET.Element) -> tuple[float, float]:
    found = re.search(r"values from (-?[\d.,]+) to (-?[\d.,]+)", panel.get("aria-label", ""))
    assert found, panel.get("aria-label")
    low, high = (float(x.replace(",", "")) for x in found.groups())
    return low, high


def test_overview_shows_every_case_most_urgent_first(app) -> None:
    at = _ok(app())
    table = _table(at)
    assert list(table["case id"]) == [VISION, D8, D1, TRAIN]
    assert list(table["status"]) == ["failed", "regression", "near budget", "ok"]
    # Shown short: the workload and the params that tell its cases apart.
    assert list(table["case"]) == ["vision", D8, D1, "training"]
    row = table.set_index("case id").loc[D8]
    assert (row["view"], row["peak"], row["budget"], row["margin"]) == (
        "allocated",
        "320.00 MiB",
        "350.00 MiB",
        "30.00 MiB left",
    )
    assert row["used"] == "91.4%"
    assert row["last change"] == "+64.00 MiB (+25.0%) at 09aaaaaaaa"
    assert len(row["trend"]) == MAIN
    # Every step of the window, not only the newest: the regression and its fix.
    assert table.set_index("case id").loc[D1, "last change"] == (
        "+2.00 MiB (+1.1%) at 06aaaaaaaa, fixed at 10aaaaaaaa"
    )
    assert "CUDA out of memory" in _texts(at.error)
    warned = _texts(at.warning).replace("\\", "")
    assert (
        "decoder[batch=8] · allocated +64.00 MiB since 09aaaaaaaa (main commit 9), not "
        "fixed or accepted · now 320.00 MiB, fixed when back within 258.00 MiB"
    ) in warned
    assert "main at 14aaaaaaaa" in warned


def test_a_regression_on_main_holds_until_a_run_is_back_within_its_threshold(
    app, seeded: dict
) -> None:
    # The newest run on main has an `ok` verdict of its own, yet the step at 09 was never
    # fixed: the case stays a regression. decoder[batch=1]'s regression at 06 was fixed at 10.
    table = _table(_ok(app())).set_index("case id")
    assert table.loc[D8, "status"] == "regression" and table.loc[D1, "status"] != "regression"
    fix = make_run(
        _suite(MAIN + 1, True)[:1]
        + [
            make_measurement(
                "decoder",
                {"batch": 8},
                peak=256 * MiB,
                device="cuda",
                reserved=276 * MiB,
                device_peak=776 * MiB,
            )
        ],
        commit=commit(MAIN + 1),
        branch="main",
        subject="restore the decoder cache",
        started_at="2026-01-16T12:00:00+00:00",
        env=GPU_ENV,
    )
    with Store.open(seeded["db"]) as store:
        store.write_run(fix)
    table = _table(_ok(app())).set_index("case id")
    assert table.loc[D8, "status"] == "ok"
    assert table.loc[D8, "last change"] == "+64.00 MiB (+25.0%) at 09aaaaaaaa, fixed at 15aaaaaaaa"


def _html(at: AppTest, key: str) -> ET.Element:
    """A table drawn as HTML (dashboard/tables.py), by its key, as its markup."""
    from apptables import HTML_TABLE

    found = [
        ET.fromstring(str(e.value)) for e in at.markdown if str(e.value).startswith(HTML_TABLE)
    ]
    (root,) = [r for r in found if r.get("id") == key]
    return root


OVERVIEW_WIDTH = 1120
"""The page's width at a 1,280 px browser (Streamlit's wide layout, sidebar collapsed)."""


def test_overview_is_one_line_a_case_as_wide_as_the_page_its_notes_under_it(app) -> None:
    """The Overview's tables are laid out to the page's width, never wider: the key
    columns, each one line, fixed widths that leave room for the last change at 1,280 px;
    a cut cell has its whole text as its tooltip; the case's full id, its environment, its
    noise and its notes (whole paragraphs) sit under the table, opened on demand."""
    at = _ok(app())
    root = _html(at, "overview_table")
    assert "table-layout: fixed" in root.find("table").get("style")
    assert "width: 100%" in root.find("table").get("style")
    heads = [th.text for th in root.iter("th")]
    assert heads == [
        "status", "case", "view", "peak", "budget", "used", "trend", "last change",
        "commit", "branch",
    ]  # fmt: skip
    widths = [
        int(re.search(r"width: (\d+)px", th.get("style") or "").group(1))
        for th in root.iter("th")
        if "width:" in (th.get("style") or "")
    ]
    assert sum(widths) + 150 <= OVERVIEW_WIDTH  # the last change keeps 150 px or more
    cells = list(root.iter("td"))
    assert all("white-space: normal" not in (td.get("style") or "") for td in cells)
    assert all(
        "text-overflow: ellipsis" in (td.get("style") or "")
        for td in cells
        if td.get("data-col") != "trend"
    )
    table = _table(at).set_index("case id")  # the case's tooltip is its full id
    # a cut cell's tooltip is its whole text
    tips = [td.get("title") for td in root.iter("td") if td.get("data-col") == "last change"]
    assert "+2.00 MiB (+1.1%) at 06aaaaaaaa, fixed at 10aaaaaaaa" in tips
    assert tips == list(table["last change"])
    assert "note" not in table.columns and "environment" not in table.columns
    details = _table(at, "overview_details").set_index("case id")
    assert details.loc[VISION, "note"].startswith("oom: CUDA out of memory")
    assert "NVIDIA H200" in details.loc[D8, "environment"]
    assert details.loc[D8, "latest run"].startswith("2026-01-14 12:00")
    assert table.loc[D8, "latest run"] == details.loc[D8, "latest run"]  # the commit's tip
    prs = _html(at, "ov_prs")
    assert "table-layout: fixed" in prs.find("table").get("style")
    assert all("white-space: normal" not in (td.get("style") or "") for td in prs.iter("td"))


def test_overview_branch_filter_changes_what_is_shown(app) -> None:
    at = _ok(app())
    at.selectbox(key="ov_branch").set_value("feature/slim").run()
    table = _table(_ok(at))
    assert list(table["case id"]) == [D1]
    assert table["peak"][0] == "150.00 MiB" and table["status"][0] == "ok"
    at.selectbox(key="ov_branch").set_value("feature/long-context").run()
    table = _table(_ok(at))
    assert list(table["status"]) == ["over budget"] and table["used"][0] == "114.3%"
    callout = _texts(at.error)
    assert "over budget" in callout and "feature/long-context at eeeeeeeeee" in callout


def test_used_is_red_past_the_budget() -> None:
    from memtrack.dashboard.views.overview import _used_style

    assert "#fbd5d5" in _used_style(114.3)
    assert "#fdf1bf" in _used_style(91.4)
    assert _used_style(50.0) == "" and _used_style(None) == "" and _used_style("-") == ""
    assert "#fbd5d5" in _used_style("114.3%")


def test_history_draws_each_view_on_its_own_scale(app) -> None:
    at = _ok(app(page="History", case=D8))
    assert at.selectbox(key="case").value == D8
    panels = _panels(at)
    # The budgeted view first, then the views that moved (host RSS and the host step did
    # not: a click away); completion time last.
    assert [p.get("data-metric") for p in panels] == ["allocated", "reserved", "device", "time"]
    first = panels[0]
    assert "framework allocated (MiB)" in "".join(first.itertext())
    low, high = _domain(first)
    assert 0 < low <= 256 and 400 <= high < 900  # its own scale, not from 0
    assert [int(b.get("data-bytes")) for b in _drawn(first, "budget")] == [350 * MiB]
    ticks = [t.text for t in _drawn(first, "xtick")]
    assert ticks and all(re.fullmatch(r"Jan \d\d", t) for t in ticks), ticks  # dates
    assert "iteration time" in "".join(panels[-1].itertext())
    # One mark a run on the time panel, its tooltip giving the median and the p95.
    times = _drawn(panels[-1], "point")
    tips = ["".join(m.itertext()) for m in times]
    assert tips and all(t.startswith("median ") and " · p95 " in t for t in tips), tips
    assert len({m.get("cx") for m in times}) == len(times)
    events = _table(at)
    kinds = set(events["event"])
    assert {"step", "environment", "regression", "over budget"} <= kinds  # as said
    env = events[events["event"] == "environment"].iloc[0]
    assert "torch 2.13.0+cpu → 2.14.1+cu130" in env["what"] and env["commit"] == "03aaaaaaaa"
    step = events[
        (events["event"] == "step") & events["what"].str.startswith("framework allocated")
    ]
    assert list(step["commit"]) == ["09aaaaaaaa"] and "+64.00 MiB" in step["what"].iloc[0]
    assert "regression" in _texts(at.markdown)
    # The commit opens its run.
    from urllib.parse import parse_qsl

    run = _ok(app(**dict(parse_qsl(step["commit href"].iloc[0].lstrip("?")))))
    assert run.radio(key="page").value == "Run detail"
    assert "main commit 9" in _texts(run.markdown)


def test_history_scale_follows_the_data_and_a_far_budget_is_a_marker_at_the_edge(
    app, seeded: dict
) -> None:
    seeded["config"].write_text(
        CONFIG + '\n[[budgets]]\nworkload = "decoder"\nmetric = '
        '"host"\nlimit = "1 GiB"\nreason = "the host has room"\n'
    )
    at = _ok(app(page="History", case=D8, h_views="host"))
    at.button_group(key="h_views").set_value(["host"]).run()
    (host, _) = _panels(_ok(at))
    low, high = _domain(host)
    assert 290 <= low and high <= 420  # main's few MiB of noise and a PR's 400 MiB: not 1 GiB
    (edge,) = _drawn(host, "budget")
    assert "edge" in edge.get("class") and int(edge.get("data-bytes")) == 2**30
    assert "budget 1.00 GiB ↑ above the scale: the highest point is 39% of it" in "".join(
        host.itertext()
    )
    at.segmented_control(key="h_scale").set_value("budget").run()
    host = _panels(_ok(at))[0]
    assert "(GiB)" in "".join(host.itertext()) and _domain(host)[1] >= 1  # 1 GiB in scale
    assert "edge" not in _drawn(host, "budget")[0].get("class")
    at.segmented_control(key="h_scale").set_value("zero").run()
    assert _domain(_panels(_ok(at))[0])[0] == 0


def _branching(tmp_path: Path) -> tuple[Path, Path]:
    """Main at 5 commits (committed at 09:00, run at 12:00, a day apart), and two pull
    requests from main's 3rd commit: a cosmetic one (the same figure) and one that grows
    the case by 10 MiB. Their runs share one x, the merge-base's time."""
    from dataclasses import replace

    def run(i: int, sha: str, branch: str, peak: int, committed: str, **kw: Any) -> Any:
        made = make_run(
            [make_measurement("decoder", {"batch": 1}, peak=peak)],
            commit=sha,
            branch=branch,
            subject=f"{branch} {i}",
            started_at=f"2026-02-{i:02d}T12:00:00+00:00",
            **kw,
        )
        return replace(made, git=replace(made.git, committed_at=committed))

    runs = [
        run(i, commit(i), "main", 100 * MiB, f"2026-02-{i:02d}T09:00:00+00:00") for i in range(1, 6)
    ]
    for sha, branch, peak in (("c" * 40, "feature/cosmetic", 100), ("d" * 40, "feature/grow", 110)):
        runs.append(
            run(6, sha, branch, peak * MiB, "2026-02-06T08:00:00+00:00", merge_base=commit(3))
        )
    db, config = tmp_path / "branches.db", tmp_path / "branches.toml"
    with Store.open(db) as store:
        for r in runs:
            store.write_run(r)
    config.write_text('base_branch = "main"\n')
    return db, config


def _x(mark: ET.Element) -> float:
    """Where a point is drawn: a circle's centre, a diamond's top vertex."""
    if mark.get("cx") is not None:
        return float(mark.get("cx") or 0)
    return float(re.match(r"M([\d.]+),", mark.get("d") or "").group(1))  # type: ignore[union-attr]


def test_history_draws_each_branch_apart_at_its_merge_base_with_a_legend(app, tmp_path) -> None:
    """Main, a cosmetic branch and a regressing one at one merge-base: each branch its own
    colour and lane beside main's point there, named in a legend, on the memory and the
    time panels alike; the status line says where the axis places the run (its commit's
    time) and when it ran; the Views chips have a row of their own."""
    db, config = _branching(tmp_path)
    at = _ok(app(db=db, config=config, page="History", case=D1))
    allocated, *_, time = _panels(at)
    assert time.get("data-metric") == "time"
    colors = {}
    for panel in (allocated, time):
        others = {e.get("data-branch"): e for e in _drawn(panel, "other")}
        assert set(others) == {"feature/cosmetic", "feature/grow"}
        drawn = {b: e.get("stroke") for b, e in others.items()}
        assert len(set(drawn.values())) == 2 and "#555" not in drawn.values()
        colors = colors or drawn
        assert drawn == colors  # one colour per branch on every panel
        (merge_base,) = [
            e
            for e in _drawn(panel, "point")
            if "other" not in (e.get("class") or "") and commit(3)[:10] in "".join(e.itertext())
        ]
        xs = sorted(_x(e) for e in others.values())
        assert _x(merge_base) < xs[0] < xs[1] < _x(merge_base) + 30, (_x(merge_base), xs)
        legend = {g.get("data-branch"): g for g in _drawn(panel, "branches")}
        assert list(legend) == ["main", "feature/grow", "feature/cosmetic"]  # newest first
        for branch, color in colors.items():
            assert "".join(legend[branch].itertext()) == branch
            assert [e.get("stroke") for e in legend[branch] if e.tag.endswith("path")] == [color]
    grow = next(e for e in _drawn(allocated, "other") if e.get("data-branch") == "feature/grow")
    assert int(grow.get("data-bytes")) == 110 * MiB
    status = _plain(next(str(e.value) for e in at.markdown if "latest run on main" in e.value))
    assert (
        f"latest run on main: {commit(5)[:10]}, on the time axis at 2026-02-05 09:00 UTC, "
        "its commit's time; run 2026-02-05 12:00" in status
    ), status
    assert "each at its commit's time" in _texts(at.caption)
    assert "runs of any date" in _texts(at.caption)
    # the Views chips in no column: the page's whole width, so that no label is cut
    assert "column" not in _blocks_around(at.main, "h_views")
    assert "column" in _blocks_around(at.main, "h_scale")  # where the narrow controls are


def _blocks_around(node: Any, key: str, path: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The types of the blocks that hold the widget `key`, outermost first; () where none
    of the page's widgets has that key."""
    children = getattr(node, "children", None)
    for child in children.values() if isinstance(children, dict) else ():
        if getattr(child, "key", None) == key:
            return (*path, "")
        found = _blocks_around(child, key, (*path, child.type))
        if found:
            return found
    return ()


def test_history_marks_each_kind_with_its_own_shape_and_a_readable_legend(app) -> None:
    allocated = _panels(_ok(app(page="History", case=D8)))[0]
    shapes = {m.get("data-kind"): m.tag.split("}")[-1] for m in _drawn(allocated, "mark")}
    assert shapes == {"regression": "path", "over_budget": "rect"}
    legend = {g.get("data-kind"): "".join(g.itertext()) for g in _drawn(allocated, "legend")}
    assert legend == {"over_budget": "over budget", "regression": "regression"}
    failed = [
        m
        for m in _drawn(_panels(_ok(app(page="History", case=VISION)))[0], "mark")
        if m.get("data-kind") == "failed"
    ]
    assert failed and all(m.get("stroke") == "#7f1d1d" for m in failed)  # a cross, dark red


def test_a_blocking_run_says_so_first_with_labels_that_tell_cases_apart(app, seeded) -> None:
    at = _ok(app(page="Run detail", run=seeded["big"].run_id))
    (banner,) = [e.value for e in at.error]
    assert _plain(banner).startswith("**This run blocks**: 1 blocking verdict")
    assert "decoder · allocated +0 B" not in _plain(banner)
    assert "over budget" in _plain(banner)
    at = _ok(app(page="Run detail", run=seeded["runs"][-1].run_id))
    cases = _table(at, 2)
    assert list(cases["case"]) == [D1, D8, "training", "vision"]
    assert list(cases["case id"]) == [D1, D8, TRAIN, VISION]


def test_the_overview_lists_pull_requests_with_their_verdict_one_click_from_their_run(
    app, seeded
) -> None:
    at = _ok(app())
    prs = _table(at, "ov_prs")
    assert list(prs["branch"]) == ["feature/long-context", "feature/slim"]
    assert list(prs["verdict"]) == ["BLOCKS (1)", "not checked"]
    assert prs["what blocks"][0] == "decoder allocated 400.00 MiB over its 350.00 MiB budget"
    assert prs["compare"][0] == "with its merge-base"
    assert prs["compare href"][0] == f"?page=Compare&b={seeded['big'].run_id}"  # its own one
    from urllib.parse import parse_qsl

    # its run, one click away: the link opens the run, which says it blocks and why
    at = _ok(app(**dict(parse_qsl(prs["run href"][0].lstrip("?")))))
    assert at.radio(key="page").value == "Run detail"
    assert _plain(at.error[0].value).startswith("**This run blocks**")


def test_history_keeps_pull_request_runs_off_the_base_line(app) -> None:
    first = _panels(_ok(app(page="History", case=D8)))[0]
    assert _drawn(first, "line") and _drawn(first, "other")  # PR runs: points only
    line = {int(p.get("data-bytes")) for p in _drawn(first, "base") if p.tag.endswith("circle")}
    assert 400 * MiB not in line  # the pull request's 400 MiB is not on the main line
    assert [int(p.get("data-bytes")) for p in _drawn(first, "other")] == [400 * MiB]


def test_history_marks_and_lists_failures(app) -> None:
    at = _ok(app(page="History", case=VISION))
    failed = _table(at)
    failed = failed[failed["event"] == "failed"]
    assert list(failed["commit"]) == ["14aaaaaaaa", "11aaaaaaaa"]
    assert "CUDA out of memory" in failed["what"].iloc[0]
    marks = _drawn(_panels(at)[0], "mark")
    assert "failed" in {m.get("data-kind") for m in marks}


def test_history_filters_change_the_points(app) -> None:
    at = _ok(app(page="History", case=D1))
    at.button_group(key="h_all").set_value("all").run()
    assert len(_table(at, -1)) == MAIN + 1  # main, and the feature branch
    at.multiselect(key="h_branches").set_value(["main"]).run()
    assert set(_table(_ok(at), -1)["branch"]) == {"main"}
    at.multiselect(key="h_envs").set_value([GPU_ENV.fingerprint]).run()
    assert len(_table(_ok(at), -1)) == MAIN - 2
    at.date_input(key="h_range").set_value((date(2026, 1, 4), date(2026, 1, 5))).run()
    assert list(_table(_ok(at), -1)["commit"]) == ["05aaaaaaaa", "04aaaaaaaa"]


def test_rows_recorded_before_the_host_metrics_have_no_host_figure(app, seeded: dict) -> None:
    with Store.open(seeded["db"]) as store:  # as m003 leaves older rows
        store.conn.execute(
            "update measurements set host_bytes = null, host_step_bytes = null "
            "where run_id in (select run_id from runs where started_at < "
            "'2026-01-08')"
        )
    at = _ok(app(page="History", case=D8))
    at.button_group(key="h_all").set_value("all").run()
    points = _table(at, -1).set_index("commit")
    assert points.loc["05aaaaaaaa", "host RSS"] == "-"
    assert points.loc["09aaaaaaaa", "host RSS"] == "301.00 MiB"
    at.button_group(key="h_views").set_value(["host"]).run()
    panels = _panels(_ok(at))
    assert [p.get("data-metric") for p in panels] == ["host", "time"]
    assert "host peak RSS" in "".join(panels[0].itertext())


@pytest.mark.parametrize(("asked", "shown"), [(D8, D8), ("vision", VISION), ("training", TRAIN)])
def test_a_link_names_a_case_by_its_id_label_or_workload(app, asked: str, shown: str) -> None:
    at = _ok(app(page="history", case=asked))  # the page's name in any case
    assert at.radio(key="page").value == "History"
    assert at.selectbox(key="case").value == shown


def test_an_ambiguous_or_unknown_case_lists_candidates_instead_of_another_case(app) -> None:
    at = _ok(app(page="History", case="decoder"))
    assert "could be decoder\\[batch=1\\], decoder\\[batch=8\\]" in _texts(at.warning)
    assert not at.get("vega_lite_chart")
    at = _ok(app(page="History", case="nothing[x=1]"))
    assert "No single case matches" in _texts(at.warning) and not at.get("vega_lite_chart")


def test_regressions_lists_every_step_with_its_verdict_and_fix(app) -> None:
    at = _ok(app(page="Regressions"))
    table = _table(at)
    assert list(table["commit"]) == ["12aaaaaaaa", "09aaaaaaaa", "06aaaaaaaa"]
    rows = table.set_index("commit")
    assert rows.loc["09aaaaaaaa", "case"] == D8 and rows.loc["09aaaaaaaa", "verdict"] == (
        "regression"
    )
    assert rows.loc["09aaaaaaaa", "fixed by"] == "not yet"
    assert rows.loc["09aaaaaaaa", "on forge"] == f"{REPO}/commit/{commit(9)}"
    assert rows.loc["09aaaaaaaa", "compare"] == f"{REPO}/compare/{commit(8)}...{commit(9)}"
    assert rows.loc["06aaaaaaaa", "fixed by"] == "10aaaaaaaa"
    assert rows.loc["06aaaaaaaa", "component"] == "caches +2.00 MiB"
    assert rows.loc["12aaaaaaaa", "verdict"] == "accepted: AdamW state in fp32, reviewed"
    assert "1 up and not fixed or accepted" in _texts(at.markdown)
    at.toggle(key="rg_up").set_value(False).run()
    assert "10aaaaaaaa" in list(_table(_ok(at))["commit"])  # the fix, a step down


def test_run_detail_shows_environment_breakdown_gap_and_errors(app, seeded: dict) -> None:
    newest_main = seeded["runs"][-1]
    at = _ok(app(page="Run detail", run=newest_main.run_id[:8]))
    assert "CUDA out of memory" in _texts(at.error)
    text = _texts(at.markdown) + _texts(at.code)
    assert "main commit 14" in text and '"batch": 8' in text
    frames = tables(at)
    facts = frames[1]  # after the commit's facts: the environment's
    assert "NVIDIA H200" in " ".join(facts["value"]) and "2.14.1+cu130" in " ".join(facts["value"])
    gap = next(f for f in frames if "gap (context, workspaces, non-torch)" in f.columns)
    row = gap.set_index("case").loc[D8]
    assert row["gap (context, workspaces, non-torch)"] == "500.00 MiB"  # device - reserved
    assert len(at.get("vega_lite_chart")) == 1  # breakdown
    at.button[0].click().run()  # the failed case's history
    assert at.radio(key="page").value == "History"
    assert at.selectbox(key="case").value == VISION


def test_run_detail_tells_cases_apart_and_draws_tensors_apart_from_the_runtime(
    app, seeded: dict
) -> None:
    """A real CPU run of the shipped suite: its breakdown names each case by the params that
    set it apart (sessions=1 and sessions=4, not two ids cut alike), draws the framework's
    peak on its own scale, and writes the runtime beyond it (host RSS beyond tensors: the
    interpreter and libraries, some 250 MiB) beside each bar instead of stacking it on."""
    from factories import read_reruns

    run = read_reruns()[0]
    with Store.open(seeded["db"]) as store:
        store.write_run(run)
    at = _ok(app(page="Run detail", run=run.run_id))
    (spec,) = _charts(at)
    bars, runtime = spec["layer"]
    shown = _chart_data(at)
    parts, beside = shown[bars["data"]["name"]], shown[runtime["data"]["name"]]
    one, four = (
        next(
            m.case_id
            for m in run.measurements
            if f"sessions={n}," in m.case_id and "decoder_" in m.case_id
        )
        for n in (1, 4)
    )
    labels = dict(zip(parts["case id"], parts["case"], strict=False))
    assert (labels[one], labels[four]) == (
        "decoder_generate[sessions=1]",
        "decoder_generate[sessions=4]",
    )
    assert len(set(labels.values())) == len(run.measurements)  # every case its own label
    assert bars["encoding"]["y"]["axis"]["labelLimit"] == 0  # drawn whole, never cut
    # The bars are the framework's peak, part by part; no workspace among them.
    assert "workspace / runtime" not in set(parts["part"])
    for m in run.measurements:
        assert parts[parts["case id"] == m.case_id]["bytes"].sum() == m.peak_allocated_bytes
    # On the tensors' scale: the longest bar spans more than half the axis, so weights and
    # caches are bars, not slivers beside ~250 MiB of interpreter.
    largest = max(m.peak_allocated_bytes for m in run.measurements) / MiB
    assert bars["encoding"]["x"]["scale"]["domain"][1] <= 2 * largest
    # The runtime beyond the tensors is a figure beside each bar, its own.
    row = beside.set_index("case id").loc[one]
    m1 = next(m for m in run.measurements if m.case_id == one)
    assert m1.workspace_bytes and m1.workspace_bytes > 20 * m1.weights_bytes
    from memtrack.units import format_size

    assert row["runtime"] == f"+ {format_size(m1.workspace_bytes)} runtime: host RSS beyond tensors"
    assert "not the model's memory" in _texts(at.caption)


def test_run_detail_of_an_unknown_run_says_so(app) -> None:
    at = _ok(app(page="Run detail", run="deadbeef"))
    assert "No run or commit starts with “deadbeef”" in _texts(at.warning)


def test_compare_two_commits_with_budget_verdict_and_headroom(app) -> None:
    at = _ok(app(page="Compare", a="08aaaa", b="09aaaa"))
    table = _table(at)
    row = table[(table["case id"] == D8) & (table["view"] == "allocated")].iloc[0]
    assert (row["A"], row["B"], row["delta"]) == ("256.00 MiB", "320.00 MiB", "+64.00 MiB")
    assert row["delta %"] == pytest.approx(25.0) and row["beyond"]
    assert (row["budget"], row["verdict"]) == ("350.00 MiB (91%)", "regression")
    host = table[(table["case id"] == D8) & (table["view"] == "host RSS")].iloc[0]
    assert host["delta"] == "-1.00 MiB" and not host["beyond"]  # within the host floor
    assert "the largest: decoder\\[batch=8\\]" in _texts(at.markdown)
    everything = len(table)
    at.toggle(key="cmp_only_changes").set_value(True).run()
    changed = _table(_ok(at))
    assert 0 < len(changed) < everything and changed["beyond"].all()
    assert "host RSS" not in set(changed["view"])


def test_compare_flags_a_pull_request_over_its_budget(app, seeded: dict) -> None:
    table = _table(_ok(app(page="Compare", b=seeded["big"].run_id[:12])))
    row = table[(table["case id"] == D8) & (table["view"] == "allocated")].iloc[0]
    assert row["A"] == "320.00 MiB"  # A defaults to the newest base run before B
    assert row["budget"] == "350.00 MiB (114%) OVER" and row["verdict"] == "over_budget"


def test_compare_with_only_b_picks_an_older_a(app) -> None:
    at = _ok(app(page="Compare", b="05aaaa"))
    assert "**A** 04aaaaaaaa" in _texts(at.markdown).replace("\\", "")


def test_compare_across_environments_warns(app) -> None:
    at = _ok(app(page="Compare", a="01aaaa", b="05aaaa"))
    assert "not like for like" in _texts(at.warning)
    assert "GPUs none → NVIDIA H200 (141.00 GiB)" in _texts(at.warning)


@pytest.mark.parametrize(
    "page", ["Overview", "History", "Regressions", "Run detail", "Compare", "Plan"]
)
def test_every_page_renders_with_its_defaults(app, page: str) -> None:
    at = _ok(app(page=page))
    assert at.title[0].value == page
    assert at.radio(key="page").value == page


def test_an_unknown_page_says_which_pages_there_are(app) -> None:
    at = _ok(app(page="[x](http://evil.example)"))
    assert at.title[0].value == "Overview"
    assert "There is no page \\[x\\](http:\u2060//evil.example)" in _texts(at.warning)


def test_the_database_is_never_written(app, seeded: dict) -> None:
    db = seeded["db"]
    before = hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns
    for page in ("Overview", "History", "Regressions", "Run detail", "Compare"):
        _ok(app(page=page))
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns) == before
    assert not Path(str(db) + "-wal").exists() or Path(str(db) + "-wal").stat().st_size == 0


# -- recorded and URL-supplied text is never Markdown ------------------------------------

HOSTILE = "![x](http://evil.example/p.png) [click](https://evil.example) **loud** :red[x]"


def _shown_text(at: AppTest) -> str:
    parts = [
        at.markdown,
        at.error,
        at.warning,
        at.info,
        at.success,
        at.caption,
        at.title,
        at.subheader,
        at.expander,
    ]
    return "\n".join(
        str(getattr(e, "value", None) or getattr(e, "label", "")) for group in parts for e in group
    )


def test_recorded_text_and_link_parameters_are_escaped(app, seeded: dict) -> None:
    hostile_run = make_run(
        [
            make_measurement(
                "vision", {"res": 512}, peak=90 * MiB, status="error", message=HOSTILE
            ),
            *_suite(MAIN + 1, True)[:1],
        ],
        commit=commit(MAIN + 1),
        branch="main",
        subject=HOSTILE,
        started_at="2026-01-16T12:00:00+00:00",
        env=GPU_ENV,
    )
    with Store.open(seeded["db"]) as store:
        store.write_run(hostile_run)
    pages = [dict(page=p, case=VISION) for p in ("Overview", "History", "Regressions")]
    pages += [
        dict(page="Run detail", run=hostile_run.run_id),
        dict(page="Run detail", run=HOSTILE),
        dict(page="Compare", a=HOSTILE, b=hostile_run.run_id),
    ]
    seen = 0
    for query in pages:
        shown = _shown_text(_ok(app(**query)))
        assert "](" not in shown.replace("\\](", "") and "![" not in shown, query
        assert "**loud**" not in shown and ":red[" not in shown, query
        assert "://evil" not in shown, query  # nothing a reader would auto-link
        seen += "evil.example" in shown
    assert seen >= 3  # the text is shown, escaped: on the run, the callout, the warnings


EVIL = (
    "![x](https://evil.example/md.png) [docs](https://evil.example/phish) "
    "<https://evil.example> www.evil.example"
)
"""Recorded text that a Markdown reader would turn into a remote image (fetched as the page
loads: the reader's address goes to whoever recorded it) and remote links: an image, a
link, an autolink and a bare `www.` address."""
EVIL_RUN_URL = "https://evil.example/o/r/actions/runs/5"


def write_hostile_runs(db: Path) -> tuple[str, str]:
    """Two runs whose every recorded text is EVIL, written through the store: one on main
    (a step of decoder[batch=8], judged over budget, a failed case accepted) with its CI run
    recorded on another host than the forge, and one on a branch named by it. Neither
    measured a device view, so their notes say why. Returns their run ids."""
    from dataclasses import replace

    def cases(suffix: str) -> list:
        return [
            make_measurement(
                "decoder",
                {"batch": 8},
                peak=330 * MiB,
                notes=(EVIL,),
                device_view_note=EVIL + suffix,
            ),
            make_measurement(
                "vision",
                {"res": 512, "note": EVIL},
                status="error",
                message=EVIL,
                notes=(EVIL,),
                device_view_note=EVIL,
            ),
        ]

    ci = CIInfo(provider="github-actions", event="push", run_url=EVIL_RUN_URL, runner_name=EVIL)
    on_main = make_run(
        cases(" (main)"),
        commit=commit(MAIN + 1),
        branch="main",
        subject=EVIL,
        started_at="2026-01-16T12:00:00+00:00",
        env=replace(GPU_ENV, notes=(EVIL,)),
        ci=ci,
    )
    on_main = replace(on_main, git=replace(on_main.git, notes=(EVIL,)))
    branch = make_run(
        cases(" (branch)"),
        commit="d" * 40,
        branch=EVIL,
        subject=EVIL,
        started_at="2026-01-16T13:00:00+00:00",
        env=GPU_ENV,
        merge_base=commit(MAIN),
        ci=ci,
    )
    vision = cases("")[1].case_id
    with Store.open(db) as store:
        for run in (on_main, branch):
            store.write_run(run)
            fields = dict(baseline_value=320 * MiB, threshold=322 * MiB, candidate_value=330 * MiB)
            _verdict(
                store,
                run.run_id,
                D8,
                "over_budget",
                "base" if run is on_main else "pull_request",
                **fields,
                delta=10 * MiB,
                budget_bytes=300 * MiB,
                budget_reason=EVIL,
                component=EVIL,
                component_delta=MiB,
                message=EVIL,
            )
            _verdict(
                store, run.run_id, vision, "accepted", "base", accepted_reason=EVIL, message=EVIL
            )
    return on_main.run_id, branch.run_id


def remote_addresses(markdown: str) -> list[str]:
    """Every address outside the dashboard that a Markdown reader would link to or fetch
    for `markdown`: links, images and autolinks (CommonMark), raw HTML's href and src, and
    the bare `https://` and `www.` addresses that GitHub's and Streamlit's readers link."""
    from markdown_it import MarkdownIt

    found: list[str] = []

    def walk(tokens: list) -> None:
        for t in tokens:
            if t.type == "link_open":
                found.append(str(t.attrGet("href")))
            elif t.type == "image":
                found.append(str(t.attrGet("src")))
            elif t.type in ("html_block", "html_inline"):
                found.extend(re.findall(r"""(?:href|src)\s*=\s*["']?([^"'\s>]+)""", t.content))
            elif t.type == "text":
                found.extend(re.findall(r"(?:https?://|www\.)[^\s<>]*", t.content, re.I))
            walk(t.children or [])

    walk(MarkdownIt("commonmark").enable("table").parse(markdown))
    return [a for a in found if not a.startswith(("?page=", "#"))]


def _markdown_of(at: AppTest) -> list[str]:
    """What the page gives Streamlit's Markdown reader: bodies of text, callouts, captions
    and headings, the labels and help of widgets and expanders (code and grids aside: they
    are shown as text)."""
    out = []
    for block in (at.main, at.sidebar):
        for el in block:
            if el.type in ("code", "arrow_data_frame", "vega_lite_chart"):
                continue
            proto = getattr(el, "proto", None)
            for value in (
                getattr(proto, "body", None),
                getattr(proto, "help", None),
                getattr(el, "label", None),
            ):
                if isinstance(value, str) and value:
                    out.append(value)
    return out


def test_recorded_text_never_links_or_fetches_off_the_dashboard(app, seeded: dict) -> None:
    """A note, a device view's note, a param, a subject, a branch, a message, a verdict's
    message, a budget's or an acceptance's reason holding a Markdown image, a link, an
    autolink or a bare address: every page shows it as text, with no image to fetch and
    no link that leaves the dashboard."""
    on_main, branch = write_hostile_runs(seeded["db"])
    pages = [
        dict(page="Run detail", run=on_main),
        dict(page="Run detail", run=branch),
        dict(page="Overview"),
        dict(page="Overview", ov_branch=EVIL),
        dict(page="Regressions"),
        dict(page="History", case=D8),
        dict(page="Compare", b=on_main),
        dict(page="Compare", b=branch),
    ]
    for query in pages:
        at = _ok(app(**query))
        shown = _markdown_of(at)
        assert [(a, md) for md in shown for a in remote_addresses(md)] == [], query
    # shown, as text: the device view's note of each run, on its Run detail
    for run, which in ((on_main, "main"), (branch, "branch")):
        caption = _texts(_ok(app(page="Run detail", run=run)).caption)
        assert f"evil.example ({which})" in caption.replace("\u2060", ""), caption


def _forge_links(at: AppTest) -> list[str]:
    """The Regressions table's links to the forge: each row's commit and compare."""
    rows = _table(at)
    return [x for col in ("on forge", "compare") for x in rows[col] if x]


def test_forge_links_go_to_the_configured_forge_never_a_recorded_host(app, seeded: dict) -> None:
    """A run recorded its CI run on another host (https://evil.example/o/r/...): the
    commit and compare links of the Regressions page still go to the forge the config
    names (GitHub's by default), to the repository its runs there named, and a run's own
    step is linked there too."""
    write_hostile_runs(seeded["db"])
    at = _ok(app(page="Regressions"))
    links = _forge_links(at)
    assert links and all(x.startswith(f"{REPO}/") for x in links), links
    rows = _table(at)
    step = rows[rows["commit"] == commit(MAIN + 1)[:10]]
    assert list(step["on forge"]) == [f"{REPO}/commit/{commit(MAIN + 1)}"]


def test_a_forge_in_the_config_is_the_only_host_linked(app, seeded: dict, tmp_path: Path) -> None:
    """With `forge_url` in the config, runs recorded there link to it, under its path;
    runs recorded on GitHub (a host the config does not name) link nowhere."""
    forge = "https://git.example.org/code"
    there = seed_store(tmp_path / "forge", repo=f"{forge}/acme/model")
    there["config"].write_text(f'forge_url = "{forge}/"\n' + CONFIG)
    links = _forge_links(_ok(app(db=there["db"], config=there["config"], page="Regressions")))
    assert f"{forge}/acme/model/commit/{commit(9)}" in links
    assert all(x.startswith(f"{forge}/acme/model/") for x in links), links
    # the seeded history recorded its CI runs on github.com
    assert _forge_links(_ok(app(config=there["config"], page="Regressions"))) == []


# -- empty and foreign databases ------------------------------------------------------


def test_a_missing_database_explains_how_to_record_a_first_run(app, tmp_path: Path) -> None:
    db = tmp_path / "nothing-yet.db"
    at = _ok(app(db=db))
    info = _texts(at.info)
    assert "No runs recorded yet" in info and f"memtrack run --db {db}" in info
    assert not db.exists()


def test_an_empty_store_explains_how_to_record_a_first_run(app, tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    Store.open(db).close()
    at = _ok(app(db=db))
    assert "has no runs" in _texts(at.info) and "memtrack run --db" in _texts(at.info)


def test_an_older_schema_without_verdicts_is_shown(app, seeded: dict) -> None:
    with Store.open(seeded["db"]) as store:
        store.conn.execute("drop table verdicts")
        store.conn.execute("delete from _sqlite_migrations where name != 'm001_initial'")
    for page in ("Overview", "History", "Regressions", "Run detail", "Compare"):
        at = _ok(app(page=page, case=D8))
        assert at.title[0].value == page  # not refused
    assert "No verdicts recorded yet" in _texts(at.sidebar.caption)
    table = _table(_ok(app()))
    assert table.set_index("case id").loc[D8, "status"] == "near budget"  # no verdicts now


def test_an_unknown_schema_version_is_refused_clearly(app, seeded: dict) -> None:
    with Store.open(seeded["db"]) as store:
        store.conn.execute(
            "insert into _sqlite_migrations (migration_set, name, applied_at) "
            "values ('memtrack', 'm999_from_the_future', '2030-01-01')"
        )
    at = _ok(app())
    message = _plain(_texts(at.error))
    assert "cannot be shown" in message and "m999_from_the_future" in message
    assert "upgrade memtrack" in message


@pytest.mark.parametrize("damage", ["header", "pages"])
def test_a_corrupt_database_is_one_line_not_a_traceback(app, seeded: dict, damage: str) -> None:
    db = seeded["db"]
    raw = bytearray(db.read_bytes())
    if damage == "header":
        raw[:16] = b"not a database!!"
    else:  # every page after the schema's: the tables' rows are garbage
        for i in range(4096 * 2, len(raw)):
            raw[i] = (i * 31) % 251
    db.write_bytes(bytes(raw))
    at = _ok(app())
    errors = [_plain(e.value) for e in at.error]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "cannot be" in errors[0] and "memtrack.db" in errors[0]


# -- the command -----------------------------------------------------------------------


def test_cli_without_streamlit_says_how_to_install_it(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "streamlit"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'streamlit'\")\n")
    env = {**os.environ, "PYTHONPATH": str(shim.parent)}
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "dashboard", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'memtrack[dashboard]'" in out.stderr
    assert "Traceback" not in out.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"streamlit did not become healthy in {timeout_s:.0f} s:\n{log.read_text()}")


def test_cli_serves_the_dashboard(seeded: dict, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "STREAMLIT_SERVER_HEADLESS": "true"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memtrack.cli",
                "dashboard",
                "--db",
                str(seeded["db"]),
                "--config",
                str(seeded["config"]),
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        proc.terminate()  # the command became the server: this stops it
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert f"memtrack dashboard on {url}" in log.read_text()


def test_cli_finds_the_app() -> None:
    from memtrack.commands.dashboard import app_path, streamlit_problem

    assert app_path() == APP
    assert streamlit_problem() is None


# -- what the dashboard decides -----------------------------------------------------------


def _series(values: list[int]) -> list[dict]:
    """Rows newest first, as queries.series returns them."""
    return [{"peak_allocated_bytes": v, "run_id": str(i)} for i, v in enumerate(values)][::-1]


def test_a_step_is_found_at_the_first_run_of_the_new_level() -> None:
    old, new = [100 * MiB] * 6, [110 * MiB] * 4
    found = model.steps(_series(old + new), "allocated")
    assert [(s.row["run_id"], s.delta) for s in found] == [("6", 10 * MiB)]


def test_noise_is_no_step_and_a_run_far_beyond_it_is_a_change_and_its_revert() -> None:
    rng = random.Random(1)
    noisy = [int(500 * MiB + rng.gauss(0, 2 * MiB)) for _ in range(30)]
    assert model.steps(_series(noisy), "allocated") == []
    noisy[15] += 4 * MiB  # within the noise's reach: an outlier of the level
    assert model.steps(_series(noisy), "allocated") == []
    noisy[15] += 36 * MiB  # 20 sigma: merged, and reverted by the next run
    up, down = sorted(model.steps(_series(noisy), "allocated"), key=lambda s: s.row["run_id"])
    assert up.after - up.before > 30 * MiB and down.after < down.before
    assert up.fixed_by is not None and up.fixed_by["run_id"] == "16"


def test_the_most_specific_budget_applies() -> None:
    from memtrack.config import Budget

    row = {
        "workload": "decoder",
        "case_id": D8,
        "device": "cuda",
        "peak_allocated_bytes": 1,
        "device_peak_bytes": 2,
    }
    budgets = [
        Budget("decoder", 5 * MiB, "all decoders", metric="allocated"),
        Budget(D8, 4 * MiB, "this case", metric="allocated"),
        Budget("decoder", 3 * MiB, "on an H200", gpu="nvidia h200"),
        Budget("decoder", 1 * MiB, "another GPU", gpu="NVIDIA A10"),
    ]
    found = {b.metric: b.reason for b in model.budgets_for(budgets, row, ["NVIDIA H200"])}
    assert found == {"allocated": "this case", "device": "on an H200"}
    on_cpu = {**row, "device": "cpu", "device_peak_bytes": None}
    budgets.append(Budget("decoder", 2 * MiB, "CPU runners", gpu="cpu"))
    found = {b.metric: b.reason for b in model.budgets_for(budgets, on_cpu, [])}
    assert found == {"allocated": "this case"}  # the CPU budget's default view: allocated
    other_case = {**on_cpu, "case_id": D1}
    found = {b.metric: b.reason for b in model.budgets_for(budgets, other_case, [])}
    assert found == {"allocated": "CPU runners"}


def test_case_ids_are_shortened_to_what_tells_them_apart() -> None:
    long = "decoder[d_model=128,dtype=float32,layers=2,sessions={}]"
    labels = model.short_case_labels(
        [long.format(1), long.format(4), "train[batch=32]", "x[a=1]", "x[a=1,b=2]"]
    )
    assert labels == {
        long.format(1): "decoder[sessions=1]",
        long.format(4): "decoder[sessions=4]",
        "train[batch=32]": "train",
        "x[a=1]": "x[a=1]",
        "x[a=1,b=2]": "x[a=1,b=2]",  # both would read 'x': kept whole
    }


def test_history_filters_come_from_the_link(app) -> None:
    at = _ok(app(page="History", case=D1, h_branches="main", h_limit="10"))
    at.button_group(key="h_all").set_value("all").run()
    points = _table(_ok(at), -1)
    assert set(points["branch"]) == {"main"} and len(points) == 10


# -- Plan -----------------------------------------------------------------------------


def _seed_sweeps(tmp_path: Path) -> Path:
    """serve swept over concurrency at two commits (the older with other figures), then a
    newer commit that measured one value only; and a workload never swept."""
    db = tmp_path / "plan.db"

    def serve(c: int, peak_mib: float) -> Any:
        return make_measurement(
            "serve", {"concurrency": c, "max_len": 256}, peak=int(peak_mib * MiB)
        )

    with Store.open(db) as store:
        store.write_run(
            make_run(
                [serve(1, 10), serve(2, 20)],
                commit=commit(1),
                started_at="2026-01-01T12:00:00+00:00",
            )
        )
        store.write_run(
            make_run(
                [serve(1, 5), serve(2, 7), serve(4, 11)],
                commit=commit(2),
                started_at="2026-01-02T12:00:00+00:00",
                subject="sweep",
            )
        )
        store.write_run(
            make_run(
                [serve(4, 12), make_measurement("solo", {"n": 1})],
                commit=commit(3),
                started_at="2026-01-03T12:00:00+00:00",
            )
        )
    return db


def test_plan_plots_the_newest_sweep_its_fit_and_the_gpus(app, tmp_path: Path) -> None:
    db = _seed_sweeps(tmp_path)
    at = _ok(app(db=db, page="Plan", plan_workload="serve", plan_param="concurrency"))
    assert at.title[0].value == "Plan"
    assert at.selectbox(key="plan_workload").options == ["serve"]  # solo varies nothing
    (spec,) = _charts(at)
    curve, points, rules, labels = spec["layer"]
    # The newest commit with 2+ values: commit 2's three points, not commit 3's one.
    assert [(p["x"], p["gib"]) for p in points["data"]["values"]] == [
        (1, 5 / 1024),
        (2, 7 / 1024),
        (4, 11 / 1024),
    ]
    assert "02aaaaaaaa" in _plain(_texts(at.markdown))
    # peak = 3 MiB + 2 MiB x, exactly: the curve passes through every point
    assert all(abs(v["gib"] - (3 + 2 * v["x"]) / 1024) < 1e-9 for v in curve["data"]["values"])
    assert len(rules["data"]["values"]) == 9 and rules["mark"]["type"] == "rule"
    h200 = next(r for r in rules["data"]["values"] if r["gpu"] == "NVIDIA H200")
    assert h200["gib"] == 141e9 / 2**30
    # GPUs of equal memory: one label at that height, naming them all (none drawn over another)
    heights = [v["gib"] for v in labels["data"]["values"]]
    assert len(heights) == len(set(heights)) < len(rules["data"]["values"])
    assert "NVIDIA A100 80GB · NVIDIA H100 80GB" in [v["gpu"] for v in labels["data"]["values"]]
    table = _table(at)
    assert list(table["GPU"])[0] == "NVIDIA T4"
    # 1.1 x (3 MiB + 2 MiB x) <= 16e9 B -> x <= 6,934.06 by the line: far past the 4 x 4
    # that three measured values carry (memtrack.plan.fit.carried_to), so not given
    t4 = table.iloc[0]
    assert t4["largest concurrency"] == "> 16: not carried" and t4["first not fitting"] == "-"
    warned = _plain(_texts(at.warning))
    assert (
        "9 of 9 GPUs hold more than concurrency=16, and no figure is given: the fit "
        "cannot carry this: measured up to concurrency=4; measure at larger values with "
        "`memtrack plan`"
    ) in warned
    assert max(v["x"] for v in curve["data"]["values"]) == pytest.approx(16)  # drawn so far


def test_plan_keeps_its_choices_in_the_url_and_says_when_nothing_was_swept(
    app, tmp_path: Path
) -> None:
    db = _seed_sweeps(tmp_path)
    at = _ok(app(db=db, page="Plan", plan_gpus="NVIDIA T4"))
    assert at.multiselect(key="plan_gpus").value == ["NVIDIA T4"]
    (spec,) = _charts(at)
    assert [r["gpu"] for r in spec["layer"][2]["data"]["values"]] == ["NVIDIA T4"]
    # The main history: decoder at batch 1 and 8 in each run; the newest commit on main
    # measured on the GPU, so the device view is what must fit (peak + 520 MiB).
    at = _ok(app(page="Plan"))
    assert at.selectbox(key="plan_workload").value == "decoder"
    assert at.selectbox(key="plan_param").value == "batch"
    (spec,) = _charts(at)
    assert [(p["x"], p["gib"]) for p in spec["layer"][1]["data"]["values"]] == [
        (1, 700 / 1024),
        (8, 840 / 1024),
    ]
    assert "device view" in _plain(_texts(at.markdown))
    solo = tmp_path / "solo.db"
    with Store.open(solo) as store:
        store.write_run(make_run([make_measurement("solo", {"n": 1})]))
    at = _ok(app(db=solo, page="Plan"))
    assert "No workload has recorded two or more values" in _texts(at.info)
    assert not _charts(at)


def test_plan_answers_within_what_the_fit_carries_and_says_how_far_past_the_measured(
    app, tmp_path: Path
) -> None:
    """A GPU small enough to be crossed within 4x the largest value measured gets its
    answer, with how far past the measured values it lies; the rule is the library's, so
    the table says what `memtrack plan` says."""
    from memtrack.plan.fit import Gpu, Headroom, answer, plan

    catalog = tmp_path / "data" / "gpus.toml"
    catalog.parent.mkdir()
    catalog.write_text('[[gpu]]\nname = "small"\nmemory = "24 MiB"\n')
    config = tmp_path / "memtrack.toml"
    config.write_text('base_branch = "main"\n')
    at = _ok(app(db=_seed_sweeps(tmp_path), config=config, page="Plan"))
    row = _table(at).iloc[0]
    # 1.1 x (3 MiB + 2 MiB x) <= 24 MiB -> x <= 9.41: 9, 2.2x the largest measured (4)
    assert row["largest concurrency"] == "9 (2.2x past the largest measured value)"
    assert row["first not fitting"] == "10"
    same = plan(
        [(1, 5 * MiB), (2, 7 * MiB), (4, 11 * MiB)],
        [Gpu("small", 24 * MiB, "24 MiB")],
        Headroom(0.10, "config", "plan_headroom = 10%"),
        case="serve",
        param="concurrency",
        metric="allocated",
        metric_note="",
        integer=True,
        params={},
    )
    assert answer(same.gpus[0]) == row["largest concurrency"]  # as `memtrack plan` says


def _branch_sweeps(tmp_path: Path) -> Path:
    """serve swept on main, then (newer) on a pull request's branch with other figures."""
    db = _seed_sweeps(tmp_path)
    with Store.open(db) as store:
        store.write_run(
            make_run(
                [
                    make_measurement("serve", {"concurrency": c, "max_len": 256}, peak=p * MiB)
                    for c, p in ((1, 50), (2, 90))
                ],
                commit="f" * 40,
                branch="feature/bigger",
                subject="a bigger model",
                started_at="2026-01-04T12:00:00+00:00",
            )
        )
    return db


def test_plan_takes_the_base_branchs_sweep_unless_another_branch_is_chosen(
    app, tmp_path: Path
) -> None:
    db = _branch_sweeps(tmp_path)
    at = _ok(app(db=db, page="Plan"))
    assert at.selectbox(key="plan_branch").value == "main"
    (spec,) = _charts(at)
    # main's newest sweep (commit 2), not the newer pull request's
    assert [p["x"] for p in spec["layer"][1]["data"]["values"]] == [1, 2, 4]
    assert "02aaaaaaaa on main" in _plain(_texts(at.markdown))
    at = _ok(app(db=db, page="Plan", plan_branch="feature/bigger"))
    (spec,) = _charts(at)
    assert [(p["x"], p["gib"]) for p in spec["layer"][1]["data"]["values"]] == [
        (1, 50 / 1024),
        (2, 90 / 1024),
    ]
    assert "ffffffffff on feature/bigger" in _plain(_texts(at.markdown))


def test_a_plan_address_naming_a_workload_without_a_sweep_says_so_instead_of_another(
    app, tmp_path: Path
) -> None:
    db = _seed_sweeps(tmp_path)
    at = _ok(app(db=db, page="Plan", plan_workload="decoder_serve", plan_param="concurrency"))
    warned = _plain(_texts(at.warning))
    assert "There is no workload decoder_serve in this database" in warned
    assert "The workloads with a sweep to plan from: serve." in warned
    assert not _charts(at) and not tables(at)  # no other workload's plan
    at = _ok(app(db=db, page="Plan", plan_workload="solo"))
    warned = _plain(_texts(at.warning))
    assert "solo has not recorded two or more values of a numeric param" in warned
    assert "`memtrack plan solo --sweep n=1,2,4,8`" in warned and not _charts(at)
    at.selectbox(key="plan_pick").set_value("serve").run()
    assert _charts(_ok(at)) and at.selectbox(key="plan_workload").value == "serve"


def test_a_drawn_table_shows_recorded_text_as_text_and_links_only_within_the_dashboard() -> None:
    """The Overview's and History's tables are HTML made on the server: a recorded name that
    holds markup, a Markdown link or an address reads as itself, and the one link of a cell
    opens the dashboard's own page for exactly that name, however it is spelt."""
    from urllib.parse import parse_qsl

    from apptables import read_html_table
    from memtrack.dashboard.tables import Column, html_table, page_url

    name = '<script>alert(1)</script> [x](https://e.example) a&b="c" #1 | www.e.example'
    markup = html_table(
        "t",
        [{"case": name, "history": page_url("History", case=name), "trend": [1.0, 2.5]}],
        [Column("case", link="history"), Column("trend", spark=True)],
    )
    assert "<script" not in markup and "](" not in markup
    row = read_html_table(markup).iloc[0]
    assert row["case"].replace("\u2060", "") == name
    href = row["case href"]
    assert href.startswith("?page=History&case=") and "&" not in href.split("case=", 1)[1]
    assert dict(parse_qsl(href.lstrip("?"))) == {"page": "History", "case": name}
    assert row["trend"] == [1.0, 2.5]
