"""Put on PYTHONPATH by compat/examples/run_offline.py: swaps Keras's MNIST loader (which downloads)
for one that reads the offline data set named by HVDLITE_OFFLINE_MNIST_NPZ, in the same layout as
Keras's mnist.npz. It patches keras.src.datasets.mnist.load_data (and tf_keras's) right after that
module runs, so every public alias of it (tf.keras.datasets.mnist, keras.datasets.mnist) gets the
swapped loader.
Nothing else changes."""

import importlib.abc
import os
import sys

# Keras 3, and Keras 2 as the tf_keras package (TF_USE_LEGACY_KERAS=1).
_TARGETS = ("keras.src.datasets.mnist", "tf_keras.src.datasets.mnist")


def _load_data(path="mnist.npz"):
    import numpy as np

    with np.load(os.environ["HVDLITE_OFFLINE_MNIST_NPZ"]) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


class _PatchMnist(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    module.load_data = _load_data

                spec.loader.exec_module = exec_module
                return spec
        return None


if os.environ.get("HVDLITE_OFFLINE_MNIST_NPZ"):
    sys.meta_path.insert(0, _PatchMnist())
