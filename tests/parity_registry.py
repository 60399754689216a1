"""What tests/parity_torch.py and tests/parity_tf.py share: the @covers registry mapping each
Horovod name to the Test class covering it, and err() recording what a call raised."""


class CoverageRegistry:
    """COVERED: Horovod name -> Test class; rank_parts: the classes with a part that runs on
    the ranks (any of `rank_hooks`), in definition order."""

    def __init__(self, rank_hooks):
        self.covered: dict[str, type] = {}
        self.rank_parts: list[type] = []
        self._rank_hooks = tuple(rank_hooks)

    def covers(self, *names):
        def register(cls):
            for name in names:
                assert name not in self.covered, "%s covered twice" % name
                self.covered[name] = cls
            cls.names = names
            if any(hasattr(cls, hook) for hook in self._rank_hooks):
                self.rank_parts.append(cls)
            return cls

        return register


def err(fn):
    """None if fn() returns, else (class name, names of its classes in MRO order, message)."""
    try:
        fn()
        return None
    except BaseException as e:  # the point is to record what was raised
        return type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)
