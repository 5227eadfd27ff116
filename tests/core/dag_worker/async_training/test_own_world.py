"""The trainers' own world (``groups.own_world``), on 3 gloo ranks (trainers 0 and 1,
rollout 2): within it a trainer's default group holds the trainers alone, so what a
training backend does over the default group (megatron-core lays its parallel groups over
it, gathers its optimizer's parameter groups over it) needs nothing of the rollout worker,
which meanwhile talks to the trainers over their pair groups; outside it the world is
whole again."""

import torch
import torch.multiprocessing as mp

from siirl.execution.scheduler.process_group_manager import free_port
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank


def _rank_main(rank: int, port: int) -> None:
    start_gloo_rank(rank, 3, port)
    import torch.distributed as dist

    from siirl.dag_worker.async_training import wire
    from siirl.dag_worker.async_training.groups import build_groups, own_world

    groups = build_groups(rank, [0, 1], [2], "gloo", 60, torch.device("cpu"))
    sides = [dist.new_group([0, 1]), dist.new_group([2])]
    if rank == 2:  # the rollout worker: no part in the trainers' collectives
        for trainer in (0, 1):
            wire.send_message(wire.ROWS, {"rows": None, "from": 2}, trainer,
                              groups.pairs[(2, trainer)])
    else:
        with own_world(sides[0]):
            assert dist.get_world_size() == 2 and dist.get_rank() == rank
            everyone = [None, None]
            dist.all_gather_object(everyone, rank * 10)  # over the default group
            assert everyone == [0, 10]
            inner = dist.new_group([0, 1])  # collective over the trainers alone
            total = torch.tensor([rank + 1.0])
            dist.all_reduce(total, group=inner)
            assert total.item() == 3.0
            kind, payload = wire.recv_message(2, groups.pairs[(2, rank)])  # named groups
            assert kind == wire.ROWS and payload["from"] == 2
        assert dist.get_world_size() == 3
    with own_world(None):  # a side that is the whole world: unchanged
        assert dist.get_world_size() == 3
    finish_rank()  # a barrier over the whole world again


def test_the_trainers_world_leaves_the_rollout_worker_out():
    context = mp.start_processes(_rank_main, args=(free_port(),), nprocs=3, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 3-rank own-world test")


def _misnumbered(rank: int, port: int) -> None:
    start_gloo_rank(rank, 2, port)
    import pytest
    import torch.distributed as dist

    from siirl.dag_worker.async_training.groups import own_world

    sides = [dist.new_group([0]), dist.new_group([1])]
    if rank == 1:  # rank 1 is rank 0 of its side: megatron would number it wrongly
        with pytest.raises(ValueError, match="ranks 0..T-1"):
            with own_world(sides[1]):
                pass
    finish_rank()


def test_a_side_that_renumbers_its_ranks_is_refused():
    context = mp.start_processes(_misnumbered, args=(free_port(),), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank own-world refusal test")
