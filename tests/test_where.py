"""Where it grew: the sites at each case's peak (probes.sites), stored per measurement and
diffed against the baseline in every verdict that says a figure grew. A real repository, real
`memtrack run`s of a small decoder, `memtrack check` as CI runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from factories import GIT_ENV, commit_all, git, init_repo, make_measurement, make_run, memtrack_cli

from memtrack.judge.where import diff
from memtrack.store.database import Store

SERVE = """\
import torch
from torch import nn

import memtrack


class Decoder(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        return self.body(self.embed(ids))


def generate(model, ids):
    h = model(ids)
    logits = model.lm_head(h[:, -1:])  # only the last position's logits
    return logits.argmax(-1)


@memtrack.workload(params={"vocab": 8192, "d": 64})
def serve(ctx):
    torch.set_num_threads(1)
    model = Decoder(ctx["vocab"], ctx["d"]).eval()
    ctx.mark(model)
    prompt = ctx.randint(ctx["vocab"], 4, 128)

    @torch.no_grad()
    def step():
        return generate(model, prompt)

    return step
"""

FULL_LOGITS = SERVE.replace(
    "logits = model.lm_head(h[:, -1:])  # only the last position's logits",
    "logits = model.lm_head(h)[:, -1:]  # every position's logits, kept",
)
MOVED = '"""A decoder served greedily."""\n\n\n' + SERVE  # every line three lines down

CASE = "serve[d=64,vocab=8192]"
TOML = 'modules = ["{module}"]\nrepeats = 2\nmin_baseline_runs = 1\ntime_regression = "off"\n'
"""A suite of one module, judged on memory alone from one baseline run."""


def _memtrack(repo: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memtrack_cli(repo, *args, env={**GIT_ENV, "MEMTRACK_DB": str(db)})


def _run(repo: Path, db: Path) -> str:
    out = repo.parent / "run.json"
    done = _memtrack(repo, db, "run", "--json", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["run_id"]


def _check(repo: Path, db: Path) -> tuple[int, list[dict]]:
    out = repo.parent / "verdict.json"
    checked = _memtrack(repo, db, "check", "--json", str(out))
    assert checked.returncode in (0, 1), checked.stderr
    return checked.returncode, json.loads(out.read_text())["verdicts"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The decoder's repository: main recorded, then a branch off it that keeps every
    position's logits (`full-logits`, checked out), recorded. Its folder, and the two run ids."""
    root = tmp_path_factory.mktemp("where")
    repo, db = init_repo(root / "repo"), root / "db" / "memtrack.db"
    db.parent.mkdir()
    (repo / "serve.py").write_text(SERVE)
    (repo / "memtrack.toml").write_text(TOML.format(module="serve.py"))
    (repo / ".gitignore").write_text("data/\n")
    commit_all(repo, "a decoder")
    main_run = _run(repo, db)
    git(repo, "checkout", "-q", "-b", "full-logits")
    (repo / "serve.py").write_text(FULL_LOGITS)
    commit_all(repo, "keep every position's logits")
    return root, main_run, _run(repo, db)


@pytest.fixture
def decoder(recorded: tuple[Path, str, str], tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A copy of `recorded` of this test's own: its repository, database and two run ids."""
    root, main_run, pr_run = recorded
    shutil.copytree(root / "repo", tmp_path / "repo")
    shutil.copytree(root / "db", tmp_path / "db")
    return tmp_path / "repo", tmp_path / "db" / "memtrack.db", main_run, pr_run


@pytest.mark.slow
def test_a_pull_request_that_keeps_every_logit_is_blocked_where_it_grew(decoder):
    repo, db, main_run, pr_run = decoder
    code, verdicts = _check(repo, db)
    (allocated,) = [v for v in verdicts if v["metric"] == "allocated"]
    assert code == 1 and allocated["kind"] == "regression" and allocated["blocking"]
    # named by the output projection and the function that made it, with the file and line
    assert "where: +" in allocated["message"]
    assert "`lm_head` at serve.py:generate (line 20)" in allocated["message"]

    # the PR comment: one line under the table, the file linked at the pull request's commit
    comment = repo.parent / "comment.md"
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "check", "--markdown", str(comment)],
        cwd=repo,
        env={**os.environ, **GIT_ENV, "MEMTRACK_DB": str(db), "GITHUB_REPOSITORY": "acme/chat"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    sha = git(repo, "rev-parse", "HEAD").strip()
    (line,) = [x for x in comment.read_text().splitlines() if x.startswith("- 📍")]
    assert "`serve` allocated" in line and "`lm_head` at [serve.py:generate (line 20)]" in line
    assert f"(https://github.com/acme/chat/blob/{sha}/serve.py#L20)" in line
    # each verdict's where-line, nested under it, names the module in a code span too
    assert "  - +15.00 MiB at the peak: +16.00 MiB in `lm_head` at" in comment.read_text()
    assert "\\`" not in comment.read_text()  # never a backtick escaped into view

    with Store.open(db, readonly=True) as store:
        before, after = store.sites(main_run, CASE), store.sites(pr_run, CASE)
    grew = allocated["candidate_value"] - allocated["baseline_value"]
    (top, *_) = diff(before, after, "pair")
    assert top.key == "lm_head at serve.py:generate" and top.delta >= 0.9 * grew
    # 4 x 128 x 8192 float32 logits alive at the new peak (the last position's were not
    # alive at the old one)
    assert top.delta == 4 * 128 * 8192 * 4
    # the sites sum to the peak: by module, by source, and by both
    with Store.open(db, readonly=True) as store:
        (m,) = store.get_run(pr_run).measurements
    for grouping in ("module", "source", "pair"):
        assert sum(s.size_bytes for s in m.sites if s.grouping == grouping) == pytest.approx(
            m.peak_allocated_bytes, rel=0.01
        )

    # a pull request from main that only moves lines: every site still matches
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "-b", "moved")
    (repo / "serve.py").write_text(MOVED)
    commit_all(repo, "a docstring")
    moved_run = _run(repo, db)
    code, verdicts = _check(repo, db)
    assert code == 0
    assert not any("where:" in v["message"] for v in verdicts)
    with Store.open(db, readonly=True) as store:
        moved = store.sites(moved_run, CASE)
    assert {s.key for s in moved} == {s.key for s in before}
    lines = {s.key: s.line for s in before if s.grouping == "source" and s.line}
    assert lines  # the workload's own sites, with their lines
    assert {s.key: s.line for s in moved if s.key in lines} == {k: v + 3 for k, v in lines.items()}
    assert all(c.delta == 0 for c in diff(before, moved, "pair"))


def test_memtrack_diff_compares_two_runs_and_two_snapshot_files(tmp_path, decoder):
    repo, db, _, _ = decoder
    (tmp_path / "snaps").mkdir()  # outside the repository and the database's folder
    snap_a, snap_b = tmp_path / "snaps" / "a.json", tmp_path / "snaps" / "b.json"
    for branch, snap in (("main", snap_a), ("full-logits", snap_b)):
        git(repo, "checkout", "-q", branch)
        assert _memtrack(repo, db, "snapshot", "serve", "--out", str(snap)).returncode == 0

    # two runs, named by their branches
    shown = _memtrack(repo, db, "diff", "main", "full-logits")
    assert shown.returncode == 0, shown.stderr
    assert "lm_head at serve.py:generate" in shown.stdout and "+16.00 MiB" in shown.stdout
    as_json = json.loads(_memtrack(repo, db, "diff", "main", "full-logits", "--json").stdout)
    (case,) = as_json
    top = case["sites"][0]
    assert case["case"] == CASE and top["key"] == "lm_head at serve.py:generate"
    assert top["delta_bytes"] == 4 * 128 * 8192 * 4

    # two snapshot files of the same case
    by_module = json.loads(
        _memtrack(repo, db, "diff", str(snap_a), str(snap_b), "--by", "module", "--json").stdout
    )
    assert by_module[0]["sites"][0]["key"] == "lm_head"
    assert by_module[0]["sites"][0]["delta_bytes"] == 4 * 128 * 8192 * 4

    # main's newest run is one of the tests (pytest --memtrack), holding none of the cases:
    # each side is its newest run that holds them; a workload's name names its cases
    with Store.open(db) as store:
        store.write_run(
            make_run(
                [make_measurement("test_serve.py::test_it", {})],
                branch="main",
                started_at="2099-01-01T00:00:00+00:00",
            )
        )
    for args in ((), ("serve",)):
        again = _memtrack(repo, db, "diff", "main", "full-logits", *args, "--json")
        assert again.returncode == 0, again.stderr
        assert [c["case"] for c in json.loads(again.stdout)] == [CASE]
        assert json.loads(again.stdout)[0]["sites"][0]["delta_bytes"] == 4 * 128 * 8192 * 4

    # an unknown case, a file that is not a snapshot: one line each, exit 2
    wrong = _memtrack(repo, db, "diff", "main", "full-logits", "nope")
    assert wrong.returncode == 2 and "case 'nope' is not measured in both" in wrong.stderr
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    bad = _memtrack(repo, db, "diff", str(junk), str(snap_b))
    assert (
        bad.returncode == 2 and str(junk) in bad.stderr and "not a memtrack snapshot" in bad.stderr
    )


def _trace(*events: tuple[str, int, int, str]) -> list[dict]:
    return [
        {
            "action": action,
            "addr": addr,
            "size": size,
            "frames": [
                {
                    "filename": "/usr/lib/python3/site-packages/torch/nn/functional.py",
                    "name": "linear",
                    "line": 1,
                },
                {"filename": f"/work/app/{where}", "name": where.split(".")[0], "line": 7},
            ],
        }
        for action, addr, size, where in events
    ]


def test_a_cuda_snapshot_is_read_as_plain_data_and_diffed_by_source(tmp_path):
    # The allocator's history as torch writes it (a pickle of plain dicts and lists), made
    # here since this machine has no GPU: the sites at the largest total, by source file.
    import pickle

    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"

    def history(path, *events):  # one device's trace, no segments
        path.write_bytes(pickle.dumps({"segments": [], "device_traces": [_trace(*events)]}))

    history(
        a,
        ("alloc", 1, 100, "model.py"),
        ("alloc", 2, 50, "serve.py"),
        ("free_completed", 1, 100, "model.py"),
    )
    history(
        b,
        ("alloc", 1, 100, "model.py"),
        ("alloc", 2, 250, "serve.py"),
        ("free_completed", 2, 250, "serve.py"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "diff", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (case,) = json.loads(done.stdout)
    deltas = {s["key"]: s["delta_bytes"] for s in case["sites"]}
    assert deltas == {"serve.py:serve": 200, "model.py:model": 0}

    # a pickle that would make an object is refused before it makes one
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"device_traces": [], "x": Path("/")}))
    refused = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "diff", str(evil), str(b)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "evil.pickle: not a memtrack snapshot" in refused.stderr


