"""The dashboard and the PR comment on a history a team has: 150 commits on main made of real
reruns of the shipped suite (real noise), with a +12 % allocated step at commit 90, a host
creep over 100-150, an OOM, a torch upgrade, and ten pull requests of which one grows a KV
cache by 2 MiB (tests/factories.realistic_history). Each main commit and each pull request
was checked as CI checks them, verdicts recorded."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from factories import (
    CREEP_FROM,
    GROW_PR,
    STEP_AT,
    history_commit,
    pr_commit,
    realistic_history,
)

from memtrack.store.database import Store

pytest.importorskip("streamlit")
from apptables import table as read_table  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

pytestmark = pytest.mark.slow  # 160 checks build the history, once for the module

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
TRAIN = "train_step[batch=32,d_model=128,dtype=float32,layers=2,seq_len=64]"
IMAGE = "image_classify[batch=8,dtype=float32,resolution=224,width=16]"
GROWN = (
    "decoder_generate[d_model=128,dtype=float32,heads=4,layers=2,max_len=256,"
    "new_tokens=16,sessions=4,vocab=1024]"
)
URL = "https://memtrack.example.org"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("history")
    db = work / "memtrack.db"
    out = realistic_history(db)
    # the repository's own config: the shipped budgets (host per case on the CPU far above it),
    # less those of gpt_generate, a shipped case newer than the reruns the history is made of
    head, *blocks = (ROOT / "pyproject.toml").read_text().split("[[tool.memtrack.budgets]]")
    kept = [b for b in blocks if 'workload = "gpt_generate"' not in b]
    config = work / "pyproject.toml"
    config.write_text("[[tool.memtrack.budgets]]".join([head, *kept]))
    return {**out, "db": db, "config": config, "work": work}


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, history: dict):
    def make(**query: str) -> AppTest:
        monkeypatch.setattr(
            sys, "argv", [str(APP), "--db", str(history["db"]), "--config", str(history["config"])]
        )
        at = AppTest.from_file(str(APP), default_timeout=120)
        for k, v in query.items():
            at.query_params[k] = v
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        return at

    return make


def _plain(text: str) -> str:
    return text.replace("\\", "")


def _texts(elements) -> str:
    return _plain("\n".join(str(e.value) for e in elements))


def test_the_overview_lists_the_old_step_and_nothing_false(app) -> None:
    at = app()
    table = read_table(at, "overview_table").set_index("case id")
    # The step is 60 runs old, beyond the 30-run trend: still open, on the view that moved.
    assert table.loc[TRAIN, "status"] == "regression"
    assert table.loc[TRAIN, "view"] == "allocated"
    others = table.drop(index=TRAIN)
    assert set(others["status"]) <= {"ok", "near budget"}, others["status"]
    warned = _texts(at.warning)
    assert f"since {history_commit(STEP_AT)[:10]} (main commit {STEP_AT}), " in warned
    assert "train_step · allocated +4.55 MiB (+12.0%)" in warned and "intermediates grew" in warned
    assert len(at.warning) == 1 and not at.error  # nothing else calls for attention
    # under the table, with each case's id, environment and notes
    noise = read_table(at, "overview_details").set_index("case id")["noise"].to_dict()
    serve = next(c for c in noise if c.startswith("decoder_serve"))
    # no case's headroom is widened by its noise past noisy_above: the step's host growth of
    # the concurrent case moves by a sigma of about 0.45 MiB, under its 2 MiB floor (its
    # allocated peak, set by how its sessions interleave, is judged against their sum)
    assert noise[serve] == "" and noise[TRAIN] == ""


def test_the_regressing_pull_request_is_one_click_from_the_overview(app, history) -> None:
    prs = read_table(app(), "ov_prs")
    assert prs["verdict"][0] == "BLOCKS (1)" and prs["branch"][0] == f"feature/pr-{GROW_PR}"
    assert prs["what blocks"][0] == "decoder_generate[sessions=4] allocated +2.00 MiB (regression)"
    assert set(prs["verdict"][1:]) <= {"passes", "passes, 1 warning", "passes, 2 warnings"}
    at = app(**dict(parse_qsl(prs["run href"][0].lstrip("?"))))  # its run, one click away
    assert at.radio(key="page").value == "Run detail"
    banner = _plain(at.error[0].value)
    assert banner.startswith("**This run blocks**: 1 blocking verdict")
    assert (
        "decoder_generate[sessions=4] · allocated +2.00 MiB (+17.1%): **regression**, "
        "caches grew" in banner
    )


def test_the_pr_comment_fits_one_screen_and_its_links_open_the_run_and_the_compare(
    app, history, monkeypatch
) -> None:
    from memtrack.judge.check import check
    from memtrack.report import check as report

    with Store.open(history["db"], readonly=True) as store:
        result = check(store, _config(history), run_id=history["grow"], root=history["work"])
    md = report.markdown(result, dashboard_url=URL)
    above = md.split("<details>", 1)[0]
    rows = [line for line in above.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 and len(md.encode()) < 4000  # the header and the one block
    assert len([line for line in above.splitlines() if line]) <= 10
    assert md.startswith(
        "### ❌ memtrack: blocked by `decoder_generate[sessions=4]` allocated "
        "+2.00 MiB (+17.1%), caches grew"
    )
    links = dict(
        re.findall(r"\[([a-z][^\]]*)\]\((https://memtrack\.example\.org/\?[^)]+)\)", above)
    )
    run = app(**dict(parse_qsl(urlsplit(links["run detail"]).query)))
    assert _plain(run.error[0].value).startswith("**This run blocks**")
    merge_base = history_commit(141 + GROW_PR)
    cmp = app(
        **dict(parse_qsl(urlsplit(links[f"compare with the merge-base {merge_base[:10]}"]).query))
    )
    table = cmp.dataframe[0].value
    grown = table[(table["case id"] == GROWN) & (table["view"] == "allocated")].iloc[0]
    assert grown["delta"].startswith("+2.") and grown["verdict"] == "regression"
    assert "**B** " + pr_commit(GROW_PR)[:10] in _texts(cmp.markdown)


def _config(history: dict):
    from memtrack.config import load_config

    return load_config(history["config"])


def _panels(at: AppTest) -> list[ET.Element]:
    return [ET.fromstring(e.value) for e in at.markdown if e.value.startswith("<svg")]


def _domain(panel: ET.Element) -> tuple[float, float]:
    found = re.search(r"values from (-?[\d.,]+) to (-?[\d.,]+)", panel.get("aria-label", ""))
    assert found
    return tuple(float(x.replace(",", "")) for x in found.groups())  # type: ignore[return-value]


def test_history_shows_the_creep_on_a_scale_that_follows_the_data(app, history) -> None:
    at = app(page="History", case=IMAGE)
    at.button_group(key="h_views").set_value(["host"]).run()
    (host, _) = _panels(at)
    low, high = _domain(host)
    assert high - low <= 20  # MiB: the creep fills the panel, the far budget does not
    budget = [e for e in host.iter() if "budget" in (e.get("class") or "")]
    (shipped,) = [
        b.limit_bytes
        for b in _config(history).budgets
        if (b.workload, b.metric) == ("image_classify", "host")
    ]
    assert [int(b.get("data-bytes")) for b in budget] == [shipped]
    assert "edge" in budget[0].get("class")
    line = [e for e in host.iter() if e.get("class") == "point base"]
    last = [int(e.get("data-bytes")) for e in line][-50:]
    assert max(last[-10:]) > min(last[:10])  # it grew over the last 50 commits
    at.segmented_control(key="h_zoom").set_value("30").run()
    (host, _) = _panels(at)
    points = [e for e in host.iter() if (e.get("class") or "").startswith("point")]
    assert len(points) == 30  # main's newest 20 and the ten pull requests' runs


def test_check_history_finds_the_step_and_the_creep_and_nothing_false(history) -> None:
    from memtrack.judge.gather.history import analyze_history

    with Store.open(history["db"], readonly=True) as store:
        h = analyze_history(store, _config(history), root=history["work"])
    steps = [(s.case_id, s.metric, s.commit) for s in h.steps]
    assert steps == [(TRAIN, "allocated", history_commit(STEP_AT))], steps
    flagged = [(c.case_id, c.metric, c.steps_between) for c in h.creeps if c.flagged]
    assert flagged == [(IMAGE, "host", 0)], flagged  # a slow creep, no single step
    assert history_commit(CREEP_FROM)[:4] == "0100"
