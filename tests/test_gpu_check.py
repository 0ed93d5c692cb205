"""scripts/gpu-check.sh, the one script a GPU session runs: its exit status must say whether
every step ended as it should, it must be able to install and run on the device's image, and
what it leaves in $OUT must come back from the device machine (at most 8 files, no more than
2 folders down, plain names) within the device time planned for it. Run here with stand-ins
for `python3` and `nvidia-smi` (this machine has no GPU), with real bash, git, pip, timeout
and tar, and with the parts of it that run on the CPU run for real: its summary
(scripts/gpu_summary.py) and its growth workload, measured by memtrack."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
WHEELS = ROOT / "scripts" / "gpu-wheels.txt"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_summary  # noqa: E402

# Logs its arguments; hands pip and the summary to this interpreter; succeeds at everything
# but the GPU tests (their collection succeeds: the script checks it before any step).
PYTHON = f"""#!/bin/sh
echo "$*" >> "$STAND_IN_LOG"
case "$1 $2" in "-m pip") exec {sys.executable} "$@";; esac
case "$1" in *gpu_summary.py) exec {sys.executable} "$@";; esac
case "$*" in *"--collect-only"*) exit 0;; *"-m pytest"*) echo "1 failed"; exit 1;; esac
exit 0
"""


def _bin(tmp_path: Path, *, without: tuple[str, ...] = (), python: str = PYTHON) -> Path:
    """A PATH of its own: the stand-ins, and every tool of the system's PATH but `without`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = bin_dir / name
            if (
                name not in without
                and not target.exists()
                and os.access(os.path.join(folder, name), os.X_OK)
            ):
                target.symlink_to(os.path.join(folder, name))
    for name, text in (("python3", python), ("nvidia-smi", "#!/bin/sh\necho 'NVIDIA H200'\n")):
        path = bin_dir / name
        path.unlink(missing_ok=True)
        if name in without:
            continue
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "WHEELS", "PYTHONPATH")}
    return {
        **env,
        "PATH": str(bin_dir),
        "OUT": str(tmp_path / "out"),
        "SCRATCH": str(tmp_path / "scratch"),  # kept, to look into: the device's is removed
        "STAND_IN_LOG": str(tmp_path / "python3.log"),
        **extra,
    }


def _run(tmp_path: Path, python: str = PYTHON, **extra: str) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(exist_ok=True)
    env = _env(tmp_path, _bin(tmp_path, python=python), **extra)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-check")
    return tmp, _run(tmp)


def test_gpu_check_exits_1_when_the_gpu_tests_fail_and_still_runs_every_step(script_run):
    tmp_path, out = script_run
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: gpu-tests: exit 1, should be 0" in out.stdout
    steps = (tmp_path / "out" / "steps.log").read_text()
    for name in ("doctor", "gpu-tests", "run-1", "check-2", "check-grow", "run-probe", "summary"):
        assert f"== {name}\n" in steps
    # the step that must block (64 MiB more) is held to exit 1: a stand-in that says 0 fails it
    assert "FAILED: check-grow: exit 0, should be 1" in out.stdout


