"""Horovod's horovod.runner.util.threads helpers, written for hvdlite's compatibility namespace
(Horovod's test utilities, test/utils/common.py, import in_thread from here).

Threading contract: every helper starts plain threading.Thread objects; none blocks unless it
says so.
"""

import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Starts target(*args) in a new thread and returns the thread. silent: exceptions raised by
    target are swallowed. args must be a tuple (Horovod's check)."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")
    fn = target
    if silent:

        def fn(*a):
            try:
                target(*a)
            except Exception:
                pass

    thread = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True, silent=False):
    """Runs func(*args) in a new thread once `event` is set; a set `stop` event (checked every
    check_stop_interval_s seconds) ends the wait without calling func. Returns the thread."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")

    def wait_then_call():
        while not event.wait(check_stop_interval_s):
            if stop is not None and stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)
