from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrack.cli import main
from memtrack.config import Config, load_config
from memtrack.errors import ConfigError
from memtrack.units import parse_duration, parse_size


def test_sizes_are_exact_about_binary_and_decimal_units():
    assert parse_size("12 GiB") == 12 * 2**30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5KiB") == 1536
    assert parse_size(4096) == 4096
    assert parse_duration("5 min") == 300.0
    assert parse_duration("500ms") == 0.5
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("12 gigs")


def test_pyproject_table_is_read_and_paths_resolved(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname='x'\n[tool.memtrack]\nmodules=['perf.wl']\ndatabase='db/m.db'\n"
        "repeats=5\ntimeout='90s'\n[tool.memtrack.workloads.big]\ntimeout='20 min'\nrepeats=2\n"
        "[[tool.memtrack.budgets]]\nworkload='big'\nlimit='2 GiB'\nreason='fits a 24 GiB card x8'\n"
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    cfg = load_config(cwd=sub)  # found from a subdirectory
    assert cfg.path == tmp_path / "pyproject.toml"
    assert cfg.database == tmp_path / "db" / "m.db"
    assert cfg.settings_for("big") == (1, 2, 1200.0)
    assert cfg.settings_for("other") == (1, 5, 90.0)
    assert cfg.budgets[0].limit_bytes == 2 * 2**30


@pytest.mark.parametrize(
    "body, message",
    [
        ("repeat = 3\n", r"unknown key memtrack.repeat \(did you mean 'repeats'\?\)"),
        ("timeout = 'soon'\n", r"memtrack.timeout: 'soon' is not a duration"),
        (
            "[[budgets]]\nworkload='w'\nlimit='12 gigs'\nreason='r'\n",
            r"memtrack.budgets\[0\].limit: '12 gigs' is not a size",
        ),
        (
            "[[budgets]]\nworkload='w'\nlimit='1 GiB'\n",
            r"memtrack.budgets\[0\].reason: is required",
        ),
        ("[workloads.w]\nwarmpu = 1\n", r"unknown key memtrack.workloads.w.warmpu"),
        ("device = 'tpu'\n", r"memtrack.device: 'tpu' is not one of auto, cpu, cuda"),
        ("repeats = 0\n", r"memtrack.repeats: must be at least 1"),
        ("modules = 'x'\n", r"memtrack.modules: expected list"),
        ("modules = [\n", r"not valid TOML"),
        # Values that pass a type check and break things later.
        ("headroom_factor = nan\n", r"memtrack.headroom_factor: must be a positive finite"),
        ("headroom_factor = inf\n", r"memtrack.headroom_factor: must be a positive finite"),
        ("timeout = nan\n", r"memtrack.timeout: a duration must be positive"),
        ("timeout = inf\n", r"memtrack.timeout: a duration must be positive and at most a"),
        ("[workloads.w]\ntimeout = -inf\n", r"memtrack.workloads.w.timeout: a duration must"),
        ("nvml_interval = nan\n", r"memtrack.nvml_interval: a duration must be positive"),
        ("creep_tolerance = nan\n", r"memtrack.creep_tolerance: expected a percentage"),
        ("creep_tolerance = 'inf%'\n", r"memtrack.creep_tolerance: expected a percentage"),
        ("creep_tolerance = '-2%'\n", r"memtrack.creep_tolerance: cannot be negative"),
        ("base_branch = ''\n", r"memtrack.base_branch: '' is not a branch name"),
        ("base_branch = '--output=x'\n", r"memtrack.base_branch: '--output=x' is not a branch"),
        ("creep_anchor = '--output=x'\n", r"memtrack.creep_anchor: expected a git revision"),
        ("database = ''\n", r"memtrack.database: expected a file path"),
        ("repeats = 100000000000\n", r"memtrack.repeats: must be at most 1,000,000"),
        ("max_cases = 0\n", r"memtrack.max_cases: must be at least 1"),
        # a paired timing of 4 rounds could never reach the sign test's threshold
        ("pair_rounds = 4\n", r"memtrack.pair_rounds: must be at least 5, got 4"),
        ("against = '--output=x'\n", r"memtrack.against: expected 'merge-base' or a git"),
        # The PR comment links to this address: only a plain http(s) one is taken.
        ("dashboard_url = 'javascript:alert(1)'\n", r"memtrack.dashboard_url: expected an http"),
        ("dashboard_url = 'https://u:p@dash.example'\n", r"memtrack.dashboard_url: expected"),
        ("dashboard_url = 'https://dash.example/?x=1'\n", r"memtrack.dashboard_url: expected"),
        ("dashboard_url = 'https://dash.example/a b'\n", r"memtrack.dashboard_url: expected"),
        ("dashboard_url = 'https://x)[y](https://evil'\n", r"memtrack.dashboard_url: expected"),
        ("dashboard_url = 'https://dash.example:99999/'\n", r"memtrack.dashboard_url: Port"),
        ("dashboard_url = 'dash.example'\n", r"memtrack.dashboard_url: expected an http"),
        # The dashboard links commits there: the same rule.
        ("forge_url = 'javascript:alert(1)'\n", r"memtrack.forge_url: expected an http"),
        ("forge_url = 'https://u:p@git.example'\n", r"memtrack.forge_url: expected"),
        ("forge_url = 'https://git.example/?x=1'\n", r"memtrack.forge_url: expected"),
        (
            f"[[budgets]]\nworkload='w'\nlimit='{'9' * 401}'\nreason='r'\n",
            r"memtrack.budgets\[0\].limit: '9999.* is more than the largest size, 2..62 bytes",
        ),
        (
            "[[budgets]]\nworkload='w'\nlimit='100000000 TiB'\nreason='r'\n",
            r"memtrack.budgets\[0\].limit: '100000000 TiB' is more than the largest size",
        ),
        (
            "[[budgets]]\nworkload='w'\nlimit=100000000000000000000000000000\nreason='r'\n",
            r"memtrack.budgets\[0\].limit: 1000.* is more than the largest size",
        ),
    ],
)
def test_bad_config_exits_2_naming_file_and_key(tmp_path, body, message):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_config(cfg)
    db = tmp_path / "m.db"
    result = CliRunner().invoke(main, ["run", "--config", str(cfg), "--db", str(db)])
    assert result.exit_code == 2
    assert str(cfg) in result.output
    assert len(result.output.strip().splitlines()) == 1  # one line, no traceback
    assert not db.exists()  # nothing written


def test_a_config_file_that_is_not_utf8_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_bytes(b"base_branch = 'caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"memtrack.toml: not UTF-8 text \(byte 18\)"):
        load_config(cfg)
    db = tmp_path / "m.db"
    result = CliRunner().invoke(main, ["run", "--config", str(cfg), "--db", str(db)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert not db.exists()


def test_revisions_and_finite_numbers_that_are_fine_are_kept(tmp_path):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text(
        "base_branch = 'release/2.1'\ncreep_anchor = 'main~10'\nheadroom_factor = 2.5\n"
        "creep_tolerance = '+2%'\nmax_cases = 5000\n"
        "[[budgets]]\nworkload='w'\nlimit='4194304 TiB'\nreason='the largest size there is'\n"
    )
    config = load_config(cfg)
    assert (config.base_branch, config.creep_anchor) == ("release/2.1", "main~10")
    assert (config.headroom_factor, config.creep_tolerance) == (2.5, 0.02)
    assert config.max_cases == 5000 and Config(path=None, root=tmp_path).max_cases == 1000
    assert config.forge_url == "https://github.com"  # GitHub's, where none is configured
    cfg.write_text("forge_url = 'https://git.example.org/code/'\n")
    assert load_config(cfg).forge_url == "https://git.example.org/code"


def test_missing_module_exits_2_and_writes_nothing(tmp_path):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text("modules = ['perf.not_there']\n")
    db = tmp_path / "m.db"
    result = CliRunner().invoke(main, ["run", "--config", str(cfg), "--db", str(db)])
    assert result.exit_code == 2
    assert "modules: cannot import 'perf.not_there'" in result.output
    assert not db.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        (
            '[[budgets]]\nworkload = "decoder_genrate"\nlimit = "1 GiB"\nreason = "r"\n',
            "budgets[0].workload: 'decoder_genrate' names no known workload or case; nearest: "
            "decoder_generate",
        ),
        (  # a budget on a test (a node id) is the pytest plugin's: run passes it over
            '[[budgets]]\nworkload = "tests/test_model.py::test_work"\nlimit = "1 GiB"\n'
            'reason = "r"\n\n'
            '[[budgets]]\nworkload = "decoder_genrate"\nlimit = "1 GiB"\nreason = "r"\n',
            "budgets[1].workload: 'decoder_genrate' names no known workload or case",
        ),
        (
            "[workloads.train_stp]\nrepeats = 2\n",
            "workloads.train_stp: no such workload (nearest: train_step)",
        ),
    ],
)
def test_settings_that_name_no_workload_are_refused_before_anything_runs(tmp_path, body, message):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text('modules = ["memtrack.examples"]\n' + body)
    db = tmp_path / "m.db"
    result = CliRunner().invoke(main, ["run", "--config", str(cfg), "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not db.exists()


def _toml(value):
    """A TOML literal for a value hypothesis drew."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


_KEYS = [
    "timeout",
    "nvml_interval",
    "headroom_factor",
    "creep_tolerance",
    "max_cases",
    "repeats",
    "base_branch",
    "creep_anchor",
    "database",
    "budgets",
]


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(_KEYS),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.integers(min_value=-(10**400), max_value=10**400),  # tomllib reads any int
        st.text(max_size=20),
        st.text(alphabet="0123456789.%-+ GiBMmsinf", max_size=12),
        st.booleans(),
    ),
)
def test_any_value_of_a_key_is_a_config_or_a_one_line_error(tmp_path_factory, key, value):
    cfg = tmp_path_factory.mktemp("cfg") / "memtrack.toml"
    if key == "budgets":
        cfg.write_text(f"[[budgets]]\nworkload = 'w'\nreason = 'r'\nlimit = {_toml(value)}\n")
    else:
        cfg.write_text(f"{key} = {_toml(value)}\n")
    try:
        config = load_config(cfg)
    except ConfigError as exc:
        assert str(exc).startswith(str(cfg)) and "\n" not in str(exc)
        return
    for number in (config.timeout_s, config.headroom_factor, config.creep_tolerance):
        assert math.isfinite(number) and number >= 0
    assert config.base_branch and not config.base_branch.startswith("-")
    assert all(0 <= b.limit_bytes <= 2**62 for b in config.budgets)


# -- files that are not config files ------------------------------------------------------


def _memtrack(*args: str, cwd=None):
    import subprocess
    import sys

    # A hang is the failure these guard against: the bound is far above any real start.
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_a_config_that_is_no_regular_file_is_refused_at_once(tmp_path, kind):
    """`--config /dev/zero` read forever, and a FIFO waited for a writer forever."""
    import os

    if kind == "device":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "memtrack.toml")
        os.mkfifo(path)
    else:
        path = str(tmp_path / "memtrack.toml")
        with open(path, "w") as f:
            f.write("# padding\n" * 500_000)  # 5 MB of comments
    res = _memtrack("run", "--config", path, "--db", str(tmp_path / "m.db"), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"memtrack: error: {path}") and "\n" not in line, line
    assert {
        "device": "not a regular file",
        "fifo": "not a regular file",
        "huge": "larger than 4.00 MiB",
    }[kind] in line
    assert not (tmp_path / "m.db").exists()


def test_ingest_and_the_gpu_catalog_refuse_a_device_too(tmp_path):
    res = _memtrack("ingest", "/dev/zero", "--db", str(tmp_path / "m.db"))
    assert res.returncode == 2 and "/dev/zero: not a regular file" in res.stderr, res.stderr
    assert not (tmp_path / "m.db").exists()
    from memtrack.plan.fit import load_catalog

    with pytest.raises(ConfigError, match="/dev/zero: not a regular file"):
        load_catalog(Path("/dev/zero"))


def test_deeply_nested_toml_is_an_error_naming_the_file(tmp_path):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text("a = " + "[" * 100_000 + "\n")
    res = _memtrack("run", "--config", str(cfg), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == f"memtrack: error: {cfg}: not valid TOML (nested too deeply)"
