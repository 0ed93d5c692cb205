#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: every on-device check of the CUDA path in one run, so a
# short lease of a device is enough. Each step's exit status is kept and compared with the
# status it should have; the script goes on to the next step (its figures still matter),
# writes a summary, and exits 1 when any step did not end as it should. It exits 2, before
# any step, when what it needs is missing: git, the interpreter, nvidia-smi, timeout, tar, a
# wheel, or a package the tests import.
#
# The machine it is written for (this workplace's device tool; its limits are in
# /work/.library/device/README.md, read when this was written):
#   - one command runs 600 s at most (10 minutes); a session has 15 minutes of device time
#     in all, each machine's start (a minute or more), every try and every idle wait counted;
#   - at most 8 files come back from $OUT, 16 MiB each and 64 MiB together, no more than 2
#     folders down ($OUT/a/b/file comes back, $OUT/a/b/c/file does not), each file and folder
#     named in letters, digits, '.', '_' and '-' alone; where $OUT holds more, nothing may
#     come back at all;
#   - the machine starts bare and is given back after the session: nothing else survives.
# So everything but the results lives in a scratch folder outside $OUT ($SCRATCH, default a
# new temporary folder, removed at the end): the wheels installed, the scratch repositories
# (.git and all), each step's log, the run records and the databases. $OUT receives 3 files:
#   summary.txt      every case's figures and the CUDA path's invariants (gpu_summary.py)
#   steps.log        each step: its exit status, the one it should have, seconds taken of
#                    seconds planned
#   results.tar.gz   logs/ (one per step), records/ (the runs and checks as JSON) and the
#                    databases; without the databases where it would pass 16 MiB
# (and, where the preflight fails, its one log). Before it ends the script checks $OUT
# against those limits and fails if it breaks one.
#
# Every step runs under its own deadline (`timeout`; PLAN below), so that one hang cannot eat
# the 600-s command before the summary and the archive are written. The deadlines add up to
# at most PLAN_LIMIT_S (6 minutes) so that, with a machine's start, a rerun still fits in the
# 15 minutes. They are a plan: the GPU path has not yet run on a GPU. steps.log's "in N s of
# M s planned" says how far each step is from its deadline: set them from the first run.
#
#   bash scripts/gpu-check.sh DIR   the results go into DIR (or OUT=DIR; else a new
#                    temporary folder)
#   DRY_RUN=1        print the plan (each step's deadline, the total) and run nothing
#   DEADLINES="doctor=30 run-1=60"   other deadlines for these steps, in seconds
#   PYTHON=python3   the interpreter (memtrack is used from this checkout, not installed)
#   WHEELS=DIR       the wheels scripts/gpu-wheels.txt names (what the device's image
#                    lacks), installed offline without their dependencies into the scratch
#   SCRATCH=DIR      the scratch folder (kept at the end when given); never inside $OUT
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}

# step deadline_s: in the order they run. install and collect are the preflight; archive
# writes results.tar.gz.
PLAN=(
  "install 15"
  "collect 30"
  "nvidia-smi 5"
  "doctor 20"
  "gpu-tests 120"
  "run-1 45"
  "run-2 35"
  "check-2 10"
  "run-grow 15"
  "check-grow 10"
  "run-probe 20"
  "summary 10"
  "archive 5"
)
PLAN_LIMIT_S=360
OUT_FILES=8
OUT_FILE_BYTES=$((16 * 2**20))

# limit NAME: the step's deadline in seconds (DEADLINES first).
limit() {
  local entry
  for entry in ${DEADLINES:-}; do
    if [ "${entry%%=*}" = "$1" ]; then
      echo "${entry#*=}"
      return
    fi
  done
  for entry in "${PLAN[@]}"; do
    if [ "${entry%% *}" = "$1" ]; then
      echo "${entry#* }"
      return
    fi
  done
  echo "gpu-check: no deadline planned for step $1" >&2
  exit 2
}

if [ "${DRY_RUN:-0}" != 0 ]; then
  total=0
  echo "gpu-check plan: each step's deadline (device time, the most it may take)"
  for entry in "${PLAN[@]}"; do
    name=${entry%% *}
    seconds=$(limit "$name")
    total=$((total + seconds))
    printf '  %-12s %4d s\n' "$name" "$seconds"
  done
  printf '  %-12s %4d s (%d min %02d s; at most %d s), the machine start (a minute or more) on top\n' \
    total "$total" $((total / 60)) $((total % 60)) "$PLAN_LIMIT_S"
  if [ "$total" -gt "$PLAN_LIMIT_S" ]; then
    echo "gpu-check: the plan takes $total s, more than $PLAN_LIMIT_S s" >&2
    exit 1
  fi
  exit 0