def test_the_dashboard_shows_a_runs_sites_and_where_two_runs_differ(tmp_path, monkeypatch):
    """Run detail's site table and Compare's site diff, through Streamlit's AppTest, on a
    real store of two runs whose sites were recorded."""
    from dataclasses import replace

    from apptables import drawn, tables
    from factories import make_measurement, make_run
    from streamlit.testing.v1 import AppTest

    from memtrack.records import Site

    mib = 2**20
    before = (
        Site("pair", "lm_head at serve.py:generate", mib, 20),
        Site("pair", "body.0 at serve.py:forward", 3 * mib, 15),
    )
    after = (
        Site("pair", "lm_head at serve.py:generate", 17 * mib, 20),
        Site("pair", "body.0 at serve.py:forward", 3 * mib, 18),  # moved lines: still matched
    )
    db = tmp_path / "m.db"
    a = make_run([replace(make_measurement(peak=4 * mib), sites=before)], branch="main")
    b = make_run(
        [replace(make_measurement(peak=20 * mib), sites=after)],
        branch="pr",
        started_at="2026-01-01T00:05:00+00:00",
    )
    with Store.open(db) as store:
        store.write_run(a)
        store.write_run(b)
    app = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", str(db)])

    def page(**query: str) -> AppTest:
        return drawn(str(app), **query)

    def table(at: AppTest, column: str):
        return next(t for t in tables(at) if column in t.columns)

    sites = table(page(page="Run detail", run=b.run_id[:8]), "file:function")
    assert list(sites["module"]) == ["lm_head", "body.0"]
    assert list(sites["file:function"]) == ["serve.py:generate", "serve.py:forward"]
    assert list(sites["alive at the peak"]) == ["17.00 MiB", "3.00 MiB"]
    diff = table(page(page="Compare", a=a.run_id[:8], b=b.run_id[:8]), "change")
    assert list(diff["site"]) == ["lm_head at serve.py:generate"]  # the moved one matched
    assert list(diff["change"]) == ["+16.00 MiB"]


