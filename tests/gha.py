"""GitHub Actions, played locally: the part of the expression language that conditions use,
and a runner for a composite action's `run:` steps.

Enough of GitHub's semantics to run this repository's workflow conditions and its
composite action faithfully: `==` and `!=` (strings compared ignoring case; values of
different types compared as numbers, so null and '' are both 0), `&&` and `||` (which
return an operand, as GitHub's do), `!`, parentheses, literals, context paths and the status
functions. A step without a status function in its `if:` runs only while the job has not
failed; each step runs as `bash --noprofile --norc -eo pipefail` with its `env:` and a fresh
GITHUB_OUTPUT file, whose `key=value` lines become `steps.<id>.outputs`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

_TOKEN = re.compile(
    r"\s*(?:(?P<op>==|!=|&&|\|\||[!()<>,])|(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z_*][A-Za-z0-9_\-]*)*))"
)


def load_yaml(path: Path) -> Any:
    # YAML 1.2 (ruamel): the key `on` stays the string "on", not True as in YAML 1.1.
    return YAML(typ="safe", pure=True).load(path.read_text())


def truthy(v: Any) -> bool:
    return v not in (None, False, 0, 0.0, "")


def _status_functions(failed: bool) -> dict[str, bool]:
    return {"always": True, "success": not failed, "failure": failed, "cancelled": False}


def evaluate(expression: str, context: dict[str, Any], *, failed: bool = False) -> Any:
    """The value of a GitHub expression (with or without its `${{ }}`) in `context`."""
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    functions = _status_functions(failed)
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        assert m, f"cannot read {text[pos:]!r}"
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    tokens.append(("end", ""))
    i = 0

    def peek() -> tuple[str, str]:
        return tokens[i]

    def take(value: str | None = None) -> tuple[str, str]:
        nonlocal i
        tok = tokens[i]
        assert value is None or tok[1] == value, f"expected {value!r}, got {tok!r} in {text!r}"
        i += 1
        return tok

    def number(v: Any) -> float:
        if v is None:
            return 0.0
        if isinstance(v, (bool, int, float)):
            return float(v)
        try:
            return float(v.strip()) if v.strip() else 0.0
        except ValueError:
            return float("nan")

    def equal(a: Any, b: Any) -> bool:
        if isinstance(a, str) and isinstance(b, str):
            return a.lower() == b.lower()
        if type(a) is type(b) and not isinstance(a, (int, float)):
            return bool(a == b)
        return number(a) == number(b)  # different types: both become numbers (NaN != NaN)

    def or_() -> Any:
        left = and_()
        while peek()[1] == "||":
            take()
            right = and_()
            left = left if truthy(left) else right
        return left

    def and_() -> Any:
        left = unary()
        while peek()[1] == "&&":
            take()
            right = unary()
            left = right if truthy(left) else left
        return left

    def unary() -> Any:
        if peek()[1] == "!":
            take()
            return not truthy(unary())
        return comparison()

    def comparison() -> Any:
        left = primary()
        if peek()[1] in ("==", "!="):
            op = take()[1]
            right = primary()
            return equal(left, right) if op == "==" else not equal(left, right)
        return left

    def primary() -> Any:
        kind, value = take()
        if value == "(":
            inner = or_()
            take(")")
            return inner
        if kind == "str":
            return value[1:-1].replace("''", "'")
        if kind == "num":
            return float(value)
        if kind == "name":
            if peek()[1] == "(":
                take("(")
                take(")")
                assert value in functions, f"function {value}() is not modelled"
                return functions[value]
            if value in ("true", "false", "null"):
                return {"true": True, "false": False, "null": None}[value]
            node: Any = context
            for part in value.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return node
        raise AssertionError(f"unexpected {value!r} in {text!r}")

    result = or_()
    assert peek()[0] == "end", f"trailing {tokens[i:]!r} in {text!r}"
    return result


def uses_status_function(condition: str) -> bool:
    return re.search(r"\b(always|success|failure|cancelled)\(\)", condition) is not None


def substitute(text: str, context: dict[str, Any]) -> str:
    """`${{ ... }}` replaced by its value, as GitHub does in `env:` and `with:` values."""

    def one(m: re.Match[str]) -> str:
        value = evaluate(m.group(1), context)
        if value is None:
            return ""
        return str(value).lower() if isinstance(value, bool) else str(value)

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


@dataclass
class ActionRun:
    """What running a composite action's steps did."""

    failed_step: str | None = None
    returncode: int = 0
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    """steps.<id>: {"outputs": {...}, "outcome": "success" | "failure" | "skipped"}."""
    ran: list[str] = field(default_factory=list)
    skipped_uses: list[str] = field(default_factory=list)
    log: str = ""


