"""Tools around the models: training, circuits, plots and benchmarks.

[`train`][attnlab.tools.train] (the induction-head model's training run),
[`circuits`][attnlab.tools.circuits] (taking heads apart),
[`plotting`][attnlab.tools.plotting] (heatmaps and figures) and
[`bench`][attnlab.tools.bench] (the benchmark harness, `python -m attnlab.tools.bench`).
"""