@pytest.mark.gpu
def test_on_a_gpu_the_sites_sum_to_the_allocators_peak_and_name_the_output_projection(tmp_path):
    repo, db = init_repo(tmp_path / "repo"), tmp_path / "memtrack.db"
    (repo / "serve.py").write_text(FULL_LOGITS.replace("torch.set_num_threads(1)", "pass"))
    (repo / "memtrack.toml").write_text('modules = ["serve.py"]\ndevice = "cuda"\nrepeats = 2\n')
    (repo / ".gitignore").write_text("data/\n")
    commit_all(repo, "a decoder on the GPU")
    run_id = _run(repo, db)
    with Store.open(db, readonly=True) as store:
        (m,) = store.get_run(run_id).measurements
    assert m.status == "ok" and m.device == "cuda", m.message
    for grouping in ("module", "source", "pair"):
        total = sum(s.size_bytes for s in m.sites if s.grouping == grouping)
        assert total == pytest.approx(m.peak_allocated_bytes, rel=0.01), grouping
    top = max((s for s in m.sites if s.grouping == "pair"), key=lambda s: s.size_bytes)
    assert top.key == "lm_head at serve.py:generate"


COMMAND = re.compile(r"^::(error|warning|notice) ([^:]*)::(.*)$")


def _unescape(text: str) -> str:
    return (
        text.replace("%0A", "\n")
        .replace("%0D", "\r")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
    )


