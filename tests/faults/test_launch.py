"""funcoll.launch: what the harness reports about a world whose ranks die."""

import os

from funcoll.launch import spawn_world

PAYLOAD = 1 << 20  # more than a pipe holds: a result still being written when the rank dies would be lost


def _rank_dies_at_teardown(rank, n):
    """Returns its result, then the process aborts while the harness destroys the group."""
    import torch.distributed as dist

    dist.destroy_process_group = os.abort  # the harness calls it after handing over the result
    return {"rank": rank, "payload": b"x" * PAYLOAD}


def test_a_rank_that_dies_in_the_teardown_is_reported_with_its_result_and_exit_code():
    results, codes, hung = spawn_world("tests.faults.test_launch:_rank_dies_at_teardown", 2, deadline=60,
                                       coll_timeout=10)
    assert hung == [] and codes == [-6, -6], (codes, hung)
    for rank in (0, 1):
        assert results[rank] is not None, f"rank {rank}'s result was lost"
        status, value = results[rank]
        assert status == "ok" and value == {"rank": rank, "payload": b"x" * PAYLOAD}
