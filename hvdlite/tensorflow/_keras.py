"""The one place that decides which Keras hvdlite.tensorflow works with: the Keras that
``tf.keras`` is in this process.

TensorFlow 2.16+ makes ``tf.keras`` Keras 3 (the ``keras`` package), unless the environment
variable TF_USE_LEGACY_KERAS is "1", "true" or "True" when TensorFlow resolves tf.keras: then it
is Keras 2, the ``tf_keras`` package. The test below is TensorFlow's own
(tensorflow/python/util/lazy_loader.py), so hvdlite's choice and tf.keras always agree. The
variable must be set before the first use of tf.keras; it is read once, at the first get().

Every hvdlite module that needs Keras asks get() (or the helpers here) instead of importing
``keras``; the other modules hold no Keras-version test of their own beyond is_keras3().
hvdlite.tensorflow itself imports without Keras: only hvdlite.tensorflow.keras and the Keras
paths of DistributedOptimizer call get().
"""

import functools
import os
from types import ModuleType
from typing import Any

from hvdlite.common import exceptions

LEGACY_VARIABLE = "TF_USE_LEGACY_KERAS"
_PACKAGES = ("keras", "tf_keras")  # top-level package of Keras 3 / of Keras 2 (tf_keras)


def legacy_requested() -> bool:
    """True when TF_USE_LEGACY_KERAS asks TensorFlow for Keras 2 (tf_keras)."""
    return os.environ.get(LEGACY_VARIABLE) in ("true", "True", "1")


@functools.lru_cache(maxsize=1)
def get() -> ModuleType:
    """The active Keras module: ``tf_keras`` under TF_USE_LEGACY_KERAS, else ``keras`` (3.x).
    Raises PreconditionError (saying the fix) when the variable is set and tf_keras is missing."""
    if legacy_requested():
        try:
            import tf_keras
        except ImportError as e:
            raise exceptions.PreconditionError(
                "%s=%s asks TensorFlow for Keras 2 (the tf_keras package), but tf_keras is not "
                "installed. Install it with `pip install --no-deps tf-keras==<your TensorFlow "
                "version>` (`make install` does), or unset %s to use Keras 3"
                % (LEGACY_VARIABLE, os.environ[LEGACY_VARIABLE], LEGACY_VARIABLE)
            ) from e
        module: ModuleType = tf_keras
        return module
    import keras

    module = keras
    return module


def is_keras3() -> bool:
    return get().__name__ == "keras"


def describe() -> str:
    """'Keras 3 (keras 3.x.y)' or 'Keras 2 (tf_keras 2.x.y, TF_USE_LEGACY_KERAS=1)'."""
    k = get()
    if is_keras3():
        return "Keras 3 (keras %s)" % k.__version__
    return "Keras 2 (tf_keras %s, %s=%s)" % (k.__version__, LEGACY_VARIABLE, os.environ[LEGACY_VARIABLE])


def package_of(obj: Any) -> str | None:
    """'keras' or 'tf_keras': the Keras package that defines obj's class or one of its bases;
    None for an object of neither (a tf.compat.v1 optimizer, a plain object)."""
    for cls in type(obj).__mro__:
        top = (getattr(cls, "__module__", None) or "").split(".")[0]
        if top in _PACKAGES:
            return top
    return None


def check_same_keras(obj: Any, what: str) -> None:
    """Raises InvalidArgumentError, naming the active Keras and the fix, when `obj` (`what`:
    'the model', 'the optimizer') comes from the other Keras package than tf.keras."""
    package = package_of(obj)
    if package is None or package == get().__name__:
        return
    if package == "keras":
        other = "Keras 3 (the keras package)"
        fix = "build it with tf.keras / tf_keras, or unset %s to use Keras 3" % LEGACY_VARIABLE
    else:
        other = "Keras 2 (the tf_keras package)"
        fix = "build it with tf.keras / keras, or set %s=1 before TensorFlow is imported to use Keras 2" % (
            LEGACY_VARIABLE
        )
    raise exceptions.InvalidArgumentError(
        "%s (%s) is a %s object, but hvdlite.tensorflow.keras and tf.keras use %s in this process: %s"
        % (what, type(obj).__name__, other, describe(), fix)
    )


def optimizer_classes() -> tuple[type, ...]:
    """Base classes of the active Keras's optimizers: Keras 3's Optimizer; Keras 2's Optimizer
    (tf_keras.optimizers.Optimizer) and its legacy OptimizerV2 (tf_keras.optimizers.legacy)."""
    k = get()
    if is_keras3():
        return (k.optimizers.Optimizer,)
    return (k.optimizers.Optimizer, k.optimizers.legacy.Optimizer)


def is_keras_optimizer(obj: Any) -> bool:
    """True for an optimizer of either Keras package (the other one's is refused later by
    check_same_keras, with the fix); never imports Keras for other objects."""
    if package_of(obj) is None:
        return False
    check_same_keras(obj, "the optimizer")
    return isinstance(obj, optimizer_classes())


def optimizer_variables(optimizer: Any) -> list[Any]:
    """optimizer.variables: a property in Keras 3 and Keras 2's Optimizer, a method in OptimizerV2."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, variables: Any) -> None:
    """Creates the optimizer's own variables (slots, iterations) for `variables` now, as its
    first step would (idempotent): a new elastic worker then holds the same variables as the
    ranks that trained, and no variable is created inside a tf.cond later. No-op for a
    non-Keras optimizer."""
    if package_of(optimizer) is None:
        return
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2 OptimizerV2
        optimizer._create_all_weights(variables)
    elif not getattr(optimizer, "built", False):  # Keras 3 / Keras 2 Optimizer (build is idempotent)
        optimizer.build(variables)
