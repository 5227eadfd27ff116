"""The channels between rollout and trainer workers, on 3 gloo ranks (trainers 0 and 1,
rollout 2): rows point to point in both pairs, and the weight broadcast from trainer 0
with tensors of several dtypes (their bytes must come back exact)."""

import torch
import torch.multiprocessing as mp

from siirl.execution.scheduler.process_group_manager import free_port
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank


def _weights():
    gen = torch.Generator().manual_seed(0)
    return [[("a.weight", torch.randn(3, 5, generator=gen)),
             ("b.bias", torch.randn(7, generator=gen).to(torch.bfloat16))],
            [("c.idx", torch.arange(5, dtype=torch.int64)),
             ("d.half", torch.randn(2, 3, generator=gen).to(torch.float16)),
             ("e.flag", torch.tensor([True, False, True]))]]


def _rank_main(rank: int, port: int) -> None:
    start_gloo_rank(rank, 3, port)
    from siirl.dag_worker.async_training import wire
    from siirl.dag_worker.async_training.groups import build_groups
    from siirl.data_coordinator.protocol import get_non_tensor, make_batch

    groups = build_groups(rank, [0, 1], [2], "gloo", 60, torch.device("cpu"))
    assert groups.is_trainer == (rank < 2)
    assert (groups.weights is None) == (rank == 1)
    if rank == 2:
        for trainer in (0, 1):
            rows = make_batch({"x": torch.full((2, 3), float(trainer))},
                              {"uid": [f"u{trainer}", f"u{trainer}"]})
            wire.send_message(wire.ROWS, {"rows": rows, "metrics": {"m": 1.5}}, trainer,
                              groups.pairs[(2, trainer)])
            wire.send_message(wire.END, None, trainer, groups.pairs[(2, trainer)])
        notes, buckets = groups.weights.receive()
        assert notes == {"version": 3, "stop": True}
        for got, want in zip(buckets, _weights(), strict=True):
            for (name, tensor), (want_name, want_tensor) in zip(got, want, strict=True):
                assert name == want_name and tensor.dtype == want_tensor.dtype
                assert torch.equal(tensor, want_tensor), name
    else:
        kind, payload = wire.recv_message(2, groups.pairs[(2, rank)])
        assert kind == wire.ROWS and payload["metrics"] == {"m": 1.5}
        assert torch.equal(payload["rows"]["x"], torch.full((2, 3), float(rank)))
        assert get_non_tensor(payload["rows"], "uid") == [f"u{rank}"] * 2
        assert wire.recv_message(2, groups.pairs[(2, rank)]) == (wire.END, None)
        if rank == 0:
            sent = groups.weights.send(_weights(), {"version": 3, "stop": True})
            assert sent == sum(t.numel() * t.element_size() for b in _weights() for _, t in b)
    finish_rank()


def test_rows_and_weights_cross_between_trainers_and_the_rollout():
    context = mp.start_processes(_rank_main, args=(free_port(),), nprocs=3, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 3-rank async channel test")