def _commands(stdout: str) -> list[tuple[str, dict[str, str], str]]:
    """Every workflow command of `stdout`, parsed as GitHub parses one: its level, its
    properties (split at ',' and the first '='), its message."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("::"):
            found = COMMAND.match(line)
            assert found, line
            props = dict(p.split("=", 1) for p in found[2].split(",")) if found[2] else {}
            out.append((found[1], props, found[3]))
    return out


def test_check_annotates_a_blocking_growth_at_the_line_of_the_repository_that_grew(decoder):
    repo, db, _, _ = decoder
    done = _memtrack(repo, db, "check", "--annotations", "--no-record")
    assert done.returncode == 1, done.stderr
    errors = [c for c in _commands(done.stdout) if c[0] == "error"]
    (props, message) = next((p, m) for _, p, m in errors if " allocated " in _unescape(p["title"]))
    assert props["file"] == "serve.py"
    line = int(props["line"])
    assert line == 20 and line <= len((repo / "serve.py").read_text().splitlines())
    assert _unescape(props["title"]).startswith(f"memtrack: {CASE} allocated +")
    assert _unescape(message).startswith("BLOCK regression: allocated: baseline")
    # outside GitHub Actions, and without the flag, none
    plain = _memtrack(repo, db, "check", "--no-record")
    assert not _commands(plain.stdout)
    on_actions = memtrack_cli(
        repo,
        "check",
        "--no-record",
        env={**GIT_ENV, "MEMTRACK_DB": str(db), "GITHUB_ACTIONS": "true"},
    )
    assert _commands(on_actions.stdout) == _commands(done.stdout)


def test_annotations_escape_hostile_names_keep_to_the_repository_and_respect_the_limits(tmp_path):
    from memtrack.judge.check import CheckResult
    from memtrack.judge.verdict import Verdict
    from memtrack.judge.where import Change, Where
    from memtrack.report.annotations import PER_LEVEL, workflow_commands

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n" * 50)
    (tmp_path.parent / "outside.py").write_text("secret = 1\n" * 50)
    hostile = "evil::error file=x,line=1::forged%0A\n::warning::second, %25"

    def verdict(i: int, blocking: bool, key: str, line: int) -> Verdict:
        # frames from a record lead nowhere outside the repository, changed lines or not
        frames = ("../outside.py:3", "/etc/passwd:1", f"{hostile}:2")
        change = Change("pair", key, 0, (i + 1) * 2**20, line, frames=frames)
        return Verdict(
            case_id=f"{hostile}[{i}]",
            workload="evil",
            metric="allocated",
            kind="regression",
            blocking=blocking,
            baseline_value=0.0,
            candidate_value=float((i + 1) * 2**20),
            where=Where((i + 1) * 2**20, (change,), 0),
            around=f"numpy: 1\nby {i} MiB, 100%",  # recorded text, in the message
        )

    keys = [
        "lm at src/model.py:forward",  # a file of the repository, a line it has
        "lm at ../outside.py:forward",  # outside it
        "lm at /etc/passwd:read",  # absolute
        "lm at src/model.py:forward",
    ]
    verdicts = [verdict(i, True, keys[i % 4], 42 if i % 4 == 0 else 99) for i in range(14)]
    verdicts += [verdict(i, False, keys[0], 7) for i in range(12)]
    result = CheckResult(
        run_id="r" * 32,
        commit=None,
        branch="pr",
        started_at="2026-01-01T00:00:00+00:00",
        fingerprint="f",
        base_branch="main",
        merge_base=None,
        baseline_mode="merge-base",
        verdicts=tuple(verdicts),
        changed_lines={"../outside.py": (3,), "/etc/passwd": (1,), hostile: (2,)},
    )
    lines = workflow_commands(result, tmp_path)
    commands = _commands("\n".join(lines))
    assert len(commands) == len(lines)  # each command one line, nothing forged
    levels = [c[0] for c in commands]
    assert levels.count("error") == PER_LEVEL and levels.count("warning") == PER_LEVEL
    assert levels.count("notice") == 1 and "6 more verdicts" in commands[-1][2]
    errors = [c for c in commands if c[0] == "error"]
    # the largest growths first: 14 MiB, 13 MiB, ...
    assert _unescape(errors[0][1]["title"]) == f"memtrack: {hostile}[13] allocated +14.00 MiB"
    for _, props, message in commands[:-1]:
        assert set(props) <= {"file", "line", "title"}
        assert "\n" not in message and "::" not in message.replace("%3A", "")
        if "file" in props:
            assert props["file"] == "src/model.py"  # never outside the repository
            assert props.get("line") in (None, "42", "7")
        assert _unescape(props["title"]).startswith(f"memtrack: {hostile}[")
    # line 99 is past the file's end: the file, without a line
    assert any("file" in p and "line" not in p for _, p, _ in errors)


def _main_recorded(
    tmp_path: Path, files: dict[str, str], module: str = "infer.py"
) -> tuple[Path, Path]:
    """A repository of `files` on main, its suite `module`, committed and recorded: it and
    its database."""
    repo, db = init_repo(tmp_path / "repo"), tmp_path / "memtrack.db"
    toml = TOML.format(module=module)
    for name, text in {**files, "memtrack.toml": toml, ".gitignore": "__pycache__/\n"}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    commit_all(repo, "the base branch")
    _run(repo, db)
    return repo, db


def _pull_request(repo: Path, db: Path, branch: str, files: dict[str, str]) -> None:
    """A branch off main that changes `files`, committed and recorded."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    for name, text in files.items():
        (repo / name).write_text(text)
    commit_all(repo, branch)
    _run(repo, db)


