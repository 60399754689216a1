"""The TensorFlow examples run end to end under hvdliterun (short settings); the Keras ones and
the README tour under each Keras (the keras_env fixture: Keras 3, and Keras 2 with
TF_USE_LEGACY_KERAS=1), which the launched processes inherit."""

import os
import re
import sys

import pytest
from test_torch_examples import REPO, _launch, run_readme_tour


@pytest.fixture
def keras_environ(keras_env, monkeypatch):
    for key, value in keras_env.items():
        monkeypatch.setenv(key, value)


# The default suite trains the Keras example; the plain-TensorFlow one (its API is the README tour's) runs in CI.
@pytest.mark.parametrize(
    "script", ["tensorflow2_keras_digits.py", pytest.param("tensorflow2_digits.py", marks=pytest.mark.slow)]
)
def test_tensorflow_digits_learns(script, keras_environ):
    out = _launch(REPO / "examples" / script, "--epochs", "3")
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([0-9.]+) on 2 ranks", out).group(1))
    assert accuracy > 0.8, out
    assert "[1]<stdout>:" not in out  # only rank 0 prints


@pytest.mark.slow  # a benchmark's worker; tests/test_benchmarks_smoke.py smokes the suite by default
def test_e2e_tf_benchmark_row_runs():
    """benchmarks/e2e_tf.py's hvdlite row works (a smoke run; times are not judged)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import e2e_tf
    finally:
        sys.path.pop(0)
    result = e2e_tf.run_row("hvdlite", "mlp", 1, 0.0, rows=e2e_tf.ROWS, worker=e2e_tf.WORKER)
    assert result["median_s"] > 0 and result["params"] > 25_000_000, result


# Slow: the README tour is also checked by test_readme.py; ~9 s.
@pytest.mark.slow
def test_readme_tensorflow_tour_runs_on_two_ranks(tmp_path, keras_environ):
    run_readme_tour("## API tour (TensorFlow)", tmp_path)


@pytest.mark.slow  # (default suite's 5-minute budget: CI runs it)
def test_torch_and_tensorflow_in_one_process():
    """Both adapters import together (torch 2.13 and TensorFlow 2.21) and share one runtime."""
    import subprocess

    code = (
        "import torch, tensorflow as tf\n"
        "import hvdlite.torch as ht, hvdlite.tensorflow as hf\n"
        "hf.init()\n"
        "a = ht.allreduce(torch.ones(3), op=ht.Sum)\n"
        "b = hf.allreduce(tf.ones([3]), op=hf.Sum)\n"
        "assert a.tolist() == b.numpy().tolist() == [1.0] * 3\n"
        "print('ok', torch.__version__, tf.__version__)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert res.returncode == 0 and "ok 2.13" in res.stdout, res.stdout + res.stderr
