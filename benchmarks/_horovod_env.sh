#!/usr/bin/env bash
# Builds Horovod 0.28.1 (gloo controller and PyTorch only: no MPI, TensorFlow or MXNet) into its
# own virtual environment, .venv-horovod/ at the repository root (git-ignored), for the
# benchmarks' Horovod peer. hvdlite's .venv/ is never touched.
#
#   benchmarks/_horovod_env.sh           build once; later calls return at once (cached)
#   benchmarks/_horovod_env.sh --retry   build again after a failed attempt
#
# Contract:
#   - exit 0 and .venv-horovod/.ok exists  <=>  `.venv-horovod/bin/python -c "import horovod.torch"`
#     worked at the end of the build;
#   - on failure: exit 1, .venv-horovod/.failed holds a one-line reason plus the log's tail, and
#     later calls fail at once with that reason (no hour-long rebuild on every `make bench`)
#     until --retry;
#   - the full log is .venv-horovod.log; the build uses HOROVOD_BUILD_JOBS (default 2) jobs;
#   - concurrent calls are serialised with flock on .venv-horovod.lock.
#
# Why patching: Horovod 0.28.1's sdist asks CMake for C++14, and torch 2.13's headers need C++17
# (the two `CMAKE_CXX_STANDARD 14` lines: the top-level and horovod/torch/CMakeLists.txt);
# CMAKE_POLICY_VERSION_MINIMUM=3.5 lets CMake >= 4 accept its old cmake_minimum_required.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="$ROOT/.venv-horovod"
LOG="$ROOT/.venv-horovod.log"
VERSION=0.28.1
TORCH_PIN=torch==2.13.0   # the CPU build on this machine's disk, as in requirements-dev.txt
PYTHON="${PYTHON:-python3}"
JOBS="${HOROVOD_BUILD_JOBS:-2}"

# One build at a time (a second caller waits, then finds the first one's result).
exec 9> "$ROOT/.venv-horovod.lock"
flock 9
if [ -f "$ENV_DIR/.ok" ]; then exit 0; fi
if [ -f "$ENV_DIR/.failed" ] && [ "${1:-}" != "--retry" ]; then
  echo "Horovod: an earlier build failed (benchmarks/_horovod_env.sh --retry builds again):" >&2
  head -1 "$ENV_DIR/.failed" >&2
  exit 1
fi

fail() {   # fail REASON: records the reason and the log's tail, exits 1
  mkdir -p "$ENV_DIR"
  { echo "$1 (log: $LOG)"; tail -30 "$LOG" 2>/dev/null; } > "$ENV_DIR/.failed"
  echo "Horovod build failed: $1 (log: $LOG)" >&2
  exit 1
}

rm -rf "$ENV_DIR"
mkdir -p "$ENV_DIR"
: > "$LOG"
start=$(date +%s)
echo "Building Horovod $VERSION into $ENV_DIR (log: $LOG); this takes long on 2 cores" >&2

{
  "$PYTHON" -m venv "$ENV_DIR" &&
  "$ENV_DIR/bin/python" -m pip install "$TORCH_PIN" numpy setuptools wheel cffi \
      cloudpickle psutil pyyaml packaging
} >> "$LOG" 2>&1 || fail "could not create the venv or install torch and Horovod's dependencies"

SRC="$ENV_DIR/src"
mkdir -p "$SRC"
"$ENV_DIR/bin/python" -m pip download --no-deps --no-binary :all: "horovod==$VERSION" -d "$SRC" \
    >> "$LOG" 2>&1 || fail "could not download the horovod $VERSION sdist from PyPI"
tar -xzf "$SRC/horovod-$VERSION.tar.gz" -C "$SRC" >> "$LOG" 2>&1 || fail "could not unpack the sdist"
TREE="$SRC/horovod-$VERSION"

for f in "$TREE/CMakeLists.txt" "$TREE/horovod/torch/CMakeLists.txt"; do
  grep -q 'CMAKE_CXX_STANDARD 14' "$f" || fail "no CMAKE_CXX_STANDARD 14 line in $f to patch"
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
done

# MAKEFLAGS set => Horovod's setup.py drops its own -j8 and make uses these jobs.
( cd "$TREE" &&
  env HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1 \
      HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$JOBS" \
      "$ENV_DIR/bin/python" -m pip install -v --no-build-isolation --no-deps . ) \
    >> "$LOG" 2>&1 || fail "pip install of the patched horovod $VERSION sdist failed"

"$ENV_DIR/bin/python" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'gloo not built'" \
    >> "$LOG" 2>&1 || fail "horovod installed but 'import horovod.torch' (with gloo) fails"

rm -rf "$TREE"   # keep the sdist, drop the build tree (hundreds of MB)
elapsed=$(( $(date +%s) - start ))
echo "built in ${elapsed} s" > "$ENV_DIR/.ok"
echo "Horovod $VERSION built in ${elapsed} s" | tee -a "$LOG" >&2
