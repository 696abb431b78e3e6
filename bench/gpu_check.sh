#!/usr/bin/env bash
# One GPU check, for a task lent an NVIDIA machine (written for one H200). Uses only what the
# project ships; downloads nothing. In under 8 minutes it:
#   1. runs the CUDA-marked tests (tests marked `cuda`);
#   2. runs bench/substrate_bench.py --device cuda: HKVR save/restore vs a plain copy with pinned
#      host memory, and D2D vs partial vs H2D switch of a model of a few GiB (the paper's Table 2
#      puts full D2D at about 0.06 of H2D);
#   3. runs one real-mode replay (Talaria only) with the torch engine on CUDA device 0;
# and writes each step's log plus summary.txt to $OUT, or to the folder given as $1.
#
# Usage: bench/gpu_check.sh [OUT_DIR]      (PYTHON=... to pick the interpreter)
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
summary="$out/summary.txt"
: > "$summary"
started=$(date +%s)

step() {  # step NAME SECONDS CMD...: run with a time bound, log to NAME.log, one summary line
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf '%-10s rc=%-3s %4ss  (%s)\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$*" | tee -a "$summary"
  return $rc
}

{
  echo "gpu_check $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$summary"

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device visible to $py: nothing to check" | tee -a "$summary"
  exit 2
fi

step cuda-tests 240 "$py" -m pytest -q -m cuda -p no:cacheprovider tests
step substrate 120 "$py" bench/substrate_bench.py --device cuda --model-gb 4 --kv-mb 2048 --repeat 3 --threads 0
step replay 150 "$py" bench/e2e_replay.py --configs Talaria --device-ids 0 --sessions 6 --max-calls 8 \
  --timeout 120 --ready-timeout 90

{
  echo "--- cuda-tests"; tail -n 3 "$out/cuda-tests.log"
  echo "--- substrate"; grep -E "HKVR|save|restore|Switch|d2d|partial|h2d" "$out/substrate.log"
  echo "--- replay"; grep -E "SCT|error|unfinished|wall clock|talariad up" "$out/replay.log"
  echo "total $(( $(date +%s) - started )) s"
} >> "$summary"
cat "$summary"
