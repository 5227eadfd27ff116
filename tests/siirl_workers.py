"""Simulated workers for tests of statistics over the global batch: ``on_workers`` runs a
function on one thread per worker's rows, each with a ``WorkerReduction`` over a
``ThreadComm`` (threads exchanging their objects in rank order, as the gloo collectives
would)."""

import threading

from siirl.dag_worker.core_algos.batch_reduction import WorkerReduction


class ThreadComm:
    """A WorkerComm stand-in for ``world`` threads: ``all_gather`` hands every thread
    everyone's object, in rank order."""

    def __init__(self, world: int):
        self.world, self.slots = world, [None] * world
        self.barrier = threading.Barrier(world)

    def view(self, rank: int):
        comm = self

        class Rank:
            active, world_size = comm.world > 1, comm.world

            def all_gather(self, obj):
                comm.slots[rank] = obj
                comm.barrier.wait()
                out = list(comm.slots)
                comm.barrier.wait()  # nobody overwrites a slot before all have read
                return out

        rank_view = Rank()
        rank_view.rank = rank
        return rank_view


def on_workers(fn, parts, contributes=None):
    """``fn(part, reduction)`` on one thread per part; the results in rank order."""
    comm, results, errors = ThreadComm(len(parts)), [None] * len(parts), []
    contributes = contributes or [True] * len(parts)

    def run(rank):
        try:
            results[rank] = fn(parts[rank], WorkerReduction(comm.view(rank), contributes[rank]))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            comm.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        raise errors[0]
    return results
