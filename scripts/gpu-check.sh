#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: every on-device check of the CUDA path in one run, so a
# short lease of a device is enough. Each step's exit status is kept and compared with the
# status it should have; the script goes on to the next step (its figures still matter),
# writes a summary, and exits 1 when any step did not end as it should.
#
# Everything lands under $OUT (default: a new temporary folder): one log per step,
# steps.log, the databases, the run records, the check verdicts and summary.txt.
#   PYTHON=python3   the interpreter (memtrack is used from this checkout, not installed)
#   WHEELS=DIR       install sqlite-utils, gitpython, pytest and pytest-timeout
#                    from this folder of wheels, offline, before anything else
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$(mktemp -d)}
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
failed=()

# step NAME STATUS COMMAND...: run COMMAND, log it, compare its exit status with STATUS.
step() {
  local name=$1 want=$2 rc=0
  shift 2
  echo "== $name" | tee -a "$out/steps.log"
  "$@" >"$out/$name.log" 2>&1 || rc=$?
  tail -n 40 "$out/$name.log"
  echo "   $name: exit $rc (should be $want)" | tee -a "$out/steps.log"
  if [ "$rc" -ne "$want" ]; then
    failed+=("$name: exit $rc, should be $want")
  fi
}

memtrack() { (cd "$out/repo" && "$py" -m memtrack.cli "$@"); }

commit() {
  git -C "$out/repo" add -A
  git -C "$out/repo" -c user.name=memtrack -c user.email=memtrack@localhost \
    commit -q -m "$1"
}

if [ -n "${WHEELS:-}" ]; then
  step install 0 "$py" -m pip install --no-index --find-links "$WHEELS" \
    sqlite-utils gitpython pytest pytest-timeout
fi
step nvidia-smi 0 nvidia-smi --query-gpu=name,uuid,memory.total,driver_version,mig.mode.current \
  --format=csv
step doctor 0 "$py" -m memtrack.cli doctor --db "$out/memtrack.db"
step gpu-tests 0 "$py" -m pytest -p no:cacheprovider -m gpu -v "$src/tests/test_gpu.py"

# The example suite at GPU scale (several GiB per case), and a case that can grow by 64 MiB,
# in a scratch repository: recorded on main; again on a branch with no change (checked as a
# pull request is, so it could block, and must not); once more on a branch that grows.
mkdir -p "$out/repo"
git -C "$out/repo" init -q -b main
cat >"$out/repo/memtrack.toml" <<'TOML'
modules = ["memtrack.examples", "growth.py"]
base_branch = "main"
warmup = 1
repeats = 3
min_baseline_runs = 1
timeout = "5 min"
database = "memtrack.db"

[workloads.decoder_generate.params]
sessions = [4, 16]
max_len = 2048
new_tokens = 32
d_model = 1024
heads = 16
layers = 8
vocab = 32000
dtype = "bfloat16"

[workloads.train_step.params]
batch = 16
seq_len = 512
d_model = 1024
layers = 8
dtype = "bfloat16"

[workloads.image_classify.params]
batch = 128
resolution = 224
width = 64
dtype = "bfloat16"
TOML
write_growth() {
  cat >"$out/repo/growth.py" <<PY
import torch

import memtrack

EXTRA_MIB = $1  # a scratch buffer alive at the step's peak


@memtrack.workload(params={"n": 16384})
def matmul(ctx):
    a = ctx.randn(ctx["n"], ctx["n"])
    w = torch.nn.Linear(ctx["n"], ctx["n"], bias=False).to(ctx.device, ctx.dtype)
    ctx.mark(w)

    def step():
        extra = torch.ones(EXTRA_MIB * 2**18, device=ctx.device) if EXTRA_MIB else None
        out = w(a)
        return out if extra is None else out + extra.sum()

    return step
PY
}
write_growth 0
commit "the suite"
step run-1 0 memtrack run --json "$out/run-1.json"
git -C "$out/repo" checkout -q -b rerun
step run-2 0 memtrack run --json "$out/run-2.json"
step check-2 0 memtrack check --base main --json "$out/check-2.json"
git -C "$out/repo" checkout -q -b grow main
write_growth 64
commit "64 MiB more at the peak"
step run-grow 0 memtrack run -k matmul --json "$out/run-grow.json"
step check-grow 1 memtrack check --base main --json "$out/check-grow.json"