MANY = """\
import torch
from torch import nn

import memtrack

GROW = {grow}


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        return x + 0, torch.ones(self.n)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        # 30 blocks keeping 40 KiB down to 11 KiB each: the smallest is 30th of its grouping
        sizes = [256 * (40 - i) + (GROW if i == 29 else 0) for i in range(30)]
        self.blocks = nn.ModuleList(Block(n) for n in sizes)

    def forward(self, x):
        kept = []
        for b in self.blocks:
            x, k = b(x)
            kept.append(k)
        return kept


@memtrack.workload
def many(ctx):
    net = Net()
    ctx.mark(net)
    x = ctx.randn(4)
    return lambda: net(x)
"""


@pytest.mark.slow
def test_a_small_site_that_grows_is_diffed_against_its_own_baseline_bytes(tmp_path):
    repo, db = _main_recorded(tmp_path, {"wl.py": MANY.format(grow=0)}, "wl.py")
    # the last block keeps 1 MiB more, the smallest
    _pull_request(repo, db, "grow", {"wl.py": MANY.format(grow=256 * 1024)})
    code, verdicts = _check(repo, db)
    (allocated,) = [v for v in verdicts if v["metric"] == "allocated"]
    assert code == 1 and allocated["kind"] == "regression", allocated["message"]
    # its baseline bytes (11 KiB, the 30th site) were kept: it grew by exactly 1 MiB
    assert "+1.00 MiB in `blocks.29` at wl.py:forward" in allocated["message"], allocated
    assert "(the rest)" not in allocated["message"]
    done = _memtrack(repo, db, "diff", "main", "grow", "--json")
    (case,) = json.loads(done.stdout)
    moved = [s for s in case["sites"] if s["delta_bytes"]]
    # only what changed: the grown block, never an unchanged block read as new
    assert {s["key"] for s in moved} <= {"blocks.29 at wl.py:forward"}, moved


