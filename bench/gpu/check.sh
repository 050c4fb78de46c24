#!/usr/bin/env bash
# The GPU check of Weft's CUDA backend, for a machine with one GPU (H200) and no network:
# configure and build with CUDA, run the `cuda` tests, train GPT-2-124M for 30 timed steps
# in bf16 with Weft and with PyTorch (torch.compile, bf16 autocast) on synthetic tokens,
# run a one-rank NCCL smoke test, print a table. Every part is time-boxed so the whole
# script ends within 8 minutes; a part that fails or times out is reported, not fatal.
#
#   bench/gpu/check.sh            # from anywhere; results under $OUT (or runs/gpu-check)
#   BATCH=8 STEPS=20 bench/gpu/check.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RESULTS=${OUT:-$ROOT/runs/gpu-check}
BUILD=${BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-16}
BATCH=${BATCH:-16}     # sequences of 1024 per step (both implementations)
STEPS=${STEPS:-30}     # timed steps, after 3 warm-up steps
PEAK=${PEAK_TFLOPS:-989}  # H200 dense bf16
BUDGET=${BUDGET_S:-470}   # seconds for the whole script (8 min, minus a margin)
mkdir -p "$RESULTS"
T0=$(date +%s)
declare -A STATUS

# Seconds left of the budget, capped at $1 (the part's own limit).
left() {
  local rest=$((BUDGET - ($(date +%s) - T0)))
  ((rest < 5)) && rest=5
  ((rest > $1)) && rest=$1
  echo "$rest"
}
# run NAME LIMIT [VAR=value ...] CMD...: runs CMD (through env, so it may start with
# variable settings) under timeout, logs to $RESULTS/NAME.log, records the status.
run() {
  local name=$1 limit=$2
  shift 2
  local t=$(left "$limit") s=$(date +%s)
  echo "== $name (limit ${t}s): $*"
  timeout --kill-after=10 "$t" env "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  local d=$(($(date +%s) - s))
  if ((rc == 0)); then STATUS[$name]="ok (${d}s)"
  elif ((rc == 124 || rc == 137)); then STATUS[$name]="TIMEOUT after ${d}s"
  else STATUS[$name]="FAILED rc=$rc (${d}s)"; fi
  echo "   ${STATUS[$name]}; log: $RESULTS/$name.log"
  tail -n 3 "$RESULTS/$name.log" | sed 's/^/   | /'
  return $rc
}

cd "$ROOT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } \
  | tee "$RESULTS/gpu.txt"

# 1. Configure and build only what the check runs (the CUDA library, its tests, the bench
#    driver, the NCCL test); ccache, when present, makes a rerun quick.
run configure 90 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DWEFT_BUILD_TESTS=ON -DWEFT_BUILD_BENCH=ON
targets="weft_core_cuda weft_cuda_tests weft_cuda_gpt2_bench"
grep -q "weft_comm_nccl_tests" "$BUILD/build.ninja" 2>/dev/null && targets="$targets weft_comm_nccl_tests"
run build 240 ninja -C "$BUILD" -j"$JOBS" $targets

# 2. The CUDA tests: kernels against the CPU reference, training steps against the CPU
#    trainer (gtest binary directly: no dependence on CTest discovery).
run cuda_tests 90 "$BUILD/tests/cuda/weft_cuda_tests" --gtest_color=no

# 3. GPT-2-124M with Weft; on a failure fast enough to retry (e.g. out of memory), once
#    more with half the batch.
if ! run weft_gpt2 120 "$BUILD/bench/gpu/weft_cuda_gpt2_bench" --batch "$BATCH" --steps "$STEPS" \
    --warmup 3 --peak-tflops "$PEAK" --json "$RESULTS/weft.json"; then
  if [[ ${STATUS[weft_gpt2]} == "FAILED rc=1"* ]] && (($(left 999) > 150)); then
    run weft_gpt2_half 90 "$BUILD/bench/gpu/weft_cuda_gpt2_bench" --batch $((BATCH / 2)) \
      --steps "$STEPS" --warmup 3 --peak-tflops "$PEAK" --json "$RESULTS/weft.json"
  fi
fi

