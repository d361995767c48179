"""Processes a test starts in a session of their own, which must not outlive the test process."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the child is killed (SIGKILL) when the test process exits.

    A command started with ``start_new_session=True`` is out of reach of a signal to the test's process group, so a
    test run that is killed (a CI timeout, an interrupted local run) would leave it running, a server holding its
    port. Linux only; elsewhere this does nothing. The signal survives ``exec``, so ``bash -c "server ..."`` (which
    ``exec``s a lone command) passes it on to the server; processes the command forks do not inherit it.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: nobody will send the signal
        os._exit(1)
