r"""Benchmark harness: time, peak memory and FLOP rate of every attention in attnlab.

Run it as `python -m attnlab.tools.bench` (or `attnlab-bench`); `--help` lists the options. It
sweeps the sequence length for two suites:

- **kernels**: attention on ready-made `(b, h, T, head_dim)` queries, keys and values,
  causal: the naive `softmax(QK^T)V` that stores the scores,
  [`flash_attention`][attnlab.functional.flash.flash_attention], and PyTorch's fused
  `scaled_dot_product_attention` (the baseline);
- **modules**: self-attention layers on `(b, t, d_model)` tokens: the article's
  [`SelfAttention`][attnlab.SelfAttention] (one head as wide as the model) and
  [`MultiHeadAttentionWrapper`][attnlab.MultiHeadAttentionWrapper],
  [`MultiHeadAttention`][attnlab.MultiHeadAttention] on PyTorch's fused kernel and on
  attnlab's from-scratch one, and `nn.MultiheadAttention` called with
  `need_weights=False` (the baseline) and with its default `need_weights=True`. The
  baseline is not a fused kernel in every mode: in `forward` (eval, no gradients) it
  takes PyTorch's inference fast path, `torch._native_multi_head_attention`, which on
  the CPU computes the `(b, h, t, t)` weights in memory; with gradients it calls
  `scaled_dot_product_attention`. The Benchmarks page prints its ratio to
  `MultiHeadAttention` and both memories at every length.

Three more suites measure the attention of today's LLMs:

- **window**: [`flash_attention`][attnlab.functional.flash.flash_attention] with a sliding window
  against full causal `flash_attention` (the baseline);
- **decode**: a [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention] layer
  generating tokens after a context, with a
  [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] and by recomputing the whole
  sequence for each token (the baseline); times per token, and their slope against the
  context;
- **kv_memory**: bytes per token held by real KV caches of MHA, GQA, MQA and
  [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] (no timing).

Each configuration of kernels and modules runs in two modes: `forward` (under
`torch.no_grad()`, modules in eval mode) and `forward+backward` (the forward, then
`backward()` of a fixed random output gradient into the inputs and parameters); decode
runs without gradients. For each it reports:

- the median, min and max wall time over repeats that are *interleaved*: round $r$ runs
  every implementation once, in a shuffled order, before round $r + 1$ starts, so a
  slow spell of a shared machine hits all of them alike;
- the ratio to the suite's baseline, as the median of the per-round ratios;
- the peak extra memory: the most bytes held by tensors allocated during one call above
  what was held when it started (outputs and gradients included), read from the
  allocation events of PyTorch's profiler, which sees every CPU tensor allocation, also
  those inside fused kernels (allocations of MKL's own workspace are not seen);
- the achieved GFLOP/s of the useful matmul work (see `count_flops`) and its share of the
  machine's matmul peak, measured at start as the best rate of large float32 matmuls.

It writes `bench.json` (or the name `--json` gives; results and provenance: versions,
CPU, threads, date, command, how busy the machine was) and, per timed suite, one SVG plot
of time and one of memory. Every command of the package that records a measurement
writes its provenance with the same keys;
[`read_provenance`][attnlab.tools.bench.read_provenance] reads them from any record, also
from those written before the keys were made the same.

The package is split by concern: `attnlab.tools.bench.config` (sizes of each suite),
`attnlab.tools.bench.cases` (the implementations under test), `attnlab.tools.bench.measure` (memory,
matmul peak, machine load), `attnlab.tools.bench.kv_memory`, `attnlab.tools.bench.runner` (the timed
rounds and the goals), `attnlab.tools.bench.report` (Markdown tables), `attnlab.tools.bench.plots`
and `attnlab.tools.bench.cli`.
[`attnlab.tools.bench.overhead`][attnlab.tools.bench.overhead] times what argument checks cost.
"""

from attnlab.rules._provenance import read_provenance
from attnlab.tools.bench.cases import count_flops, naive_attention, window_pairs
from attnlab.tools.bench.cli import main
from attnlab.tools.bench.config import (
    FORWARD,
    FORWARD_BACKWARD,
    FULL,
    MODES,
    QUICK,
    SCHEMA_VERSION,
    SUITES,
    SuiteConfig,
)
from attnlab.tools.bench.kv_memory import KV_FULL, KV_QUICK, KVShape, measure_kv_memory
from attnlab.tools.bench.measure import measure_matmul_peak, peak_extra_bytes
from attnlab.tools.bench.plots import write_plots
from attnlab.tools.bench.report import (
    decode_slopes_markdown,
    goals_markdown,
    kv_memory_markdown,
    peak_exceeded,
    provenance_markdown,
    results_markdown,
)
from attnlab.tools.bench.runner import decode_slopes, evaluate_goals, run

__all__ = [
    "FORWARD",
    "FORWARD_BACKWARD",
    "FULL",
    "KV_FULL",
    "KV_QUICK",
    "MODES",
    "QUICK",
    "SCHEMA_VERSION",
    "SUITES",
    "KVShape",
    "SuiteConfig",
    "count_flops",
    "decode_slopes",
    "decode_slopes_markdown",
    "evaluate_goals",
    "goals_markdown",
    "kv_memory_markdown",
    "main",
    "measure_kv_memory",
    "measure_matmul_peak",
    "naive_attention",
    "peak_exceeded",
    "peak_extra_bytes",
    "provenance_markdown",
    "read_provenance",
    "results_markdown",
    "run",
    "window_pairs",
    "write_plots",
]
