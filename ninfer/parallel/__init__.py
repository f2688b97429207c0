"""Tensor parallelism across the devices of one host: N rank processes, one torch.distributed
process group (gloo on cpu, nccl on cuda), each rank running its part of the model
(ninfer/passes/shard.py) through the ordinary executor.

    rank 0 (the serving process)                    ranks 1..N-1 (worker processes)
    ─────────────────────────────                    ───────────────────────────────
    HTTP, scheduler, sampler                         worker.py: wait for a command
    RankExecutor.run(batch) ──control broadcast──▶   Executor.run(batch)
    Executor.run(batch)  ◀──all_reduce / all_gather──▶  (the same calls, in lockstep)
    logits [rows, vocab] ─▶ sampler                  logits dropped

    group.py      process group setup (loopback rendezvous, a free port, timeouts)
    collectives.py  the `dist.*` kernels the plans name (all_reduce, all_gather)
    ranks.py      RankGroup: spawn and watch the workers, send commands, shut down
    worker.py     the worker process's loop
    executor.py   RankExecutor: rank 0's executor, mirroring every call to the workers
    engine.py     build_parallel_engine: compile every rank's plan, load, start the engine
"""
