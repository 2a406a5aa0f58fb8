"""PyTorch's side of the distributed benches: `ranks` spawned processes on one host, each running
`worker(rank, *args, port, result)` with a gloo store at 127.0.0.1:`port`; rank 0 puts its figures
on the `result` queue, which `run_ranks` returns."""
import os

import torch.multiprocessing as mp


def run_ranks(worker, ranks, *args):
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    port = 29500 + (os.getpid() + 7 * ranks + len(args)) % 2000
    procs = [ctx.Process(target=worker, args=(r, *args, port, result)) for r in range(ranks)]
    for p in procs:
        p.start()
    value = result.get()
    for p in procs:
        p.join()
    return value
