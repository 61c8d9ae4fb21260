#!/usr/bin/env bash
# The device check, in one go: runs on the lent GPU machine (see the device tool), installs nothing
# from the network, writes everything under $OUT. Usage there: bash scripts/gpu_check.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
py=python3
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)'
  echo "RLIMIT_MEMLOCK: $(ulimit -l)"; nproc
} 2>&1 | tee "$OUT/env.txt"

echo "== host-to-device bandwidth by host memory kind"
timeout 240 $py bench/gpu_transfer.py --sizes 64MiB,1GiB --repeats 10 2>&1 | tee "$OUT/gpu_transfer.txt"
timeout 120 $py bench/gpu_transfer.py --sizes 64MiB,1GiB --repeats 10 --json > "$OUT/gpu_transfer.json" 2>&1

echo "== activation memory: PyTorch's allocator on the GPU vs our static plan"
timeout 300 $py bench/gpu_model_memory.py --models gpt2,bert,llama,vit 2>"$OUT/gpu_model_memory.log" | tee "$OUT/gpu_model_memory.txt"
tail -n 3 "$OUT/gpu_model_memory.log"

echo "== test suite on the device machine (other Python/torch versions; CPU tests)"
timeout 300 $py -m pytest -q -x -p no:cacheprovider tests -m "not slow" 2>&1 | tail -n 25 | tee "$OUT/pytest.txt"
echo "== done"
