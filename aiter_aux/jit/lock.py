"""The lock of one build directory: bounded, reported, and safe against killed builders.

Three layers, taken in order:

* a ``threading`` lock (builders in one process);
* ``.lock``, a ``filelock`` lock (builders in different processes; the OS releases it when
  its holder dies, even by SIGKILL);
* ``.lock.workers``, an ``flock`` on a descriptor that ninja and every compiler it starts
  inherit (``subprocess.Popen(pass_fds=...)``).  It stays held until the *last* process
  that can write in the build directory has exited.  A builder killed by SIGKILL releases
  ``.lock`` at once, but its ninja and compilers live on as orphans and keep writing object
  files; the next builder waits for them instead of compiling the same files concurrently
  (two compilers writing one ``.o`` make a corrupt module).

Before these, a builder takes ``<cache root>/.lock.cache`` shared (:class:`CacheLock`);
``aiter-aux clean`` takes it exclusively, so that it removes build directories (lock files
included) only while no build runs; a builder that waited for it re-creates its directory.

Every wait is reported on stderr at once, naming the lock file, and repeated every few
seconds; it gives up after ``$AITER_AUX_LOCK_TIMEOUT`` seconds (default 900) with
:class:`LockTimeoutError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
from pathlib import Path

import filelock

from .. import env
from .paths import cache_root, ensure_dir, renew_after_fork

try:
    import fcntl
except ImportError:  # Windows: builders are serialised by .lock only
    fcntl = None

_THREAD_LOCK = threading.Lock()
renew_after_fork(globals(), "_THREAD_LOCK", threading.Lock)
_REPORT_EVERY_S = 5.0


class LockTimeoutError(TimeoutError):
    """Waited longer than ``$AITER_AUX_LOCK_TIMEOUT`` for a build lock."""


def _report(msg: str) -> None:
    print(f"aiter_aux: {msg}", file=sys.stderr, flush=True)


def wait_for(try_acquire, path: Path, what: str, start: float, limit: float) -> None:
    """Call ``try_acquire(timeout)`` until it returns True.  A wait is reported on stderr at
    once (naming ``path``) and every few seconds; ``limit`` seconds after ``start`` it
    raises :class:`LockTimeoutError`."""
    if try_acquire(0.0):
        return
    _report(f"waiting for {what} (lock {path}); giving up after {limit:.0f} s")
    next_report = _REPORT_EVERY_S
    while True:
        waited = time.monotonic() - start
        if waited >= limit:
            raise LockTimeoutError(
                f"gave up after {waited:.0f} s waiting for {what} (lock {path}); raise "
                "AITER_AUX_LOCK_TIMEOUT to wait longer"
            )
        if try_acquire(min(0.5, limit - waited)):
            _report(f"got lock {path} after {waited:.1f} s")
            return
        if waited >= next_report:
            _report(f"still waiting for lock {path} ({waited:.0f} s)")
            next_report += _REPORT_EVERY_S


def try_flock(fd: int, mode: int, timeout: float) -> bool:
    """``flock(fd, mode)``, polled until ``timeout`` seconds have passed; whether it got it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


CACHE_LOCK = ".lock.cache"  # in the cache root: shared by builders, exclusive for clean


class CacheLock:
    """Context manager holding ``<root>/.lock.cache`` shared (a builder) or exclusive
    (``aiter-aux clean``), waiting as :func:`wait_for` does.  Without ``fcntl`` (Windows) it
    holds nothing."""

    def __init__(self, root: Path, *, exclusive: bool, what: str):
        self.path = Path(root) / CACHE_LOCK
        self.mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) if fcntl else 0
        self.what = what
        self.fd: int | None = None

    def _try(self, timeout: float) -> bool:
        return try_flock(self.fd, self.mode, timeout)

    def _open(self) -> int | None:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
        try:  # a read-only cache: nothing builds there, but a lock file may exist
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def _current(self) -> bool:
        """Whether the file we lock is still the one at the path (a clean of the whole cache
        removes it while holding it)."""
        try:
            on_disk, ours = os.stat(self.path), os.fstat(self.fd)
        except FileNotFoundError:
            return False
        return (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev, ours.st_ino)

    def acquire(self, start: float, limit: float) -> CacheLock:
        if fcntl is None:
            return self
        while True:
            self.fd = self._open()
            if self.fd is None:
                return self
            try:
                wait_for(self._try, self.path, self.what, start, limit)
            except BaseException:
                self.release()
                raise
            if self._current():
                return self
            self.release()
            ensure_dir(self.path.parent)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> CacheLock:
        return self.acquire(time.monotonic(), env.get("AITER_AUX_LOCK_TIMEOUT"))

    def __exit__(self, *exc) -> None:
        self.release()


class BuildLock:
    """Context manager holding the three locks of ``directory`` (see the module doc).
    ``pass_fds()`` is what the builder must pass to the ninja ``Popen``; ``waited_s`` is
    how long the acquisition waited."""

    def __init__(self, directory: Path, what: str = "another process building this module"):
        self.directory = Path(directory)
        self.path = self.directory / ".lock"
        self.workers_path = self.directory / ".lock.workers"
        self.what = what
        self.lock = filelock.FileLock(str(self.path))
        self.workers_fd: int | None = None
        self.cache: CacheLock | None = None
        self.waited_s = 0.0

    def _try_filelock(self, timeout: float) -> bool:
        try:
            self.lock.acquire(timeout=timeout)
            return True
        except filelock.Timeout:
            return False

    def _try_workers(self, timeout: float) -> bool:
        return try_flock(self.workers_fd, fcntl.LOCK_EX, timeout)

    def __enter__(self) -> BuildLock:
        start = time.monotonic()
        limit = env.get("AITER_AUX_LOCK_TIMEOUT")
        with contextlib.ExitStack() as undo:  # on an error, the layers taken so far go back
            _THREAD_LOCK.acquire()
            undo.callback(_THREAD_LOCK.release)
            ensure_dir(cache_root())
            self.cache = CacheLock(cache_root(), exclusive=False, what="aiter-aux clean to finish")
            undo.callback(self.cache.acquire(start, limit).release)
            ensure_dir(self.directory)  # a clean that ran meanwhile removed it
            wait_for(self._try_filelock, self.path, self.what, start, limit)
            undo.callback(self.lock.release)
            if fcntl is not None:
                undo.callback(self._close_workers)
                self.workers_fd = os.open(self.workers_path, os.O_RDWR | os.O_CREAT, 0o600)
                what = "the compiler processes of an interrupted build to exit"
                wait_for(self._try_workers, self.workers_path, what, start, limit)
            undo.pop_all()
        self.waited_s = time.monotonic() - start
        return self

    def pass_fds(self) -> tuple[int, ...]:
        return () if self.workers_fd is None else (self.workers_fd,)

    def _close_workers(self) -> None:
        # Close without LOCK_UN: an unlock would release the lock for every process sharing
        # the descriptor; closing keeps it held until the last inheriting child is gone.
        if self.workers_fd is not None:
            os.close(self.workers_fd)
            self.workers_fd = None

    def __exit__(self, *exc) -> None:
        try:
            self._close_workers()
            self.lock.release()
            self.cache.release()
        finally:
            _THREAD_LOCK.release()
