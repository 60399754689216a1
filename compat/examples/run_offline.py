"""Runs Horovod's own example scripts, unchanged, through hvdlite's Horovod compatibility namespace
(`horovod` -> hvdlite, `horovodrun` -> hvdliterun), on data reachable offline.

    git clone https://github.com/horovod/horovod /tmp/horovod      # or any checkout of it
    python compat/examples/run_offline.py /tmp/horovod/examples [--np 2] [--time-limit 240] [NAME ...]

Horovod's scripts are read from the path given, never copied into this repository. Each runs as
`horovodrun -np N python SCRIPT ARGS` in a fresh working directory, with arguments that only
shorten it (epochs, batches, batch size) where the script has them. Only dataset loaders that
download are swapped: a synthetic MNIST (same shapes, dtypes and file formats, a learnable pattern
per class) is written in torchvision's on-disk layout and in Keras's mnist.npz layout, and
standins/sitecustomize.py points Keras's mnist.load_data at it. Where torchvision is not installed,
standins/torchvision provides the names the PyTorch scripts use (datasets.MNIST reading those
files, transforms, models.resnet50). The `horovod` package comes from an installed
hvdlite-horovod-compat, or else from compat/src.

Horovod 0.28's TensorFlow examples are written for Keras 2 (`opt.variables()`,
`compile(experimental_run_tf_function=...)`); with Keras 3 they fail in their own code. With
--legacy-keras they run on tf_keras (Keras 2 for TensorFlow 2.16+), as `TF_USE_LEGACY_KERAS=1`.

A script passes when it exits 0; one that runs longer than --time-limit is stopped and reported
with the number of output lines it produced by then. Exit code: 0 when every script passed or was
only stopped at the time limit, 1 when one failed. --json FILE also writes the results.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# name -> (script under examples/, arguments that only shorten the run; DATA is the data directory).
# NPROC in the arguments: the script starts its ranks itself (horovod.run) and runs without horovodrun.
EXAMPLES = {
    "pytorch_mnist": (
        "pytorch/pytorch_mnist.py",
        ["--epochs", "1", "--no-cuda", "--log-interval", "2", "--data-dir", "DATA"],
    ),
    "pytorch_mnist_horovod_run": (
        "pytorch/pytorch_mnist.py",
        ["--epochs", "1", "--no-cuda", "--log-interval", "2", "--data-dir", "DATA"]
        + ["--num-proc", "NPROC", "--communication", "gloo"],
    ),
    "pytorch_synthetic_benchmark": (
        "pytorch/pytorch_synthetic_benchmark.py",
        ["--no-cuda", "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1"]
        + ["--num-iters", "2"],
    ),
    "tensorflow2_synthetic_benchmark": (
        "tensorflow2/tensorflow2_synthetic_benchmark.py",
        ["--no-cuda", "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1"]
        + ["--num-iters", "2"],
    ),
    "tensorflow2_keras_synthetic_benchmark": (
        "tensorflow2/tensorflow2_keras_synthetic_benchmark.py",
        ["--no-cuda", "--batch-size", "2", "--num-batches-per-iter", "1", "--num-iters", "2"],
    ),
    "tensorflow2_mnist": ("tensorflow2/tensorflow2_mnist.py", []),
    "tensorflow2_keras_mnist": ("tensorflow2/tensorflow2_keras_mnist.py", []),
    "keras_mnist": ("keras/keras_mnist.py", []),
    "keras_mnist_advanced": ("keras/keras_mnist_advanced.py", ["--epochs", "1"]),
    "tensorflow_keras_mnist": ("tensorflow/tensorflow_keras_mnist.py", []),
}


def synthetic_mnist(n_train=1024, n_test=256, seed=0):
    """MNIST-shaped data (28x28 uint8 images, uint8 labels 0-9): noise plus a brighter 6x6 square
    whose place depends on the label (jittered by up to 2 pixels), so a model can learn it."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (n_train, n_test):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 128, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            r, c = 3 + 12 * (label // 5) + rng.integers(-2, 3), 2 + 5 * (label % 5) + rng.integers(-1, 2)
            images[i, max(r, 0) : r + 6, max(c, 0) : c + 6] = rng.integers(128, 256)
        out += [images, labels]
    return out


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.tobytes())


def write_data(root):
    """Writes the synthetic MNIST as torchvision's ROOT/MNIST/raw IDX files and as a Keras
    mnist.npz; returns the npz path."""
    x_train, y_train, x_test, y_test = synthetic_mnist()
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name, array in [
        ("train-images-idx3-ubyte", x_train),
        ("train-labels-idx1-ubyte", y_train),
        ("t10k-images-idx3-ubyte", x_test),
        ("t10k-labels-idx1-ubyte", y_test),
    ]:
        _write_idx(raw / name, array)
    npz = root / "mnist.npz"
    np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return npz


