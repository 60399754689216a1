#!/usr/bin/env bash
# Builds a throwaway virtual environment with TorchRec for sparse_embeddings.py's TorchRec row
# (--torchrec-python DIR/bin/python). hvdlite's .venv/ is never touched.
#
#   benchmarks/_torchrec_env.sh [DIR]      default DIR: /work/venv-torchrec
#
# The pair that loads under this machine's torch 2.13.0+cpu is torchrec 1.8.0 with
# fbgemm-gpu-cpu 1.8.0. torchrec 1.9.2 with fbgemm-gpu-cpu 1.9.0 (built for a newer torch) fails
# to load its operator libraries (undefined torch::autograd symbols), and the only newer torch
# wheel reachable here (PyPI's 2.14.1) is a CUDA build (cuda-toolkit 13, nvidia-* wheels), which
# this CPU machine must not install. torchrec depends on `fbgemm-gpu` (the CUDA variant, which
# needs libtorch_cuda.so), so it is replaced by fbgemm-gpu-cpu, installed without dependencies.
# Exits non-zero unless `import torchrec` works at the end, with a CPU torch.
set -eu -o pipefail
DIR="${1:-/work/venv-torchrec}"
PYTHON="${PYTHON:-python3}"
WHEEL=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1 || true)
"$PYTHON" -m venv "$DIR"
"$DIR/bin/pip" install -q ${WHEEL:-torch==2.13.0+cpu} numpy
"$DIR/bin/pip" install -q "torch==2.13.0+cpu" torchrec==1.8.0
"$DIR/bin/pip" uninstall -y -q fbgemm-gpu fbgemm-gpu-cpu || true
"$DIR/bin/pip" install -q --no-deps fbgemm-gpu-cpu==1.8.0
"$DIR/bin/python" - <<'PY'
import torch, fbgemm_gpu, torchrec  # noqa: F401
assert "+cpu" in torch.__version__ and not torch.cuda.is_available(), torch.__version__
print("torchrec ready: torch", torch.__version__)
PY
