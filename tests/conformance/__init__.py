"""funcoll held to PyTorch's own backend test suite, as upstream holds gloo (docs/conformance.md).

``python -m tests.conformance`` runs ``torch.testing._internal.distributed.distributed_test.DistributedTest.
_DistTestBase`` on gloo (the reference) and on funcoll (native and ``FUNCOLL_PROFILE=xccl``), on 2 CPU ranks, and
compares: every test gloo passes must pass on funcoll, or be listed in docs/conformance.md with the reason it
legitimately differs. :mod:`tests.conformance.suite` is one run; :mod:`tests.conformance.compare` the comparison.
"""