SPREAD = MANY.replace(
    "        # 30 blocks keeping 40 KiB down to 11 KiB each: the smallest is 30th of its grouping\n"
    "        sizes = [256 * (40 - i) + (GROW if i == 29 else 0) for i in range(30)]\n",
    "        sizes = [{kept}] * 8  # eight blocks keeping as much each\n",
).replace("def many(ctx)", "def spread(ctx)")


def test_a_growth_spread_over_eight_layers_reads_as_one_group_of_eight(tmp_path):
    """Each of eight blocks keeps 1.25 MiB more: no three of them explain nine tenths of
    the growth, so the where-line names the eight as one, and adds up."""
    repo, db = _main_recorded(tmp_path, {"wl.py": SPREAD.format(kept=1024, grow=0)}, "wl.py")
    # each block keeps 1.25 MiB more
    _pull_request(repo, db, "grow", {"wl.py": SPREAD.format(kept=1024 + 327_680, grow=0)})
    code, verdicts = _check(repo, db)
    (allocated,) = [v for v in verdicts if v["metric"] == "allocated"]
    assert code == 1 and allocated["kind"] == "regression", allocated["message"]
    assert "+10.00 MiB in 8 x `blocks.*` at wl.py:forward" in allocated["message"], allocated
    assert "(1.25 MiB each)" in allocated["message"]
    (named,) = allocated["where"]["named"]
    assert named["count"] == 8
    assert named["after"] - named["before"] >= 0.9 * allocated["where"]["grew"]


def test_memory_made_in_backward_is_not_put_on_the_forward_s_line():
    from memtrack.judge.where import Change, pair_text

    grown = Change("pair", "(backward) at train.py:train_step", 0, 16 * 2**20, line=15)
    assert pair_text(grown) == "`(backward)` at train.py:train_step"
    forward = Change("pair", "fc at train.py:train_step", 0, 16 * 2**20, line=15)
    assert pair_text(forward) == "`fc` at train.py:train_step (line 15)"


