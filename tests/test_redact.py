"""Secrets a workload's failure quotes are redacted before they are stored or reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo, make_measurement, make_run

from memtrack.cli import main
from memtrack.records import write_json
from memtrack.records.redact import MASK, redact, secret_values
from memtrack.store.database import Store

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


# -- more shapes, the runner's own secrets, and ingested records --------------------------

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7Mhgw\n"
    "-----END RSA PRIVATE KEY-----"
)
JWT = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJhY3Rpb25zIn0.U2lnbmF0dXJlSGVyZQ"
SLACK = "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
GITLAB = "glpat-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURE = (
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={AZURE_KEY};"
    "EndpointSuffix=core.windows.net"
)


@pytest.mark.parametrize(
    "text, secret",
    [
        (f"ssl: cannot load {PEM} (bad passphrase)", PEM.split("-----\n", 1)[1]),
        (f"load_key({PEM!r}) failed", PEM.split("-----\n", 1)[1].replace("\n", "\\n")),
        (f"id token {JWT} expired", JWT),
        (f"slack post failed: {SLACK}", SLACK),
        (f"maps 403 for key={GOOGLE}&q=x", GOOGLE),
        (f"git clone https://oauth2:{GITLAB}@gitlab.example/x.git", GITLAB),
        (f"blob upload failed: {AZURE}", AZURE_KEY),
    ],
)
def test_more_token_shapes_are_redacted(text, secret):
    out = redact(text, values=())
    assert secret not in out and MASK in out


def test_a_value_of_a_secret_variable_is_redacted_whatever_its_shape():
    env = {
        "AWS_SECRET_ACCESS_KEY": "q7Vf2LmP9xR4tY8wZ1nB6cD3hJ5kS0aE2gU7iO9e",
        "MYAPP_SECRET": "s3kr1t-v4lue",
        "DEPLOY_KEY_ENV": "production",
        "GIT_AUTHOR_EMAIL": "dev@example.com",
        "HOME": "/home/runner/work",
        # a name that is surely a secret's: its value, whatever it looks like
        "DB_PASSWORD": "correcthorsebatterystaple",
        "VAULT_PASSPHRASE": "correct horse battery",
        "TOKENIZERS_PARALLELISM": "false",
    }
    values = secret_values(env)
    assert {"q7Vf2LmP9xR4tY8wZ1nB6cD3hJ5kS0aE2gU7iO9e", "s3kr1t-v4lue"} <= set(values)
    assert {"correcthorsebatterystaple", "correct horse battery"} <= set(values)
    assert not {"production", "dev@example.com", "/home/runner/work", "false"} & set(values)
    text = f"boto: {env['AWS_SECRET_ACCESS_KEY']} / {env['MYAPP_SECRET']} in production"
    assert redact(text, values=values) == f"boto: {MASK} / {MASK} in production"


LEAKS = textwrap.dedent(
    """
    import os
    import sys
    import memtrack

    @memtrack.workload
    def raises_the_key(ctx):
        def step():
            raise RuntimeError(os.environ["AWS_SECRET_ACCESS_KEY"])
        return step

    @memtrack.workload
    def prints_then_aborts(ctx):
        def step():
            print("config:", os.environ["MYAPP_SECRET"], file=sys.stderr, flush=True)
            os.abort()
        return step
    """
)


def test_the_runners_own_secrets_reach_no_record_database_or_report(tmp_path):
    """A secret without a known prefix (an AWS secret key, an application's own secret),
    printed by a workload, and a token inside an allowlisted variable: none is stored,
    written to the JSON record or posted in the verdict."""
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(LEAKS)
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 0\nrepeats = 1\n')
    commit_all(repo, "a suite whose failures quote secrets; token " + GITHUB)
    aws, mine = "q7Vf2LmP9xR4tY8wZ1nB6cD3hJ5kS0aE2gU7iO9e", "s3kr1t-v4lue-0f-myapp"
    env = {
        **os.environ,
        "AWS_SECRET_ACCESS_KEY": aws,
        "MYAPP_SECRET": mine,
        "CUBLAS_WORKSPACE_CONFIG": f":4096:8,{GITHUB}",
    }
    cli = [sys.executable, "-m", "memtrack.cli"]
    run = subprocess.run(
        [*cli, "run", "--json", "run.json"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    check = subprocess.run(
        [*cli, "check", "--markdown", "verdict.md"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr  # on the base branch: reported, not blocking
    record = json.loads((repo / "run.json").read_text())
    statuses = {m["workload"]: m["status"] for m in record["measurements"]}
    assert statuses == {"raises_the_key": "error", "prints_then_aborts": "crashed"}
    assert record["environment"]["env_vars"]["CUBLAS_WORKSPACE_CONFIG"] == f":4096:8,{MASK}"
    outputs = {
        "run.json": (repo / "run.json").read_text(),
        "verdict.md": (repo / "verdict.md").read_text(),
        "output": run.stdout + run.stderr + check.stdout + check.stderr,
    }
    for db_file in (repo / "data").glob("memtrack.db*"):
        outputs[db_file.name] = db_file.read_bytes().decode("latin-1")
    assert MASK in outputs["run.json"] and "config:" in outputs["run.json"]
    for secret in (aws, mine, GITHUB):
        for name, text in outputs.items():
            assert secret not in text, f"{secret[:6]}... reached {name}"


def test_ingest_redacts_what_run_would(tmp_path):
    """A record from elsewhere holding a token in its variables, its commit subject and its
    CI fields is stored without them, as `memtrack run` would have stored it."""
    run = make_run([make_measurement("decoder", {"batch": 1})], subject=f"fix auth ({GITHUB})")
    run = replace(
        run,
        environment=replace(
            run.environment,
            env_vars={
                "GITHUB_TOKEN": "a-custom-token-value-1234",
                "CUDA_MODULE_LOADING": f"LAZY {HF}",
            },
        ),
        ci=replace(run.ci, run_url="https://x:hunter2hunter2@ci.example/run/1"),
        git=replace(run.git, notes=(f"deployed with {SLACK}",)),
    )
    record = tmp_path / "run.json"
    write_json(run, record)
    db = tmp_path / "m.db"
    res = CliRunner().invoke(main, ["ingest", str(record), "--db", str(db)])
    assert res.exit_code == 0, res.output
    stored = db.read_bytes().decode("latin-1")
    with Store.open(db, readonly=True) as store:
        back = store.get_run(run.run_id)
    assert back.environment.env_vars == {
        "GITHUB_TOKEN": MASK,
        "CUDA_MODULE_LOADING": f"LAZY {MASK}",
    }
    assert back.git.subject == f"fix auth ({MASK})" and back.git.notes == (f"deployed with {MASK}",)
    for secret in (GITHUB, HF, "a-custom-token-value-1234", "hunter2hunter2", SLACK):
        assert secret not in stored
    # Ingesting the same file again finds the same (redacted) run: nothing changes.
    again = CliRunner().invoke(main, ["ingest", str(record), "--db", str(db)])
    assert again.exit_code == 0 and "1 already present" in again.output, again.output


@pytest.mark.parametrize(
    "name, value, quoted",
    [
        ("API_KEY", "k3y99z", "k3y99z"),  # short
        ("DbPassword", "Pa55word!", "Pa55word!"),  # the word in another case style
        ("db_passwd", "n0t-4-w0rd", "n0t-4-w0rd"),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET, "wJalrXUtnFEMI%2FK7MDENG%2FbPxRfiCYzEXAMPLEKEY"),
        ("MYAPP_SECRET", "s3kr1t&v4lue=1", "s3kr1t%26v4lue%3D1"),  # a query string
        ("MYAPP_SECRET", "s3kr1t-v4lue", "czNrcjF0LXY0bHVl"),  # base64
        ("SERVICE_AUTH", "s3kr1t-v4lue", "dXNlcjpzM2tyMXQtdjRsdWU="),  # base64 of user:value
    ],
)
def test_a_secret_variable_s_value_is_redacted_in_every_form_text_quotes_it(name, value, quoted):
    values = secret_values({name: value})
    out = redact(f"GET /api?key={quoted} failed (HTTP 401)", values=values)
    assert MASK in out
    # nothing of the value is left that says more than a few bits of it
    assert quoted not in out and value not in out


def test_an_error_that_quotes_a_secret_prints_it_redacted(tmp_path):
    """A record whose field holds a token, and a config's URL with a password: the one-line
    error quotes the value, and the secret goes out of it first (CI logs are public)."""
    record = tmp_path / "bad.json"
    write_json(make_run([make_measurement()]), record)
    data = json.loads(record.read_text())
    data["measurements"][0]["status"] = GITHUB
    record.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["ingest", str(record), "--db", str(tmp_path / "m.db")])
    assert res.exit_code == 2 and "is not one of" in res.output, res.output
    assert GITHUB not in res.output and MASK in res.output
    config = tmp_path / "memtrack.toml"
    config.write_text('dashboard_url = "ftp://admin:hunter2hunter@dash.example.org"\n')
    res = CliRunner().invoke(main, ["history", "x", "--config", str(config)])
    assert res.exit_code == 2 and "dashboard_url" in res.output, res.output
    assert "hunter2hunter" not in res.output
