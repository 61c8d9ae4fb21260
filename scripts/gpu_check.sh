#!/usr/bin/env bash
# The device check, in one go, on the lent GPU machine (see the device tool): the GPU-marked
# tests and the GPU benchmarks of issue 12, about 8 minutes at most (each step has its own
# timeout), nothing installed from the network, everything written under $OUT (8 files: the
# device tool brings back no more), a short table printed last.
#
#   env.txt            date, card, driver, versions, RLIMIT_MEMLOCK, the shim build, step times
#   pytest.txt         pytest -m gpu on tests/gpu, plus the GPU layer's CPU tests on this machine,
#                      then the planned executor with its arena on the GPU (its own step)
#   gpu_alloc.json     allocate+free µs: our pool, stream-ordered pool, cudaMalloc, torch, CuPy,
#                      torch through our pluggable allocator
#   gpu_transfer.json  H2D/D2H GB/s, 1 MiB..1 GiB: pageable, mlock, registered, pinned, staged
#   gpu_managed.json   managed memory with and without prefetch, against device memory
#   gpu_replay.json    model allocation sequences: our GPU pool vs PyTorch's caching allocator
#   logs.txt           every step's stderr
#   summary.txt        the table printed last
#
# Usage there: bash scripts/gpu_check.sh   (from the repository root)
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
py=python3
logs="$OUT/logs.txt"
: > "$logs"

step() {  # step NAME SECONDS OUTFILE COMMAND...: run with a timeout, log stderr, time it
  local name=$1 limit=$2 out=$3; shift 3
  local began=$SECONDS
  echo "== $name (limit ${limit}s)"
  echo "== $name" >> "$logs"
  timeout "$limit" "$@" > "$out" 2>> "$logs"
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - began)) s" | tee -a "$OUT/env.txt"
}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c 'import sys, numpy as n, torch as t; print(sys.version.split()[0], t.__version__, n.__version__)'
  $py -c 'import cuda.bindings as b; print("cuda-bindings", b.__version__)' 2>&1 | tail -n 1
  $py -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -n 1
  $py -c 'import numba, numba.cuda; print("numba", numba.__version__)' 2>&1 | tail -n 1
  echo "RLIMIT_MEMLOCK: $(ulimit -l)  cpus: $(nproc)"
  # The PyTorch allocator shim: any C compiler builds it (no CUDA headers needed).
  shim=$($py -c 'from tensorarena.interop.torch_allocator import build_shim as b; print(b("/tmp/ta-shim"))' 2>&1 | tail -n 1)
  echo "torch allocator shim: $shim"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
[ -f /tmp/ta-shim/libtensorarena_torch_alloc.so ] && export TENSORARENA_TORCH_SHIM=/tmp/ta-shim/libtensorarena_torch_alloc.so

step "tests" 150 "$OUT/pytest.txt" $py -m pytest -q -rs -p no:cacheprovider \
  --ignore=tests/gpu/test_runtime_gpu.py tests/gpu \
  tests/test_streams.py tests/adaptors/test_stream_ordered.py \
  tests/memory/test_cuda_runtime.py tests/memory/test_cuda_memory.py \
  tests/memory/test_devices.py tests/memory/test_pinned_backends.py tests/memory/test_pinned.py \
  tests/test_resource_conformance.py \
  tests/interop/test_transfers.py tests/interop/test_gpu_hooks.py tests/test_gpu_benches.py
tail -n 15 "$OUT/pytest.txt"

# A tiny transformer planned on cuda:0, its arena one block of device_pool(0) (issue 8 on the
# GPU), and the device-selection tests over the fake runtime; appended to pytest.txt.
step "planned executor on the GPU" 40 /tmp/ta-runtime-gpu.txt $py -m pytest -q -rs \
  -p no:cacheprovider tests/gpu/test_runtime_gpu.py tests/runtime/test_arena_device.py
{ echo "== planned executor on the GPU"; cat /tmp/ta-runtime-gpu.txt; } >> "$OUT/pytest.txt"
tail -n 5 /tmp/ta-runtime-gpu.txt

step "allocation latency" 60 "$OUT/gpu_alloc.json" $py bench/gpu_alloc.py --json
step "copy bandwidth" 85 "$OUT/gpu_transfer.json" $py bench/gpu_transfer.py --json --repeats 5
step "managed memory" 50 "$OUT/gpu_managed.json" $py bench/gpu_managed.py --json
step "replay on GPU pools" 85 "$OUT/gpu_replay.json" \
  $py bench/gpu_replay.py --json --models gpt2,llama --size base

$py bench/gpu_summary.py "$OUT" > "$OUT/summary.txt" 2>> "$logs"
cat "$OUT/summary.txt"