def test_layers_that_grew_unlike_are_said_about_their_share():
    from memtrack.judge.where import each, where
    from memtrack.records import Site

    base = tuple(Site("pair", f"blocks.{i}.mlp at m.py:forward", 0) for i in range(4))
    grown = tuple(
        Site("pair", f"blocks.{i}.mlp at m.py:forward", n * 2**20)
        for i, n in enumerate((1, 3, 1, 3))
    )
    w = where(base, grown)
    (group,) = w.named
    assert group.count == 4 and each(group) == "about 2.00 MiB each"


CALLBACKS = """\
import torch

SEEN = []


def on_step_end(logits):
    SEEN.append(torch.ones(128 * 1024))  # 512 KiB kept by every call
    return logits
"""

TRAINS = """\
import torch

import memtrack
from callbacks import on_step_end


@memtrack.workload
def trains(ctx):
    w = torch.nn.Linear(64, 64)
    ctx.mark(w)
    x = ctx.randn(8, 64)
    return lambda: on_step_end(w(x))
"""


def test_a_leak_names_the_line_of_the_callback_that_keeps_what_it_leaks(tmp_path):
    """A callback in a file of its own keeps a tensor on every call: the leak verdict says
    where, by the file and line that made what one call kept, not `(held from setup)`."""
    repo, db = init_repo(tmp_path / "repo"), tmp_path / "memtrack.db"
    (repo / "callbacks.py").write_text(CALLBACKS)
    (repo / "wl.py").write_text(TRAINS)
    (repo / "memtrack.toml").write_text(
        'modules = ["wl.py"]\nrepeats = 3\nmin_baseline_runs = 1\ntime_regression = "off"\n'
    )
    (repo / ".gitignore").write_text("__pycache__/\n")
    commit_all(repo, "a callback that keeps every call's tensor")
    _run(repo, db)
    _, verdicts = _check(repo, db)
    (leak,) = [v for v in verdicts if v["kind"] == "leak"]
    assert "where: +512.00 KiB kept by one call: +512.00 KiB in " in leak["message"], leak
    assert "callbacks.py:on_step_end (line 7)" in leak["message"], leak["message"]
    assert "(setup)" not in leak["message"]


TINY = """\
import torch
from torch import nn

ROWS = 256


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.zeros(ROWS, 1024))
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        return self.proj(x)
"""

INFER_TINY = """\
import torch

import memtrack
from tiny.model import Tiny


@memtrack.workload
def infer(ctx):
    model = Tiny().eval()
    ctx.mark(model)
    x = ctx.randn(8, 64)
    return torch.no_grad()(lambda: model(x))
"""


def _annotated(repo: Path, db: Path) -> tuple[dict[str, str], str, str]:
    """The blocking allocated annotation of a check: its properties, message, and the
    terminal's text."""
    done = _memtrack(repo, db, "check", "--annotations", "--no-record")
    assert done.returncode == 1, done.stdout + done.stderr
    (props, message) = next(
        (p, _unescape(m))
        for level, p, m in _commands(done.stdout)
        if level == "error" and " allocated " in _unescape(p["title"])
    )
    return props, message, done.stdout


def test_a_buffer_grown_in_init_is_annotated_at_the_changed_line_else_where_it_was_made(
    tmp_path,
):
    """A buffer registered in a model's `__init__` doubles. Changed on its own line, the
    annotation is that line; changed through a constant on another line (not among the
    frames that made it), it is the line that made the buffer, and the message says so.
    Either way the where-line names the line that made it, not `(setup)`."""
    files = {"tiny/__init__.py": "", "tiny/model.py": TINY, "infer.py": INFER_TINY}
    repo, db = _main_recorded(tmp_path, files)
    twice = TINY.replace("(ROWS, 1024)", "(2 * ROWS, 1024)")
    _pull_request(repo, db, "on-its-line", {"tiny/model.py": twice})
    props, message, stdout = _annotated(repo, db)
    assert (props["file"], props["line"]) == ("tiny/model.py", "10"), props
    assert "on a line this pull request changed" in message, message
    assert "+1.00 MiB in `Tiny` made at tiny/model.py:10" in stdout, stdout
    assert "(setup)" not in message

    by_a_constant = TINY.replace("ROWS = 256", "ROWS = 512")
    _pull_request(repo, db, "by-a-constant", {"tiny/model.py": by_a_constant})
    props, message, _ = _annotated(repo, db)
    assert (props["file"], props["line"]) == ("tiny/model.py", "10"), props
    assert "where the memory was made: no line this pull request changed" in message, message


