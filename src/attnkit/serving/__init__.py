"""Many requests on one model: paged KV caches, continuous batching and exact prefix caching (docs/serving.md).

    blocks.py      the pool of fixed-size KV blocks: free queue, reference counts, prefix hashes, counters
    paged.py       per-layer paged storage and the caches a step hands the model (KV, latent)
    states.py      state slots of the linear and Mamba-2 layers, one per live request
    scheduler.py   requests, the token budget, chunked prefill, preemption by recompute
    engine.py      Engine (add_request / step / cancel / stream / stats) and generate_many
    server.py      attnkit serve: the HTTP server in OpenAI's shape on the engine (Starlette, uvicorn)
"""

from .blocks import BlockPool, block_hash
from .engine import Engine, RequestOutput, generate_many
from .scheduler import Request, SamplingParams

__all__ = ["Engine", "RequestOutput", "generate_many", "BlockPool", "block_hash", "Request", "SamplingParams"]
