"""renew_after_fork: the loader's locks that a child of fork gets unlocked (no build)."""

from __future__ import annotations

import os
import threading

import pytest

from aiter_aux.jit.paths import renew_after_fork

_LOCK = threading.Lock()
_RLOCK = threading.RLock()
renew_after_fork(globals(), "_LOCK", threading.Lock)
renew_after_fork(globals(), "_RLOCK", threading.RLock)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("name", ["_LOCK", "_RLOCK"])
def test_a_child_of_fork_gets_the_lock_another_thread_holds(name):
    held, done = threading.Event(), threading.Event()

    def hold():
        with globals()[name]:
            held.set()
            done.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if globals()[name].acquire(timeout=10) else 1)
    _, status = os.waitpid(pid, 0)
    done.set()
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0
