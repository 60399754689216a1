#!/bin/bash
# The GPU check, for a machine with a CUDA GPU (run from the repo root):
#   bash tests/gpu_check.sh [OUT_DIR]
# builds hvdlite in place with its NCCL module required (HVDLITE_WITH_CUDA=1), runs the tests
# that need a GPU (test_gpu, test_nccl_setup, test_torch_cuda, test_torch_cuda_p2p, test_torch_backend_cuda,
# test_sparse_cuda), then the one-rank benchmark
# against torch.distributed's NCCL. PYTHON picks the interpreter (default: python3, which on the
# GPU machines is the one with a CUDA torch). Logs and the benchmark table go to OUT_DIR.
set -o pipefail
out=${1:-benchmarks/results}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
HVDLITE_WITH_CUDA=1 HVDLITE_BUILD_JOBS=${HVDLITE_BUILD_JOBS:-8} "$py" setup.py -q build_ext --inplace \
  > "$out/gpu_build.log" 2>&1 || { tail -40 "$out/gpu_build.log"; exit 1; }
timeout 600 "$py" -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_nccl_setup.py \
  tests/test_torch_cuda.py tests/test_torch_cuda_p2p.py tests/test_sparse_cuda.py tests/test_torch_backend_cuda.py 2>&1 | tee "$out/gpu_tests.log" | tail -30
tests_rc=$?
timeout 300 "$py" benchmarks/gpu_one_rank.py --reps 100 --out "$out/gpu_one_rank.md"
exit $tests_rc
