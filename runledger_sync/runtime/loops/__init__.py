"""The periodic loops beside the worker: reaper, scheduler, pruner, sampler, and the worker's own row."""