fi

# What every step needs, before anything runs: without git the scratch repository's
# `git init` would end the script under `set -e` half-way, with no summary.
missing=()
for tool in git "$py" nvidia-smi timeout tar; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "gpu-check: not found: ${missing[*]}; nothing was run" >&2
  exit 2
fi

out=${1:-${OUT:-$(mktemp -d)}}  # the results folder: the first argument, else OUT
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "${SCRATCH:-}" ]; then
  mkdir -p "$SCRATCH"
  scratch=$(cd "$SCRATCH" && pwd)
  case "$scratch/" in
    "$out"/*)
      echo "gpu-check: SCRATCH=$SCRATCH is inside OUT ($out): nothing there may come back" >&2
      exit 2
      ;;
  esac
else
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
mkdir -p "$scratch/logs" "$scratch/records"
repo=$scratch/repo
probe=$scratch/probe
export PYTHONUNBUFFERED=1
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
failed=()

# preflight NAME COMMAND...: run COMMAND under NAME's deadline, logged in the scratch; on
# failure its log is copied into $OUT (one file) and the status returned.
preflight() {
  local name=$1 rc=0
  shift
  timeout -k 5 "$(limit "$name")" "$@" >"$scratch/logs/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    cp "$scratch/logs/$name.log" "$out/$name.log"
  fi
  return "$rc"
}

if [ -n "${WHEELS:-}" ]; then
  # --no-deps: each wheel's own needs are in the list or on the image; --no-index: the
  # device reaches no registry.
  if ! preflight install "$py" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$scratch/site" --find-links "$WHEELS" \
      -r "$src/scripts/gpu-wheels.txt"; then
    echo "gpu-check: the wheels of scripts/gpu-wheels.txt did not install from $WHEELS:" \
      "$(grep -m 1 -E 'ERROR|error' "$out/install.log" || tail -n 1 "$out/install.log")" >&2
    exit 2
  fi
  export PYTHONPATH="$PYTHONPATH:$scratch/site"
fi
# Every test module imports here (memtrack's own dependencies with them): a package that is
# missing is named now, not as a collection error of the GPU tests.
if ! preflight collect "$py" -m pytest -p no:cacheprovider --collect-only -q -m gpu \
    "$src/tests"; then
  echo "gpu-check: the tests do not import here (see $out/collect.log):" \
    "$(grep -m 1 -E 'Error' "$out/collect.log" || tail -n 1 "$out/collect.log")" >&2
  exit 2
fi

# step NAME STATUS DIR COMMAND...: run COMMAND in DIR under NAME's deadline, log it in the
# scratch, compare its exit status with STATUS.
step() {
  local name=$1 want=$2 dir=$3 rc=0 seconds started took cut=""
  shift 3
  seconds=$(limit "$name")
  echo "== $name" | tee -a "$out/steps.log"
  started=$SECONDS
  (cd "$dir" && timeout -k 5 "$seconds" "$@") >"$scratch/logs/$name.log" 2>&1 || rc=$?
  took=$((SECONDS - started))
  tail -n 20 "$scratch/logs/$name.log"
  if { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "$took" -ge "$seconds" ]; then
    cut=", cut at its deadline"
  fi
  echo "   $name: exit $rc (should be $want) in $took s of $seconds s planned$cut" \
    | tee -a "$out/steps.log"
  if [ "$rc" -ne "$want" ]; then
    failed+=("$name: exit $rc, should be $want")
  fi
}

commit() {
  git -C "$repo" add -A
  git -C "$repo" -c user.name=memtrack -c user.email=memtrack@localhost \
    commit -q -m "$1"
}

step nvidia-smi 0 "$scratch" nvidia-smi \
  --query-gpu=name,uuid,memory.total,driver_version,mig.mode.current --format=csv
step doctor 0 "$scratch" "$py" -m memtrack.cli doctor --db "$scratch/doctor.db"
# Every gpu-marked test of the suite, wherever it lives; one that hangs ends at 60 s.
step gpu-tests 0 "$scratch" "$py" -m pytest -p no:cacheprovider -m gpu -v --timeout=60 \
  "$src/tests"

# The example suite at GPU scale (several GiB per case), and a case that can grow by 64 MiB,
# in a scratch repository: recorded on main; again on a branch with no change (checked as a
# pull request is, so it could block, and must not); once more on a branch that grows.
mkdir -p "$repo"
git -C "$repo" init -q -b main
cat >"$repo/memtrack.toml" <<'TOML'
modules = ["memtrack.examples", "growth.py"]
base_branch = "main"
warmup = 1
repeats = 3
min_baseline_runs = 1
timeout = "30 s"
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
  cat >"$repo/growth.py" <<PY
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
records=$scratch/records
write_growth 0
commit "the suite"
step run-1 0 "$repo" "$py" -m memtrack.cli run --json "$records/run-1.json"
git -C "$repo" checkout -q -b rerun
step run-2 0 "$repo" "$py" -m memtrack.cli run --json "$records/run-2.json"
step check-2 0 "$repo" "$py" -m memtrack.cli check --base main --json "$records/check-2.json"
git -C "$repo" checkout -q -b grow main
write_growth 64
commit "64 MiB more at the peak"
step run-grow 0 "$repo" "$py" -m memtrack.cli run -k matmul --json "$records/run-grow.json"
step check-grow 1 "$repo" "$py" -m memtrack.cli check --base main \
  --json "$records/check-grow.json"

# A forced CUDA OOM and a spike shorter than the sampling interval, in a database of their own.
mkdir -p "$probe"
cat >"$probe/memtrack.toml" <<'TOML'
modules = ["probe.py"]
warmup = 1
repeats = 3
timeout = "20 s"
database = "probe.db"
TOML
cat >"$probe/probe.py" <<'PY'
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
step run-probe 0 "$probe" "$py" -m memtrack.cli run --json "$records/run-probe.json"

# short_spike is judged by its note: its spike is built for the sampler to miss. Every run
# of both databases is read back, every value checked (a negative figure read as damage).
step summary 0 "$scratch" "$py" "$src/scripts/gpu_summary.py" "$records" "$out/summary.txt" \
  "$repo/memtrack.db" "$probe/probe.db"

# archive: the logs, the records and the databases, in one file of $OUT.
archive() {
  local items=() item rc=0 seconds
  seconds=$(limit archive)
  for item in logs records doctor.db repo/memtrack.db probe/probe.db; do
    if [ -e "$scratch/$item" ]; then
      items+=("$item")
    fi
  done
  echo "== archive" | tee -a "$out/steps.log"
  timeout -k 5 "$seconds" tar -czf "$out/results.tar.gz" -C "$scratch" "${items[@]}" || rc=$?
  if [ "$rc" -eq 0 ] && [ "$(wc -c <"$out/results.tar.gz")" -gt "$OUT_FILE_BYTES" ]; then
    echo "   results.tar.gz is over 16 MiB: made again without the databases" \
      | tee -a "$out/steps.log"
    timeout -k 5 "$seconds" tar -czf "$out/results.tar.gz" -C "$scratch" logs records || rc=$?
  fi
  echo "   archive: exit $rc (should be 0): results.tar.gz" | tee -a "$out/steps.log"
  if [ "$rc" -ne 0 ]; then
    failed+=("archive: exit $rc, should be 0")
  fi
}
archive

# $OUT against the device's limits: where it breaks one, nothing may come back.
files=$(find "$out" -type f | wc -l)
deep=$(find "$out" -mindepth 4 | wc -l)
named=$(find "$out" -mindepth 1 -name '*[!A-Za-z0-9._-]*' | wc -l)
large=$(find "$out" -type f -size +"$OUT_FILE_BYTES"c | wc -l)
if [ "$files" -gt "$OUT_FILES" ] || [ "$deep" -gt 0 ] || [ "$named" -gt 0 ] || [ "$large" -gt 0 ]; then
  failed+=("OUT: $files files (at most $OUT_FILES), $deep entries over 2 folders down, $named badly named, $large over 16 MiB")
fi

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" | tee -a "$out/steps.log"
  exit 1
fi
echo "all steps as expected; figures in $out/summary.txt" | tee -a "$out/steps.log"