def _importable(module, env):
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(%r) is None)" % module
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


def job_env(data_npz, legacy_keras=None):
    """The environment of every run: stand-ins first, then the directory holding tf_keras (with
    --legacy-keras DIR), then the compat source unless an installed hvdlite-horovod-compat provides
    `horovod`, then this checkout (hvdlite)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "HVDLITE_OFFLINE_MNIST_NPZ": str(data_npz)})
    path = [str(REPO)]
    if not _importable("horovod", dict(env, PYTHONPATH=os.pathsep.join(path))):
        path.insert(0, str(REPO / "compat" / "src"))
    if legacy_keras is not None:
        env["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is then tf_keras (Keras 2), as Horovod 0.28 expects
        if legacy_keras:
            path.insert(0, legacy_keras)
    path.insert(0, str(HERE / "standins"))  # sitecustomize.py (always) and torchvision (if missing)
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def run_one(script, args, np_, env, workdir, time_limit):
    """Runs one example under horovodrun; returns a result dict."""
    launcher = [] if "--num-proc" in args else ["horovodrun", "-np", str(np_)]
    cmd = [sys.executable, str(script), *args]
    if launcher:
        cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np_), *cmd]
    start = time.monotonic()
    log = workdir / "output.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=time_limit)
            status = "passed" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            proc.terminate()  # hvdliterun stops its ranks on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc, status = None, "stopped at time limit"
    text = log.read_text(errors="replace")
    lines = text.splitlines()
    errors = [ln for ln in lines if "Error" in ln and ":" in ln]
    stdout = [ln for ln in lines if "<stdout>:" in ln and ln.split("<stdout>:", 1)[1].strip()]
    return {
        "status": status,
        "rc": rc,
        "seconds": round(time.monotonic() - start, 1),
        "output_lines": len(lines),
        "last_error": errors[-1] if errors else None,
        "last_output": stdout[-1] if stdout else None,
        "log": str(log),
        "command": " ".join([*launcher, "python", str(script), *args]),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("examples_dir", type=Path, help="Horovod's examples/ directory")
    p.add_argument("names", nargs="*", help="which examples (default: all of %s)" % ", ".join(EXAMPLES))
    p.add_argument("--np", type=int, default=2, help="ranks per example (default 2)")
    p.add_argument("--time-limit", type=float, default=240.0, help="seconds per example (default 240)")
    p.add_argument(
        "--workdir", type=Path, help="keep working directories and logs here (default: a temp dir)"
    )
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument(
        "--legacy-keras",
        nargs="?",
        const="",
        metavar="DIR",
        help="run TensorFlow with Keras 2 (TF_USE_LEGACY_KERAS=1), the Keras Horovod 0.28's examples are written "
        "for; tf_keras must be importable, or installed in DIR (pip install --target DIR tf_keras~=2.21.0)",
    )
    args = p.parse_args(argv)
    names = args.names or list(EXAMPLES)
    unknown = sorted(set(names) - set(EXAMPLES))
    if unknown:
        p.error("unknown example(s) %s; known: %s" % (", ".join(unknown), ", ".join(EXAMPLES)))

    root = args.workdir or Path(tempfile.mkdtemp(prefix="hvdlite-horovod-examples-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    npz = data / "mnist.npz" if data.exists() else write_data(data)
    env = job_env(npz, args.legacy_keras)
    if _importable("torchvision", dict(env, PYTHONPATH=str(REPO))):
        print("torchvision is installed: the stand-in is not used", flush=True)
    results = {}
    for name in names:
        rel, extra = EXAMPLES[name]
        script = args.examples_dir / rel
        if not script.is_file():
            results[name] = {"status": "missing", "command": str(script)}
            continue
        workdir = root / name
        workdir.mkdir(exist_ok=True)
        shortened = [{"DATA": str(data), "NPROC": str(args.np)}.get(a, a) for a in extra]
        print("== %s: %s" % (name, rel), flush=True)
        results[name] = run_one(script, shortened, args.np, env, workdir, args.time_limit)
        r = results[name]
        last = r["last_error"] if r["status"] == "failed" else r["last_output"]
        print(
            "   %s in %ss (%d output lines)%s"
            % (
                r["status"],
                r["seconds"],
                r["output_lines"],
                "; " + last if last else "",
            ),
            flush=True,
        )
    print("\nlogs under %s" % root)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