def run_composite(
    action: Path,
    *,
    inputs: dict[str, str],
    github: dict[str, Any],
    env: dict[str, str],
    cwd: Path,
    workdir: Path,
    given: dict[str, dict[str, str]] | None = None,
) -> ActionRun:
    """Run `action`'s steps as the runner would. Steps whose id is in `given` are not run:
    their outputs are given (e.g. an install step). `uses:` steps are skipped, and listed."""
    spec = load_yaml(action)
    given = given or {}
    result = ActionRun()
    context: dict[str, Any] = {
        "github": github,
        "steps": result.steps,
        "env": env,
        "runner": {
            "temp": env.get("RUNNER_TEMP", ""),
            "tool_cache": env.get("RUNNER_TOOL_CACHE", env.get("RUNNER_TEMP", "")),
        },
    }
    all_inputs = {name: str(meta.get("default", "")) for name, meta in spec["inputs"].items()}
    all_inputs = {k: substitute(v, context) for k, v in all_inputs.items()}
    unknown = set(inputs) - set(all_inputs)
    assert not unknown, f"{action}: no input(s) {unknown}"
    all_inputs.update(inputs)
    context["inputs"] = all_inputs
    workdir.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(spec["runs"]["steps"]):
        name = step.get("name") or step.get("uses") or f"step {n}"
        sid = step.get("id", f"__{n}")
        failed = result.failed_step is not None
        condition = str(step.get("if", "success()"))
        wanted = evaluate(condition, context, failed=failed)
        if not uses_status_function(condition):
            wanted = truthy(wanted) and not failed
        if not truthy(wanted):
            result.steps[sid] = {"outputs": {}, "outcome": "skipped"}
            continue
        if sid in given:
            result.steps[sid] = {"outputs": dict(given[sid]), "outcome": "success"}
            continue
        if "uses" in step:
            result.skipped_uses.append(str(step["uses"]))
            continue
        output = workdir / f"output-{n}"
        output.write_text("")
        script = workdir / f"step-{n}.sh"
        script.write_text(step["run"])
        step_env = {**env, "GITHUB_OUTPUT": str(output), "GITHUB_ACTION_PATH": str(action.parent)}
        for key, value in (step.get("env") or {}).items():
            step_env[key] = substitute(str(value), context)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            env=step_env,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        result.ran.append(name)
        result.log += f"--- {name} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}"
        outputs = {}
        for line in output.read_text().splitlines():
            key, _, value = line.partition("=")
            outputs[key] = value
        result.steps[sid] = {
            "outputs": outputs,
            "outcome": "success" if proc.returncode == 0 else "failure",
        }
        if proc.returncode != 0 and result.failed_step is None:
            result.failed_step, result.returncode = name, proc.returncode
    return result


def run_job(
    workflow: Path,
    job: str,
    *,
    github: dict[str, Any],
    env: dict[str, str],
    cwd: Path,
    workdir: Path,
    steps: set[str] | None = None,
    variables: dict[str, str] | None = None,
    step_env: dict[str, dict[str, str]] | None = None,
    contexts: dict[str, Any] | None = None,
) -> ActionRun:
    """Run the `run:` steps of one job of `workflow` as a runner would, with the workflow's
    and the job's `env:` substituted. `steps`: only the steps of these names (all if None);
    `step_env`: more variables for the step of that name (what this machine lacks);
    `contexts`: more expression contexts (`matrix`, `strategy`, `needs`).
    `uses:` steps (a checkout) are skipped, and listed."""
    spec = load_yaml(workflow)
    result = ActionRun()
    context: dict[str, Any] = {
        "github": github,
        "steps": result.steps,
        "vars": variables or {},
        "runner": {
            "temp": env.get("RUNNER_TEMP", ""),
            "tool_cache": env.get("RUNNER_TOOL_CACHE", env.get("RUNNER_TEMP", "")),
        },
        **(contexts or {}),
    }
    base = dict(env)
    for table in (spec.get("env") or {}, spec["jobs"][job].get("env") or {}):
        for key, value in table.items():
            base[key] = substitute(str(value), context)
    context["env"] = base
    workdir.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(spec["jobs"][job]["steps"]):
        name = step.get("name") or step.get("uses") or f"step {n}"
        if "uses" in step:
            result.skipped_uses.append(str(step["uses"]))
            continue
        if steps is not None and name not in steps:
            continue
        if result.failed_step is not None:
            break
        script = workdir / f"{job}-step-{n}.sh"
        script.write_text(step["run"])
        env_of_step = dict(base)
        for key, value in (step.get("env") or {}).items():
            env_of_step[key] = substitute(str(value), context)
        env_of_step.update((step_env or {}).get(name, {}))
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            env=env_of_step,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        result.ran.append(name)
        result.log += f"--- {name} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}"
        if proc.returncode != 0:
            result.failed_step, result.returncode = name, proc.returncode
    return result
