"""Framework-neutral rules of Horovod's DistributedOptimizer: parameter
naming and validation, gradient grouping, and its error messages. The
PyTorch optimizer uses them directly; the TensorFlow one will too."""

import warnings
from typing import Any

from hvdlite.common import exceptions

TOO_MANY_BACKWARD_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)
ZERO_GRAD_RACE = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)
STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after optimizer.synchronize(). "
    "This can cause training slowdown. You may want to consider using optimizer.skip_synchronize() "
    "context if you use optimizer.synchronize() in your code."
)


def find_duplicates(names):
    seen, dups = set(), set()
    for name in names:
        if name in seen:
            dups.add(name)
        seen.add(name)
    return dups


def name_parameters(named_parameters, param_groups_params):
    """Validated list of (name, param). `param_groups_params` is a list (one per
    param group) of parameter lists. Without named_parameters, parameters are
    named 'allreduce.noname.<group>.<index>' (identical on every rank when the
    model is). Raises ValueError as Horovod does."""
    if named_parameters is None:
        return [
            ("allreduce.noname.%d.%d" % (i, j), p)
            for i, params in enumerate(param_groups_params)
            for j, p in enumerate(params)
        ]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise exceptions.InvalidArgumentError(
            "named_parameters should be a sequence of tuples (name, parameter), "
            "usually produced by model.named_parameters()."
        )
    dups = find_duplicates([name for name, _ in named])
    if dups:
        raise exceptions.InvalidArgumentError(
            "Parameter names in named_parameters must be unique. Found duplicates: %s"
            % ", ".join(sorted(dups))
        )
    named_ids = {id(p) for _, p in named}
    unnamed = [id(p) for params in param_groups_params for p in params if id(p) not in named_ids]
    if unnamed:
        raise exceptions.InvalidArgumentError(
            "named_parameters was specified, but one or more model parameters were not named. "
            "Python object ids: %s" % ", ".join(str(i) for i in unnamed)
        )
    return named


def resolve_groups(num_groups, groups):
    """Horovod's deprecated num_groups becomes groups; returns groups."""
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in a future release.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    return groups


def check_groups(groups, is_tensor):
    """Validates `groups`: None, a positive int, or a list of lists of tensors
    in which no tensor appears twice."""
    if groups is None:
        return
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise exceptions.InvalidArgumentError(
            "groups should be a non-negative integer or a list of list of tensors."
        )
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not is_tensor(p):
                    raise exceptions.InvalidArgumentError("groups must consist of tensors.")
                if id(p) in seen:
                    raise exceptions.InvalidArgumentError("A parameter can only appear once in groups.")
                seen.add(id(p))


def split_list(items, n):
    """`items` in n contiguous chunks whose sizes differ by at most one."""
    k, m = divmod(len(items), n)
    return [items[i * k + min(i, m) : (i + 1) * k + min(i + 1, m)] for i in range(n)]


def form_groups(params, groups):
    """Gradient groups (tuples of params) for `groups` = an int (that many
    equal chunks of `params`, in order) or a list of lists (those, then every
    remaining param alone). `params` must be in the same order on every rank."""
    if isinstance(groups, list):
        wanted = {id(p) for p in params}
        formed: list[list[Any]] = []
        grouped: set[int] = set()
        for group in groups:
            members = [p for p in group if id(p) in wanted]
            grouped.update(id(p) for p in members)
            if members:
                formed.append(members)
        formed += [[p] for p in params if id(p) not in grouped]
    else:
        formed = [chunk for chunk in split_list(params, groups) if chunk]
    return [tuple(group) for group in formed]
