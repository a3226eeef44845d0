"""funcoll's public controls for XLA (TPU, or the CPU PJRT device): ``from funcoll import xla``.

* :func:`static_split_bound` promises a bound on the split sizes of uneven ``all_to_all_single`` calls in its
  block: no agreement collective and no graph sync (needed on a virtual world, where the agreement cannot run);
* :func:`normalize_device` / :func:`device_index` read a device spelling (None, an int, ``"0"``, ``"xla"``,
  ``"xla:0"``, ``torch.device``) the way funcoll does, with a clear error for an index the process cannot address;
* :func:`reset_token` starts a fresh ordering token, so that the next collective's HLO shows only itself;
* :func:`capabilities` is what the XLA transport does natively (``funcoll.capabilities("xla")`` is the same).

Reading HLO as text is a testing helper: :func:`funcoll.testing.xla_collectives`. Importing this module imports
torch_xla.
"""

from funcoll.transport.xla import capabilities, device_index, normalize_device, reset_token, static_split_bound

__all__ = ["static_split_bound", "normalize_device", "device_index", "reset_token", "capabilities"]