def test_gpu_check_runs_every_gpu_marked_test_of_the_suite(script_run):
    tmp_path, _ = script_run
    calls = (tmp_path / "python3.log").read_text().splitlines()
    (tests,) = [c for c in calls if "-m pytest" in c and "--collect-only" not in c]
    assert tests.split()[-1] == str(ROOT / "tests") and "-m gpu" in tests
    # and `-m gpu` over tests/ selects them in every module that has one
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "-m",
            "gpu",
            str(ROOT / "tests"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert collected.returncode == 0, collected.stdout + collected.stderr
    files = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    for name in (
        "test_gpu.py",
        "test_sessions.py",
        "test_snapshot.py",
        "test_estimate.py",
        "test_quality.py",
        "test_ranks.py",
    ):
        assert f"tests/{name}" in files


# What the device machine hands back from $OUT (its tool's README): at most 8 files, no more
# than 2 folders down, each file and folder named in letters, digits, '.', '_' and '-' alone;
# where $OUT holds more, nothing may come back.
OUT_FILES = 8
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
STEPS = (
    "nvidia-smi",
    "doctor",
    "gpu-tests",
    "run-1",
    "run-2",
    "check-2",
    "run-grow",
    "check-grow",
    "run-probe",
    "summary",
)


def _returned(out: Path) -> list[str]:
    """Every entry under `out`, relative, each checked against the device's limits."""
    entries = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    files = [e for e in entries if (out / e).is_file()]
    assert len(files) <= OUT_FILES, files
    for entry in entries:
        parts = entry.split("/")
        assert len(parts) <= 3, entry  # $OUT/a/b/file at most
        assert all(NAME.match(part) for part in parts), entry
    return entries


def _recording_python(record: Path) -> str:
    """PYTHON, and a `memtrack run` or `check` that writes its --json record as memtrack
    would (a run recorded here on the CPU; a check without verdicts)."""
    return f"""#!/bin/sh
echo "$*" >> "$STAND_IN_LOG"
case "$1 $2" in "-m pip") exec {sys.executable} "$@";; esac
case "$1" in *gpu_summary.py) exec {sys.executable} "$@";; esac
case "$*" in *"--collect-only"*) exit 0;; *"-m pytest"*) exit 0;; esac
json=""; previous=""
for arg in "$@"; do [ "$previous" = "--json" ] && json=$arg; previous=$arg; done
case "$*" in
  *"memtrack.cli run"*) cp {record} "$json";;
  *"memtrack.cli check"*) echo '{{"verdicts": []}}' > "$json";;
esac
exit 0
"""


def test_gpu_check_leaves_three_files_in_out_and_all_else_in_one_archive(tmp_path):
    # Before: the wheels in $OUT/site (hundreds of files), the scratch repository with its
    # .git in $OUT/repo, a log per step and six JSON records: ~20 files at the top alone.
    from factories import make_measurement, make_run

    from memtrack.records import to_dict

    record = tmp_path / "record.json"
    record.write_text(json.dumps(to_dict(make_run([make_measurement("matmul")]))))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, version in _requirements()[0].items():
        _wheel(wheels, name, version)
    out = _run(tmp_path, python=_recording_python(record), WHEELS=str(wheels))
    assert out.returncode == 1, out.stdout + out.stderr  # check-grow does not block here
    assert "FAILED: check-grow: exit 0, should be 1" in out.stdout
    assert _returned(tmp_path / "out") == ["results.tar.gz", "steps.log", "summary.txt"]
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as archive:
        names = set(archive.getnames())
    for step in ("collect", "install", *STEPS):
        assert f"logs/{step}.log" in names, sorted(names)
    for record_name in ("run-1", "run-2", "check-2", "run-grow", "check-grow", "run-probe"):
        assert f"records/{record_name}.json" in names
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "# run-probe: " in summary and "matmul[batch=1] | ok" in summary
    # the scratch holds the rest: the installed wheels and the repository
    assert (tmp_path / "scratch" / "site").is_dir()
    assert (tmp_path / "scratch" / "repo" / ".git").is_dir()


def test_gpu_check_fails_when_out_would_hold_more_than_the_device_hands_back(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for i in range(6):  # what something else left there: 6 + 3 files is past 8
        (out_dir / f"left-{i}.txt").write_text("x")
    out = _run(tmp_path)
    assert out.returncode == 1
    assert "FAILED: OUT: 9 files (at most 8), 0 entries over 2 folders down" in out.stdout


def test_gpu_check_refuses_a_scratch_inside_out(tmp_path):
    out = _run(tmp_path, SCRATCH=str(tmp_path / "out" / "scratch"))
    assert out.returncode == 2
    assert "is inside OUT" in out.stderr and "nothing there may come back" in out.stderr
    assert not (tmp_path / "python3.log").exists()


def test_the_results_folder_is_the_scripts_argument(tmp_path):
    """`bash scripts/gpu-check.sh DIR`, as docs/development.md runs it: DIR is the results
    folder (found here by a scratch folder inside it, refused before anything runs)."""
    results = tmp_path / "results"
    env = _env(tmp_path, _bin(tmp_path), SCRATCH=str(results / "scratch"))
    del env["OUT"]
    out = subprocess.run(
        ["bash", str(SCRIPT), str(results)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and f"is inside OUT ({results})" in out.stderr, out.stderr
    assert not (tmp_path / "python3.log").exists()


def _plan(text: str) -> tuple[dict[str, int], int]:
    steps = dict((m[1], int(m[2])) for m in re.finditer(r"^  (\S+) +(\d+) s$", text, re.MULTILINE))
    (total,) = re.findall(r"^  total +(\d+) s ", text, re.MULTILINE)
    return steps, int(total)


def test_the_dry_run_prints_each_steps_deadline_and_a_total_within_6_minutes(tmp_path, script_run):
    out = _run(tmp_path, DRY_RUN="1")
    assert out.returncode == 0, out.stderr
    steps, total = _plan(out.stdout)
    assert total == sum(steps.values()) <= 6 * 60  # a rerun fits in 15 minutes of device time
    # a deadline for every step the script runs, and nothing run to print them
    script_tmp, _ = script_run
    ran = re.findall(r"^== (\S+)$", (script_tmp / "out" / "steps.log").read_text(), re.MULTILINE)
    assert list(steps) == ["install", "collect", *ran]
    assert ran == [*STEPS, "archive"]
    assert not (tmp_path / "python3.log").exists() and not (tmp_path / "out").exists()
    # a plan past 6 minutes is refused
    over = _run(tmp_path / "over", DRY_RUN="1", DEADLINES="gpu-tests=600")
    assert over.returncode == 1 and "more than 360 s" in over.stderr


HANGS = PYTHON.replace(
    'case "$*" in *"--collect-only"*)',
    'case "$*" in *"memtrack.cli doctor"*) exec sleep 600;; esac\ncase "$*" in *"--collect-only"*)',
)


def test_a_step_that_hangs_is_cut_at_its_deadline_and_every_later_step_still_runs(tmp_path):
    out = _run(tmp_path, python=HANGS, DEADLINES="doctor=1")
    assert out.returncode == 1
    log = (tmp_path / "out" / "steps.log").read_text()
    assert re.search(
        r"doctor: exit 124 \(should be 0\) in \d+ s of 1 s planned, cut at its deadline", log
    ), log
    assert "FAILED: doctor: exit 124, should be 0" in out.stdout
    for step in (*STEPS[2:], "archive"):
        assert f"== {step}\n" in log
    assert _returned(tmp_path / "out") == ["results.tar.gz", "steps.log", "summary.txt"]


@pytest.mark.parametrize("tool", ["git", "nvidia-smi", "python3"])
def test_gpu_check_refuses_to_start_without_a_prerequisite(tmp_path, tool):
    env = _env(tmp_path, _bin(tmp_path, without=(tool,)))
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpu-check: not found: {tool}; nothing was run"
    assert not (tmp_path / "out").exists()  # before anything else


def _requirements() -> tuple[dict[str, str], set[str]]:
    """scripts/gpu-wheels.txt: the carried wheels (name -> version) and the image's names."""
    carried, image = {}, set()
    for line in WHEELS.read_text().splitlines():
        if line.startswith("# image:"):
            image = {canonicalize_name(n) for n in line.removeprefix("# image:").split()}
        elif line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            carried[canonicalize_name(name)] = version
    return carried, image


def _closure(names: list[str], given: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Every distribution `names` need, as installed here, their markers evaluated. What the
    image gives (`given`) comes with its own needs: its torch, say, is another build than this
    machine's, whose CUDA wheels are not this one's to carry."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        if name in given:
            continue
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_the_carried_wheels_and_the_image_cover_what_memtrack_and_its_tests_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [Requirement(r) for r in project["dependencies"]]
    needed = [r.name for r in runtime if r.marker is None or r.marker.evaluate()]
    # what the test modules import when collected (streamlit and playwright are skipped)
    needed += [
        "pytest",
        "pytest-timeout",
        "hypothesis",
        "jsonschema",
        "ruamel.yaml",
        "pyyaml",
        "numpy",
    ]
    carried, image = _requirements()
    missing = sorted(_closure(needed, image) - set(carried) - image)
    assert missing == [], f"neither carried in {WHEELS.name} nor on the image: {missing}"
    # what the device's image lacks, the script carries (the list among them)
    for name in (
        "sqlite-utils",
        "sqlite-fts4",
        "click-default-group",
        "gitpython",
        "gitdb",
        "smmap",
    ):
        assert name in carried and name not in image
    # each pin satisfies what the distributions installed here ask of it (the versions
    # themselves are this machine's, which another environment may not share)
    asked: dict[str, list[Requirement]] = {}
    for dist in _closure(needed, image):
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                asked.setdefault(canonicalize_name(req.name), []).append(req)
    for name, version in carried.items():
        for req in asked.get(name, []):
            assert req.specifier.contains(version, prereleases=True), (name, version, str(req))


def _wheel(folder: Path, name: str, version: str) -> None:
    """A minimal, valid wheel standing for `name` (the real ones are fetched for the device)."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}_stand_in/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def test_gpu_check_installs_every_carried_wheel_offline_without_dependencies(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    carried, _ = _requirements()
    for name, version in carried.items():
        _wheel(wheels, name, version)
    out = _run(tmp_path, WHEELS=str(wheels))
    assert out.returncode == 1, out.stdout + out.stderr  # the stand-in's GPU tests fail
    (pip,) = [c for c in (tmp_path / "python3.log").read_text().splitlines() if "-m pip" in c]
    for flag in ("--no-index", "--no-deps", f"--find-links {wheels}", f"-r {WHEELS}"):
        assert flag in pip
    site = tmp_path / "scratch" / "site"  # the scratch's: hundreds of files, never $OUT's
    installed = {canonicalize_name(p.name.split("-")[0]) for p in site.glob("*.dist-info")}
    assert installed == set(carried)


def test_gpu_check_stops_before_any_step_when_a_wheel_is_missing(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    carried, _ = _requirements()
    for name, version in carried.items():
        if name != "smmap":
            _wheel(wheels, name, version)
    out = _run(tmp_path, WHEELS=str(wheels))
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"gpu-check: the wheels of scripts/gpu-wheels.txt did not install from {wheels}:"
    )
    assert "smmap" in out.stderr
    assert not (tmp_path / "out" / "steps.log").exists()


def _record(**m) -> dict:
    dev = {
        "peak_process_bytes": m.pop("device"),
        "memory_pass_peak_bytes": m.pop("passed"),
        "samples": 40,
        "process_view": "pid",
    }
    return {
        "case_id": m["workload"],
        "status": "ok",
        "device": "cuda",
        "notes": [],
        "devices": [dev],
        "workspace_bytes": None,
        "time_median_s": 0.01,
        "duration_s": 2.0,
        "sample_interval_s": 0.011,
        "device_view": "nvml",
        "device_view_note": None,
        **m,
    }


def _summary(tmp_path: Path, *measurements: dict) -> tuple[int, str]:
    env = {
        "driver": "580",
        "cuda_runtime": "13.0",
        "torch": "2.11.0",
        "gpus": [],
        "visible_uuids": [],
        "allocator_backend": "native",
    }
    for name in gpu_summary.RUNS:
        run = {
            "started_at": "now",
            "environment": env,
            "measurements": list(measurements) if name == "run-probe" else [],
        }
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    code = gpu_summary.main([str(tmp_path)])
    return code, (tmp_path / "summary.txt").read_text()


GiB = 2**30


def test_the_summary_judges_short_spike_by_its_note_and_every_other_case_by_its_figures(tmp_path):
    # short_spike's 1 GiB lives ~1 ms: a 10 ms sampler misses it, and says so
    missed = _record(
        workload="short_spike",
        peak_allocated_bytes=GiB,
        peak_reserved_bytes=GiB,
        device=GiB // 2,
        passed=GiB // 2,
        notes=["GPU 0: sampled device peak ... : " + gpu_summary.MISSED],
    )
    code, text = _summary(tmp_path, missed)
    assert code == 0, text
    silent = {**missed, "notes": []}
    code, text = _summary(tmp_path, silent)
    assert code == 1 and "short_spike: its spike was missed" in text
    caught = {**silent, "devices": [{**silent["devices"][0], "memory_pass_peak_bytes": 2 * GiB}]}
    assert _summary(tmp_path, caught)[0] == 0  # a sample caught it: no note needed
    # any other case is held to allocated <= reserved <= device, whatever its notes say
    other = {**missed, "workload": "matmul", "case_id": "matmul"}
    code, text = _summary(tmp_path, other)
    assert code == 1 and "matmul: allocated <= reserved <= device fails" in text


GROWTH_CONFIG = (
    'modules = ["growth.py"]\nwarmup = 1\nrepeats = 2\ndevice = "cpu"\n'
    "[workloads.matmul.params]\nn = 256\n"
)


def _peak(tmp_path: Path, source: str) -> int:
    from memtrack.config import load_config
    from memtrack.measure.suite import run_suite
    from memtrack.workload.registry import discover, select_cases

    tmp_path.mkdir()
    (tmp_path / "growth.py").write_text(source)
    (tmp_path / "memtrack.toml").write_text(GROWTH_CONFIG)
    config = load_config(tmp_path / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config))).measurements
    assert m.status == "ok", m.message
    return m.peak_allocated_bytes


def test_the_growth_the_script_commits_is_64_mib_at_the_peak_measured_on_the_cpu(
    script_run, tmp_path
):
    # The same workload the script records on main and then grows, measured by memtrack on
    # the CPU (exact tensor bytes): its peak grows by 64 MiB, not 64 MiB and a second output.
    script_tmp, _ = script_run
    repo = script_tmp / "scratch" / "repo"

    def show(ref: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "show", f"{ref}:growth.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    base, grown = show("main"), show("grow")
    assert "EXTRA_MIB = 0" in base and "EXTRA_MIB = 64" in grown
    assert _peak(tmp_path / "grow", grown) - _peak(tmp_path / "main", base) == 64 * 2**20


def test_the_summary_holds_workspace_at_or_above_0_and_none_where_the_spike_was_missed(tmp_path):
    base = _record(
        workload="matmul",
        peak_allocated_bytes=GiB,
        peak_reserved_bytes=2 * GiB,
        device=3 * GiB,
        passed=3 * GiB,
    )
    code, text = _summary(tmp_path, {**base, "workspace_bytes": GiB})
    assert code == 0, text
    code, text = _summary(tmp_path, {**base, "workspace_bytes": -400 * 2**20})
    assert code == 1 and "matmul: workspace -419430400 is below 0" in text
    missed = _record(
        workload="short_spike",
        peak_allocated_bytes=GiB,
        peak_reserved_bytes=GiB,
        device=GiB // 2,
        passed=GiB // 2,
        notes=["GPU 0: ... : " + gpu_summary.MISSED],
    )
    assert _summary(tmp_path, missed)[0] == 0
    code, text = _summary(tmp_path, {**missed, "workspace_bytes": 0})
    assert code == 1 and "yet it has a workspace: 0" in text


def test_the_summary_reads_every_run_of_each_database_back(tmp_path):
    import sqlite3

    from factories import make_measurement, make_run

    from memtrack.store.database import Store

    db = tmp_path / "probe.db"
    run = make_run([make_measurement("short_spike")])
    with Store.open(db) as store:
        store.write_run(run)
    summary = tmp_path / "summary.txt"
    assert gpu_summary.main([str(tmp_path), str(summary), str(db)]) == 1  # no records here
    text = summary.read_text()
    assert "# probe.db: 1 run(s) read back whole" in text
    assert "INVARIANT FAILED: probe.db" not in text
    # a value the store reads as damage (written past memtrack, as a bug once did)
    with sqlite3.connect(db) as conn:
        conn.execute("update measurements set workspace_bytes = -419430400")
    gpu_summary.main([str(tmp_path), str(summary), str(db)])
    (line,) = [x for x in summary.read_text().splitlines() if "INVARIANT FAILED: probe.db" in x]
    assert "damaged database" in line and "workspace_bytes: -419430400 is below 0" in line
