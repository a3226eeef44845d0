"""funcoll's public controls for XLA (TPU, or the CPU PJRT device), from :mod:`funcoll.transport.xla` (docs/xla.md):
``from funcoll import xla``. Importing this module imports torch_xla.
"""

from funcoll.transport.xla import capabilities, device_index, normalize_device, reset_token, static_split_bound

__all__ = ["static_split_bound", "normalize_device", "device_index", "reset_token", "capabilities"]