# A forced CUDA OOM and a spike shorter than the sampling interval, in a database of their own.
mkdir -p "$out/probe"
cat >"$out/probe/memtrack.toml" <<'TOML'
modules = ["probe.py"]
warmup = 1
repeats = 3
database = "probe.db"
TOML
cat >"$out/probe/probe.py" <<'PY'
import torch

import memtrack


@memtrack.workload
def forced_oom(ctx):
    total = torch.cuda.get_device_properties(ctx.device).total_memory
    return lambda: torch.empty(2 * total, dtype=torch.uint8, device=ctx.device)


@memtrack.workload
def short_spike(ctx):
    x = ctx.randn(1024, 1024)

    def step():
        spike = torch.ones(2**30, dtype=torch.uint8, device=ctx.device)  # 1 GiB for ~1 ms
        del spike
        torch.cuda.empty_cache()  # back to the driver before a 10 ms sampler looks
        return x @ x

    return step
PY
step run-probe 0 bash -c "cd '$out/probe' && '$py' -m memtrack.cli run --json '$out/run-probe.json'"

step summary 0 "$py" - "$out" <<'PY'
"""The figures of every recorded case, and the CUDA path's invariants, into summary.txt."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
lines, bad = [], []
MiB = 2**20


def mib(v):
    return "-" if v is None else f"{v / MiB:.1f}"


for name in ("run-1", "run-2", "run-grow", "run-probe"):
    path = out / f"{name}.json"
    if not path.exists():
        bad.append(f"{name}: no record")
        continue
    run = json.loads(path.read_text())
    env = run["environment"]
    gpus = ", ".join(f"{g['name']} ({mib(g['total_bytes'])} MiB)" for g in env["gpus"])
    lines.append(
        f"# {name}: {run['started_at']} driver {env['driver']} CUDA {env['cuda_runtime']} "
        f"torch {env['torch']} GPUs {gpus} visible {env.get('visible_uuids')}"
    )
    lines.append(
        "case | status | allocated | reserved | device (process) | device (memory pass) | "
        "workspace | MiB; step median s | case duration s | samples | achieved interval ms | view"
    )
    for m in run["measurements"]:
        devs = m["devices"]
        dev = max(devs, key=lambda d: d["peak_process_bytes"] or 0) if devs else {}
        samples = dev.get("samples")
        interval = m["duration_s"] / samples * 1e3 if samples else None
        lines.append(
            f"{m['case_id']} | {m['status']} | {mib(m['peak_allocated_bytes'])} | "
            f"{mib(m['peak_reserved_bytes'])} | {mib(dev.get('peak_process_bytes'))} | "
            f"{mib(dev.get('memory_pass_peak_bytes'))} | {mib(m['workspace_bytes'])} | "
            f"{m['time_median_s']} | {m['duration_s']} | {samples} | "
            f"{'-' if interval is None else f'{interval:.1f}'} | "
            f"{m['device_view']} {dev.get('process_view')} {m['device_view_note'] or ''}"
        )
        for note in m["notes"]:
            lines.append(f"    note: {note}")
        if m["status"] == "ok" and m["device"] == "cuda":
            a, r, d = m["peak_allocated_bytes"], m["peak_reserved_bytes"], dev.get("peak_process_bytes")
            if None in (a, r, d) or not a <= r <= d:
                bad.append(f"{name} {m['case_id']}: allocated <= reserved <= device fails: {a} {r} {d}")
        if name == "run-probe" and m["workload"] == "forced_oom":
            if m["status"] != "oom" or not m.get("num_ooms"):
                bad.append(f"forced_oom: {m['status']} num_ooms={m.get('num_ooms')}")
for name in ("check-2", "check-grow"):
    path = out / f"{name}.json"
    if path.exists():
        verdicts = json.loads(path.read_text())["verdicts"]
        blocking = sorted({(v["case_id"], v["metric"]) for v in verdicts if v["blocking"]})
        lines.append(f"# {name}: blocking {blocking}")
        if name == "check-grow":
            metrics = {metric for _, metric in blocking}
            if not {"allocated", "reserved", "device"} <= metrics:
                bad.append(f"check-grow: 64 MiB should block allocated, reserved, device: {metrics}")
lines += [f"INVARIANT FAILED: {b}" for b in bad]
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if bad else 0)
PY

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" | tee -a "$out/steps.log"
  exit 1
fi
echo "all steps as expected; figures in $out/summary.txt" | tee -a "$out/steps.log"
