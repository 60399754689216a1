"""The TensorFlow examples run end to end under hvdliterun (short settings)."""
import re

import pytest

from test_torch_examples import REPO, _launch


@pytest.mark.parametrize("script", ["tensorflow2_keras_digits.py", "tensorflow2_digits.py"])
def test_tensorflow_digits_learns(script):
    out = _launch(REPO / "examples" / script, "--epochs", "3")
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([0-9.]+) on 2 ranks", out).group(1))
    assert accuracy > 0.8, out
    assert "[1]<stdout>:" not in out   # only rank 0 prints