MADE_ELSEWHERE = """\
from torch import nn


def build(d):
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
"""

CALLS = """\
import torch

import memtrack
from made import build


@memtrack.workload
def infer(ctx):
    model = build(64).eval()
    ctx.mark(model)
    x = ctx.randn(512, 64)
    with torch.no_grad():
        return lambda: model(x)
"""


def test_a_growth_made_through_a_changed_line_in_another_file_is_annotated_there(tmp_path):
    """The model is built in made.py and called in infer.py: its activations are allocated
    at the call (infer.py, not in the diff). The pull request widens a layer on made.py's
    line 5, where the growing modules were made: the annotation is that line, not the call."""
    repo, db = _main_recorded(tmp_path, {"made.py": MADE_ELSEWHERE, "infer.py": CALLS})
    _pull_request(repo, db, "wider", {"made.py": MADE_ELSEWHERE.replace("4 * d", "16 * d")})
    props, message, stdout = _annotated(repo, db)
    assert (props["file"], props["line"]) == ("made.py", "5"), (props, stdout)
    assert "on a line this pull request changed" in message, message
    # where it grew still says where the memory was allocated: at the call
    assert "at infer.py:<lambda>" in message or "at infer.py:infer" in message, message


def test_the_changed_lines_are_those_the_candidate_adds_or_changes(tmp_path):
    """`git diff` from the merge-base: a changed line, an added file, a file with a space in
    its name; a deleted line marks nothing; a file outside the root is not the root's."""
    from memtrack.judge.gather.git import changed_lines

    repo = init_repo(tmp_path / "repo")
    (repo / "sub").mkdir()
    (repo / "sub" / "a.py").write_text("one\ntwo\nthree\nfour\n")
    (repo / "top.py").write_text("x\n")
    base = commit_all(repo, "base")
    (repo / "sub" / "a.py").write_text("one\nTWO\nthree\n")
    (repo / "sub" / "new file.py").write_text("1\n2\n")
    (repo / "top.py").write_text("y\n")
    head = commit_all(repo, "change")
    assert changed_lines(repo, base, head) == {
        "sub/a.py": (2,),
        "sub/new file.py": (1, 2),
        "top.py": (1,),
    }
    assert changed_lines(repo / "sub", base, head) == {"a.py": (2,), "new file.py": (1, 2)}
    assert changed_lines(repo, None, head) == changed_lines(repo, head, head) == {}
    assert changed_lines(repo, "0" * 40, head) == {}  # a merge-base git does not have


MODEL_FILE = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("table", torch.zeros(8))


def build():
    return Net()
"""


def test_where_a_weight_was_made_survives_a_cast_and_the_root_is_made_by_its_caller(tmp_path):
    """Noted while the model is built: a weight's line (its module's, for a layer torch
    made), kept after `.to()` swaps the tensor; the root module's frames are its caller's
    (build), not its own constructor's lines."""
    import importlib.util

    import torch

    from memtrack.probes.made import making

    (tmp_path / "netfile.py").write_text(MODEL_FILE)
    spec = importlib.util.spec_from_file_location("netfile", tmp_path / "netfile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with making(tmp_path) as made:
        net = mod.build()
    net = net.to(torch.float64)  # every tensor swapped under its name
    assert made.of_tensor(net.fc, "weight")[0] == "netfile.py:8"
    assert made.of_tensor(net, "table")[0] == "netfile.py:9"
    assert made.of_module(net)[0] == "netfile.py:13"  # `return Net()`, not its __init__
    assert made.of_module(net.fc)[0] == "netfile.py:8"
    with making(tmp_path) as later:
        pass
    assert later.of_tensor(net, "table") == ()  # registered before: unknown, not guessed
