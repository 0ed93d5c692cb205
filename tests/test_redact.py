"""Secrets a workload's failure quotes are redacted before they are stored or reported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from factories import commit_all, init_repo

from memtrack.records.redact import MASK, redact

# Shaped like real tokens, valid for nothing.
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
GITHUB_PAT = "github_pat_11AAAAAAA0" + "xYz_0123456789" * 4
HF = "hf_" + "QwErTyUiOp" * 4
AWS_ID = "AKIA" + "ABCDEFGHIJ234567"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
OPENAI = "sk-proj-" + "Ab3dEf6hIj9lMn2pQr5t" * 2
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    "text, secret",
    [
        (f"clone failed with token {GITHUB}", GITHUB),
        (f"GH_TOKEN={GITHUB_PAT} git push", GITHUB_PAT),
        (f"401 for https://huggingface.co/x: {HF}", HF),
        (f"aws configure set {AWS_ID}", AWS_ID),
        (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
        (f"OPENAI_API_KEY='{OPENAI}'", OPENAI),
        (f"headers={{'Authorization': 'Bearer {BEARER}'}}", BEARER),
        (f"curl -H 'authorization: token {BEARER}'", BEARER),
        (f"sent bearer {BEARER}", BEARER),
        ("connect(password=hunter2hunter2, host=db)", "hunter2hunter2"),
        ("GET https://bob:s3cretpassw0rd@example.com/data", "s3cretpassw0rd"),
    ],
)
def test_token_shapes_are_redacted_and_the_context_kept(text, secret):
    assert redact(text) == text.replace(secret, MASK)


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "ValueError: max_tokens=512 exceeds the context",
        "KeyError: 'token'",
        "shape mismatch: sk-1 vs hf_2",
    ],
)
def test_ordinary_error_text_is_left_alone(text):
    assert redact(text) == text


WORKLOADS = textwrap.dedent(
    f"""
    import sys
    import memtrack

    @memtrack.workload
    def leaks_in_exception(ctx):
        def step():
            raise RuntimeError("download failed: Authorization: Bearer {BEARER} ({HF})")
        return step

    @memtrack.workload
    def leaks_in_stderr(ctx):
        def step():
            print("push failed for {GITHUB}", file=sys.stderr, flush=True)
            import os
            os._exit(3)
        return step
    """
)


def test_a_token_in_a_failure_reaches_no_record_database_or_report(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(WORKLOADS)
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 0\nrepeats = 1\n')
    commit_all(repo, "a suite whose failures quote tokens")
    cli = [sys.executable, "-m", "memtrack.cli"]
    run = subprocess.run(
        [*cli, "run", "--json", "run.json"], cwd=repo, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    check = subprocess.run(
        [*cli, "check", "--markdown", "verdict.md"], cwd=repo, capture_output=True, text=True
    )
    assert check.returncode in (0, 1), check.stderr
    record = (repo / "run.json").read_text()
    assert "download failed" in record and "push failed" in record  # the messages are kept
    outputs = {
        "run.json": record,
        "verdict.md": (repo / "verdict.md").read_text(),
        "output": run.stdout + run.stderr + check.stdout + check.stderr,
    }
    for db_file in (repo / "data").glob("memtrack.db*"):
        outputs[db_file.name] = db_file.read_bytes().decode("latin-1")
    for secret in (BEARER, HF, GITHUB):
        for name, text in outputs.items():
            assert secret not in text, f"{secret[:6]}... reached {name}"