# 4. The same model in PyTorch (torch.compile; eager if compiling fails).
if ! run torch_gpt2 150 python3 bench/gpu/torch_gpt2.py --batch "$BATCH" --steps "$STEPS" \
    --warmup 3 --peak-tflops "$PEAK" --json "$RESULTS/torch.json"; then
  (($(left 999) > 60)) && run torch_gpt2_eager 90 python3 bench/gpu/torch_gpt2.py --no-compile \
    --batch "$BATCH" --steps "$STEPS" --warmup 3 --peak-tflops "$PEAK" --json "$RESULTS/torch.json"
fi

# 4b. Weft with the fused flash-attention kernel instead of cuBLASLt attention (fewer
#     steps; informational), when the budget allows.
if (($(left 999) > 150)); then
  run weft_gpt2_flash 75 WEFT_CUDA_ATTENTION=flash "$BUILD/bench/gpu/weft_cuda_gpt2_bench" \
    --batch "$BATCH" --steps 10 --warmup 2 --peak-tflops "$PEAK" --json "$RESULTS/weft_flash.json"
fi

# 5. One-rank NCCL smoke test (every collective in a world of one).
if [[ -x "$BUILD/tests/comm/weft_comm_nccl_tests" ]]; then
  run nccl_smoke 40 "$BUILD/tests/comm/weft_comm_nccl_tests" --gtest_color=no
else
  STATUS[nccl_smoke]="not built (NCCL not found at configure time)"
fi

# 6. The table.
python3 - "$RESULTS" "$((($(date +%s) - T0)))" <<'PY' | tee "$RESULTS/summary.txt"
import json, os, re, sys
res, secs = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        with open(os.path.join(res, name)) as f:
            return json.load(f)
    except Exception:
        return None
def tests(log):
    try:
        text = open(os.path.join(res, log)).read()
    except Exception:
        return "no log"
    p = re.search(r"\[  PASSED  \] (\d+) test", text)
    f = re.search(r"(\d+) FAILED TEST", text)
    s = re.search(r"\[  SKIPPED \] (\d+) test", text)
    return f"{p.group(1) if p else 0} passed, {f.group(1) if f else 0} failed, {s.group(1) if s else 0} skipped"
w, t, wf = load("weft.json"), load("torch.json"), load("weft_flash.json")
gpu = open(os.path.join(res, "gpu.txt")).read().strip() if os.path.exists(os.path.join(res, "gpu.txt")) else "?"
print(f"GPU: {gpu}")
print(f"GPT-2-124M (12 layers, dim 768, 12 heads, seq 1024, vocab 50304), bf16, synthetic tokens")
print(f"{'':22}{'tokens/s':>12}{'MFU':>8}{'ms/step':>10}{'batch':>7}")
for name, r in (("weft (cuBLASLt attn)", w), ("weft (flash kernel)", wf),
                ("pytorch" + (" (compile)" if t and t.get("compile") else " (eager)"), t)):
    if r:
        print(f"{name:22}{r['tokens_per_s']:12.0f}{100 * r['mfu']:7.1f}%{r['ms_per_step']:10.1f}{r['batch']:7d}")
    else:
        print(f"{name:22}{'(no result)':>12}")
ratio = w["tokens_per_s"] / t["tokens_per_s"] if w and t and w["batch"] == t["batch"] else None
print(f"weft / pytorch tokens/s: {ratio:.2f}" if ratio else "weft / pytorch tokens/s: n/a (a run missing or batches differ)")
print(f"cuda tests: {tests('cuda_tests.log')}")
print(f"nccl smoke: {tests('nccl_smoke.log')}")
print(f"total time: {secs}s")
json.dump({"weft": w, "weft_flash": wf, "torch": t, "ratio": ratio, "gpu": gpu, "seconds": secs,
           "cuda_tests": tests("cuda_tests.log"), "nccl_smoke": tests("nccl_smoke.log")},
          open(os.path.join(res, "summary.json"), "w"), indent=1)
PY
echo "parts:"
for k in configure build cuda_tests weft_gpt2 weft_gpt2_half torch_gpt2 torch_gpt2_eager \
  weft_gpt2_flash nccl_smoke; do
  [[ -n ${STATUS[$k]+x} ]] && printf '  %-18s %s\n' "$k" "${STATUS[$k]}"
done
echo "results: $RESULTS"
