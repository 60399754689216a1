"""A stand-in for the `parameterized` package (not installed here), put on PYTHONPATH by
tests/horovod_suite.py for Horovod's test files: only what they use, `parameterized.expand`
on test methods. Each parameter set becomes a method NAME_<index> of the class being defined
(the name the real package gives for non-string parameters); the original method is dropped."""

import functools
import inspect


class parameterized:  # the package's name
    @staticmethod
    def expand(params):
        def decorate(fn):
            frame = inspect.currentframe()
            assert frame is not None and frame.f_back is not None
            namespace = frame.f_back.f_locals  # the class body being executed
            for index, param in enumerate(params):
                args = tuple(param) if isinstance(param, (list, tuple)) else (param,)

                @functools.wraps(fn)
                def method(self, _args=args):
                    return fn(self, *_args)

                method.__name__ = "%s_%d" % (fn.__name__, index)
                namespace[method.__name__] = method
            return None

        return decorate
