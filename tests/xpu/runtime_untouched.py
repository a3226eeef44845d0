"""Run in a fresh interpreter by tests/xpu/test_xpu_kernels.py, with every XPU runtime entry point raising: import
funcoll, load the XPU lowering, register its kernels, read its capabilities. funcoll is imported only after the entry
points are replaced (its import is part of what must not touch the runtime)."""

import torch


def main() -> list:
    def boom(*a, **k):
        raise AssertionError("XPU runtime touched")

    for name in ("_lazy_init", "init", "current_device", "device_count", "set_device", "synchronize",
                 "get_device_name"):
        setattr(torch.xpu, name, boom)
    import funcoll
    import funcoll.transport.xpu  # noqa: F401

    assert funcoll.install(["xpu"]) == ["xpu"]
    caps = funcoll.capabilities("xpu")
    funcoll.uninstall()
    return [caps.name, torch.xpu.is_initialized()]
