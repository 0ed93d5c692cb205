#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: every on-device check of the CUDA path in one run, so a
# short lease of a device is enough. Each step's exit status is kept and compared with the
# status it should have; the script goes on to the next step (its figures still matter),
# writes a summary, and exits 1 when any step did not end as it should. It exits 2, before
# any step, when what it needs is missing: git, the interpreter, nvidia-smi, a wheel, or a
# package the tests import.
#
# Everything lands under $OUT (default: a new temporary folder): one log per step,
# steps.log, the databases, the run records, the check verdicts and summary.txt.
#   PYTHON=python3   the interpreter (memtrack is used from this checkout, not installed)
#   WHEELS=DIR       the wheels scripts/gpu-wheels.txt names (what the device's image
#                    lacks), installed offline without their dependencies into $OUT/site
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}

# What every step needs, before anything runs: without git the scratch repository's
# `git init` would end the script under `set -e` half-way, with no summary.
missing=()
for tool in git "$py" nvidia-smi; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "gpu-check: not found: ${missing[*]}; nothing was run" >&2
  exit 2
fi

out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
failed=()

if [ -n "${WHEELS:-}" ]; then
  # --no-deps: each wheel's own needs are in the list or on the image; --no-index: the
  # device reaches no registry.
  if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$out/site" --find-links "$WHEELS" -r "$src/scripts/gpu-wheels.txt" \
      >"$out/install.log" 2>&1; then
    echo "gpu-check: the wheels of scripts/gpu-wheels.txt did not install from $WHEELS:" \
      "$(grep -m 1 -E 'ERROR|error' "$out/install.log" || tail -n 1 "$out/install.log")" >&2
    exit 2
  fi
  export PYTHONPATH="$PYTHONPATH:$out/site"
fi
# Every test module imports here (memtrack's own dependencies with them): a package that is
# missing is named now, not as a collection error of the GPU tests.
if ! "$py" -m pytest -p no:cacheprovider --collect-only -q -m gpu "$src/tests" \
    >"$out/collect.log" 2>&1; then
  echo "gpu-check: the tests do not import here (see $out/collect.log):" \
    "$(grep -m 1 -E 'Error' "$out/collect.log" || tail -n 1 "$out/collect.log")" >&2
  exit 2
fi

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

step nvidia-smi 0 nvidia-smi --query-gpu=name,uuid,memory.total,driver_version,mig.mode.current \
  --format=csv
step doctor 0 "$py" -m memtrack.cli doctor --db "$out/memtrack.db"
# Every gpu-marked test of the suite, wherever it lives.
step gpu-tests 0 "$py" -m pytest -p no:cacheprovider -m gpu -v "$src/tests"

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
        # alive through the product, the step's peak, and nothing else allocated for it
        extra = torch.ones(EXTRA_MIB * 2**18, device=ctx.device) if EXTRA_MIB else None
        out = w(a)
        del extra
        return out

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

# short_spike is judged by its note: its spike is built for the sampler to miss.
step summary 0 "$py" "$src/scripts/gpu_summary.py" "$out"

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" | tee -a "$out/steps.log"
  exit 1
fi
echo "all steps as expected; figures in $out/summary.txt" | tee -a "$out/steps.log"
