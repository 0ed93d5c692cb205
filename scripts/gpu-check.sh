#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: install, run the gpu-marked tests and the example suite
# on CUDA, and print the figures. One script, so a short device lease is enough.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -m pip install -q -e ".[test]" 2>&1 | tail -n 3
python3 -m memtrack.cli doctor
python3 -m pytest -m gpu -v tests/test_gpu.py 2>&1 | tail -n 20
db=$(mktemp -d)/gpu.db
python3 -m memtrack.cli run --db "$db" --json "${OUT:-/tmp}/gpu-run.json"
python3 -m memtrack.cli show "$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['run_id'])" "${OUT:-/tmp}/gpu-run.json")" --db "$db"
