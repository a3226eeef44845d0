"""Which capability profiles (``FUNCOLL_PROFILE``) the suite runs on which torch: each where its device's users are.

gloo and ``xccl`` run on every torch (XPU users run current torch; ProcessGroupXCCL ships in torch since 2.8). The
``xla`` profile runs on torch 2.9 only: torch_xla's last release, 2.9.0, is built against exactly torch 2.9.0, and
nobody runs torch_xla on a later torch. The ``torchtpu`` profile runs on torch >= 2.11 only: TorchTPU requires it.
Elsewhere the test skips, saying so.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def skip_reason(profile: Optional[str]) -> Optional[str]:
    """Why ``profile`` does not run on this torch (None: it runs)."""
    if profile == "xla" and _TORCH >= (2, 10):
        return f"the xla profile runs on torch_xla's torch (2.9), not on torch {torch.__version__}"
    if profile == "torchtpu" and _TORCH < (2, 11):
        return f"the torchtpu profile runs on torch >= 2.11 (TorchTPU's), not on torch {torch.__version__}"
    return None


def mark(profile: Optional[str]):
    """The mark that skips a test of ``profile`` on a torch its users do not run."""
    return pytest.mark.skipif(skip_reason(profile) is not None, reason=skip_reason(profile) or "")


def params(profiles, ids=None) -> list:
    """``profiles`` as ``pytest.param``s, each with its :func:`mark`."""
    ids = ids or [p or "native" for p in profiles]
    return [pytest.param(p, id=i, marks=mark(p)) for p, i in zip(profiles, ids)]


def require(profile: Optional[str]) -> None:
    """Skips the calling test where ``profile`` does not run on this torch."""
    reason = skip_reason(profile)
    if reason:
        pytest.skip(reason)
