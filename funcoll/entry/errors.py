"""The errors an eager funcoll collective raises, each a ``torch.distributed.DistBackendError`` (so a
``RuntimeError``) whose message names the op, the group, its ranks and the sequence number (``__cause__``: the
backend's own error), and how a backend's own error message is read.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["CollectiveError", "CollectiveTimeoutError", "CollectiveAbortedError", "CollectiveMismatchError",
           "backend_message", "is_backend_timeout"]


class CollectiveError(dist.DistBackendError):
    """A funcoll collective failed (a peer died, the backend reported an error)."""


class CollectiveTimeoutError(CollectiveError):
    """A collective (or the debug mode's cross-rank check of one) did not complete in time."""


class CollectiveAbortedError(CollectiveError):
    """The collective's group was aborted (``pg.abort()``, ``shrink_group(..., SHRINK_ABORT)``, a reconfigure) while
    it was in flight; funcoll stopped waiting for it (docs/fault-tolerance.md)."""


class CollectiveMismatchError(CollectiveError):
    """The debug mode or the size guard: the ranks of a group issued different collectives at the same sequence
    number. Raised on every rank, with the same message, before anything is sent."""


_CALLBACK = "Got the following error when running the callback: "


def backend_message(e: BaseException) -> str:
    """The backend's own message: a torch future's ``then`` wraps an error as "Got the following error when running
    the callback: RuntimeError: <message>\\n\\nAt:\\n<traceback>"; this is <message>."""
    msg = str(e).strip()
    while msg.startswith(_CALLBACK):
        msg = msg[len(_CALLBACK):].split("\n\nAt:\n", 1)[0].strip()
        head, sep, rest = msg.partition(": ")
        if sep and head.isidentifier() and head.endswith(("Error", "Exception")):
            msg = rest.strip()
    return msg


def is_backend_timeout(e: BaseException) -> bool:
    s = str(e).lower()
    return "timed out" in s or "timeout" in s
