"""The loading phase: `ctx.loading()` measured apart from the step, in a real worker on the
CPU, stored, shown, and judged against a budget on `load_host`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from factories import commit_all, git, init_repo, memtrack_cli

from memtrack.probes.host import HostPeak
from memtrack.probes.loading import LoadingProbe, files_bytes, io_counters
from memtrack.records import load_host, read_json
from memtrack.store.database import Store

WIDTH, LAYERS = 1024, 12  # the example's defaults
CHECKPOINT_TENSORS = LAYERS * (WIDTH * WIDTH + WIDTH) * 4  # float32 weights and biases


def _memtrack(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memtrack_cli(repo, *args)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """One real run of the shipped example that reloads its checkpoint."""
    repo = init_repo(tmp_path_factory.mktemp("repo"))
    (repo / "README.md").write_text("a project\n")
    commit_all(repo, "first commit")
    git(repo, "checkout", "-q", "-b", "faster-loader")  # a pull request's branch: check gates
    result = _memtrack(repo, "run", "-k", "load_checkpoint", "--json", "run.json")
    assert result.returncode == 0, result.stderr
    (m,) = read_json(repo / "run.json").measurements
    assert m.status == "ok", m.message
    return repo, m


def test_loading_sets_the_host_peak_because_the_checkpoint_is_held_twice(loaded):
    _, m = loaded
    # torch.load materialises the whole state dict beside the freshly built model before
    # load_state_dict copies it in; the step holds the model once, plus small activations.
    assert m.load_host_peak_rss_bytes > m.host_step_peak_rss_bytes
    assert m.load_host_peak_rss_bytes - m.host_step_peak_rss_bytes > CHECKPOINT_TENSORS // 2
    # resetting the mark at loading did not lose the case's peak: it still covers the case
    assert m.host_peak_rss_bytes >= m.load_host_peak_rss_bytes
    assert m.host_peak_source == "vmhwm"
    assert load_host(m) == m.load_host_peak_rss_bytes - m.load_file_rss_bytes


def test_loading_reads_the_checkpoint_and_counts_its_space(loaded):
    _, m = loaded
    assert m.load_rchar_bytes >= CHECKPOINT_TENSORS  # read by the process, cache or not
    assert m.load_read_bytes is not None and m.load_read_bytes >= 0  # from storage: 0 if cached
    assert m.disk_bytes >= CHECKPOINT_TENSORS
    assert m.disk_bytes < CHECKPOINT_TENSORS + 2**20  # the checkpoint, not the repository
    assert m.load_duration_s > 0
    assert m.load_write_bytes is not None and m.load_wchar_bytes is not None


def test_loading_figures_are_stored_and_shown(loaded):
    repo, m = loaded
    with Store.open(repo / "data" / "memtrack.db", readonly=True) as store:
        (stored,) = store.get_run(store.run_ids()[0]).measurements
        row = store.conn.execute("select load_host_bytes, disk_bytes from measurements").fetchone()
    assert stored == m
    assert tuple(row) == (load_host(m), m.disk_bytes)
    show = _memtrack(repo, "show", store_run_id(repo))
    assert show.returncode == 0, show.stderr
    assert "loading" in show.stdout and "files on disk" in show.stdout


def store_run_id(repo: Path) -> str:
    return read_json(repo / "run.json").run_id


def test_a_budget_on_load_host_below_the_figure_blocks_check(loaded, tmp_path):
    repo, m = loaded
    below = load_host(m) - 2**20
    for limit, code in ((below, 1), (load_host(m) + 2**30, 0)):
        cfg = tmp_path / f"memtrack-{limit}.toml"
        cfg.write_text(
            f'[[budgets]]\nworkload = "load_checkpoint"\nmetric = "load_host"\n'
            f'limit = "{limit} B"\nreason = "the loader must fit beside the server"\n'
        )
        result = _memtrack(
            repo,
            "check",
            "--config",
            str(cfg),
            "--db",
            str(repo / "data" / "memtrack.db"),
            "--run",
            store_run_id(repo),
            "--no-record",
        )
        assert result.returncode == code, result.stdout + result.stderr
        if code:
            assert "BLOCK over budget" in result.stdout and "load_host" in result.stdout


def test_files_bytes_counts_each_file_once_and_follows_links_to_files(tmp_path):
    (tmp_path / "ckpt").mkdir()
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"x" * 5000)
    (tmp_path / "ckpt" / "model.bin").symlink_to(blob)  # a model cache's snapshot link
    os.link(blob, tmp_path / "ckpt" / "same.bin")  # another name of the same file
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert files_bytes([tmp_path / "ckpt"]) == 5000 + 2
    assert files_bytes([tmp_path / "ckpt", blob]) == 5000 + 2
    assert files_bytes([tmp_path / "missing"]) == 0


def test_without_proc_io_the_loading_io_is_none_with_a_note(tmp_path):
    assert io_counters(str(tmp_path / "no-io")) is None
    assert set(io_counters()) >= {"rchar", "wchar", "read_bytes", "write_bytes"}
    probe = LoadingProbe(HostPeak(), io_path=str(tmp_path / "no-io"))
    assert probe.fields() == {}  # no loading marked: no figures at all
    (tmp_path / "f").write_bytes(b"y" * 100)
    with probe.phase((tmp_path,)):
        pass
    fields = probe.fields()
    assert fields["load_rchar_bytes"] is None and fields["load_read_bytes"] is None
    assert fields["disk_bytes"] == 100 and fields["load_duration_s"] >= 0
    assert any("/proc/self/io" in n for n in probe.notes)
