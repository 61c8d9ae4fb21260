#!/usr/bin/env bash
# The device check, in one go, on the lent GPU machine (see the device tool): the compiled build
# made in place, the GPU-marked tests, the GPU layer's tests on the CUDA simulator, and the GPU
# benchmarks of issue 12, under 6 minutes in all (each step has its own limit, cut to what is
# left of the whole), so a rerun fits in 15 minutes of device time. Nothing is installed from
# the network; everything is written under $OUT (8 files: the device tool brings back no more).
#
#   env.txt            date, card, driver, versions, RLIMIT_MEMLOCK, the shim, the build, and one
#                      "step:" line per step (its own pass/fail counts, exit status, seconds)
#   pytest.txt         pytest -m gpu on tests/gpu and the GPU layer's simulator tests, then the
#                      planned executor with its arena on the GPU (its own step)
#   gpu_alloc.json     allocate+free µs: our pool, stream-ordered pool, cudaMalloc, torch, CuPy,
#                      torch through our pluggable allocator (a MemPool)
#   gpu_transfer.json  H2D/D2H GB/s, 1 MiB..1 GiB: pageable, mlock, registered, pinned, staged
#   gpu_managed.json   managed memory with and without prefetch, against device memory
#   gpu_replay.json    model allocation sequences: our GPU pool vs PyTorch's caching allocator
#   logs.txt           every step's stderr
#   summary.txt        the table printed last: one line per step, then the headline figures
#
# Every JSON record carries "build" (compiled or pure: what actually ran). Without a GPU (a dry
# run: OUT=$(mktemp -d) bash scripts/gpu_check.sh) the build is skipped, the tests run on the
# simulator, the benchmarks say "skipped", and the summary still prints.
#
# Usage there: bash scripts/gpu_check.sh   (from the repository root)
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
logs="$OUT/logs.txt"
: > "$logs"
BUDGET=${GPU_CHECK_SECONDS:-350}  # the whole run; each step gets at most what is left
gpu=0
nvidia-smi -L > /dev/null 2>&1 && gpu=1

counts() {  # counts FILE: the pytest tallies of one step's own output, or the bench's outcome
  local file=$1
  case "$file" in
    *.json)
      if grep -q '^{' "$file" 2>/dev/null; then echo "ok"
      else head -n 1 "$file" 2>/dev/null | grep -E '^skipped' || echo "failed (no record)"; fi ;;
    *)
      grep -E '[0-9]+ (passed|failed|skipped|error)' "$file" 2>/dev/null | tail -n 1 \
        | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//' | grep . || echo "no tests ran" ;;
  esac
}

with_build() {  # with_build FILE: add "build" to every JSON record in FILE
  $py - "$1" "$build" <<'PY' 2>> "$logs"
import json, sys
path, build = sys.argv[1], sys.argv[2]
lines = open(path).read().splitlines()
out = [json.dumps({**json.loads(l), "build": build}) if l.startswith("{") else l for l in lines]
open(path, "w").write("\n".join(out) + ("\n" if out else ""))
PY
}

step() {  # step NAME SECONDS OUTFILE COMMAND...: run with a timeout, log stderr, tally, time it
  local name=$1 limit=$2 out=$3; shift 3
  local left=$((BUDGET - SECONDS)) began=$SECONDS
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "skipped: out of time" > "$out"
    echo "step: $name  skipped: out of time" | tee -a "$OUT/env.txt"
    return
  fi
  echo "== $name (limit ${limit}s)"
  echo "== $name" >> "$logs"
  timeout "$limit" "$@" > "$out" 2>> "$logs"
  local rc=$?
  [[ "$out" == *.json ]] && with_build "$out"
  echo "step: $name  $(counts "$out")  (exit $rc, $((SECONDS - began)) s)" | tee -a "$OUT/env.txt"
}

# The compiled build, made in place first (the GPU machine has a C compiler): the benchmarks
# must measure what users run. Skipped without a GPU, so a dry run leaves no extension behind.
build_began=$SECONDS
if [ "$gpu" = 1 ]; then
  echo "== build in place (limit 100s)"
  timeout 100 $py setup.py -q build_ext --inplace > /dev/null 2>> "$logs"
  build_rc=$?
else
  build_rc="skipped: no GPU"
fi
build=$($py -c 'from tensorarena._version import build; print(build())' 2>> "$logs" || echo unknown)

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1
  $py -c 'import sys, numpy as n, torch as t; print(sys.version.split()[0], t.__version__, n.__version__)' 2>&1 | tail -n 1
  $py -c 'import cuda.bindings as b; print("cuda-bindings", b.__version__)' 2>&1 | tail -n 1
  $py -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -n 1
  $py -c 'import numba, numba.cuda; print("numba", numba.__version__)' 2>&1 | tail -n 1
  echo "RLIMIT_MEMLOCK: $(ulimit -l)  cpus: $(nproc)"
  # The PyTorch allocator shim: any C compiler builds it (no CUDA headers needed).
  shim=$($py -c 'from tensorarena.interop.torch_allocator import build_shim as b; print(b("/tmp/ta-shim"))' 2>&1 | tail -n 1)
  echo "torch allocator shim: $shim"
  echo "step: build  $build (build_ext: ${build_rc})  ($((SECONDS - build_began)) s)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
[ -f /tmp/ta-shim/libtensorarena_torch_alloc.so ] && export TENSORARENA_TORCH_SHIM=/tmp/ta-shim/libtensorarena_torch_alloc.so

step "tests" 100 "$OUT/pytest.txt" $py -m pytest -q -rs -p no:cacheprovider \
  --ignore=tests/gpu/test_runtime_gpu.py tests/gpu tests/testing \
  tests/test_streams.py tests/adaptors/test_stream_ordered.py \
  tests/memory/test_cuda_runtime.py tests/memory/test_cuda_memory.py \
  tests/memory/test_devices.py tests/memory/test_pinned_backends.py \
  tests/test_resource_conformance.py tests/interop/test_transfers.py \
  tests/interop/test_gpu_hooks.py tests/interop/test_gpu_hooks_simulated.py tests/test_gpu_benches.py
tail -n 5 "$OUT/pytest.txt"

# A tiny transformer planned on cuda:0, its arena one block of the device's stream-ordered pool
# (issue 8 on the GPU), and the device-selection tests on the simulator; appended to pytest.txt.
step "planned executor on the GPU" 40 /tmp/ta-runtime-gpu.txt $py -m pytest -q -rs \
  -p no:cacheprovider tests/gpu/test_runtime_gpu.py tests/runtime/test_arena_device.py
{ echo "== planned executor on the GPU"; cat /tmp/ta-runtime-gpu.txt; } >> "$OUT/pytest.txt"

step "allocation latency" 45 "$OUT/gpu_alloc.json" $py bench/gpu_alloc.py --json
step "copy bandwidth" 55 "$OUT/gpu_transfer.json" $py bench/gpu_transfer.py --json --repeats 3
step "managed memory" 35 "$OUT/gpu_managed.json" $py bench/gpu_managed.py --json
step "replay on GPU pools" 50 "$OUT/gpu_replay.json" \
  $py bench/gpu_replay.py --json --models gpt2,llama --size base

$py bench/gpu_summary.py "$OUT" > "$OUT/summary.txt" 2>> "$logs"
cat "$OUT/summary.txt"
echo "gpu_check: $((SECONDS)) s in all"
