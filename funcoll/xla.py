"""funcoll's public controls for XLA (TPU, or the CPU PJRT device): ``from funcoll import xla`` (docs/xla.md).

:func:`static_split_bound` (a bound on uneven ``all_to_all_single`` splits: no agreement collective, no graph sync),
:func:`normalize_device` / :func:`device_index`, :func:`reset_token` (a fresh ordering token, so that the next
collective's HLO shows only itself) and :func:`capabilities`, from :mod:`funcoll.transport.xla`. Reading HLO as text
is a testing helper (:func:`funcoll.testing.xla_collectives`). Importing this module imports torch_xla.
"""

from funcoll.transport.xla import capabilities, device_index, normalize_device, reset_token, static_split_bound

__all__ = ["static_split_bound", "normalize_device", "device_index", "reset_token", "capabilities"]
