"""Automatic tensor names. Every rank must give the same tensor the same name;
unnamed operations are numbered per operation kind in call order, as Horovod
does, so ranks that make the same calls in the same order agree."""

import itertools

_counters: dict[str, "itertools.count[int]"] = {}


def reset():
    _counters.clear()


def auto_name(kind, name, qualified=False):
    """`name`, or with qualified=True '<kind>.<name>' (Horovod's PyTorch names its operations so,
    which its timelines show and which keeps an allreduce and an allgather of one name apart);
    '<kind>.noname.<n>' when name is None."""
    if name is not None:
        return "%s.%s" % (kind, name) if qualified else str(name)
    counter = _counters.setdefault(kind, itertools.count())
    return "%s.noname.%d" % (kind, next(counter))
