r"""Context extension for RoPE: the frequency rules of Hugging Face's `rope_scaling`.

A model trained on $L$ tokens sees rotation angles up to $L\,\theta_i$. To run it on
longer inputs, the rules here change the frequencies: position interpolation ("linear";
Chen et al. 2023, https://arxiv.org/abs/2306.15595), dynamic NTK ("dynamic"), YaRN
("yarn"; Peng et al. 2023, https://arxiv.org/abs/2309.00071) and Llama 3.1's rule
("llama3"); one more rule keeps only a share of the frequencies ("proportional", Gemma 4's
global layers). [`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling] is one such rule;
[`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin] applies it, and
[`hf_rope`][attnlab.models.hf_config.hf_rope] reads base and rule from a `transformers`
config for every layer that ports one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import Tensor

from attnlab.rules._validation import (
    check_bool,
    check_choice,
    check_device,
    check_positive_float,
    check_positive_int,
    checking,
    entry,
)
from attnlab.rules.rope import _frequencies, check_base, check_head_dim

__all__ = ["RopeScaling", "RopeType", "yarn_mscale"]


RopeType = Literal["default", "linear", "dynamic", "yarn", "llama3", "proportional"]


_ROPE_TYPES: tuple[RopeType, ...] = (
    "default",
    "linear",
    "dynamic",
    "yarn",
    "llama3",
    "proportional",
)


_NEEDS_ORIGINAL = ("dynamic", "yarn", "llama3")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    r"""YaRN's softmax sharpening for a context `factor` times longer: $0.1\,m \ln s + 1$.

    1 for `factor <= 1` (no stretching). [`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling]'s
    `"yarn"` rule scales cos and sin by it; DeepSeek's MLA scales its softmax by its
    square ([`mla_softmax_scale`][attnlab.layers.mla.mla_softmax_scale]).

    Examples:
        >>> round(yarn_mscale(40.0), 4), yarn_mscale(1.0)
        (1.3689, 1.0)
    """
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeScaling:
    r"""How a model stretches RoPE past the context it was trained on: one frequency rule.

    RoPE pair $i$ turns by $\theta_i = \text{base}^{-2i/d}$ per token; its wavelength
    $2\pi/\theta_i$ is how many tokens a full turn takes. A model trained on $L$ tokens
    has seen the slow pairs turn only part of the way; scaling slows them further so
    that a context `factor` times longer stays within angles seen in training. Each rule
    maps the frequencies $\theta_i$ to new ones $\theta'_i$ (`rope_type`, Hugging Face's
    names; $s$ = `factor`, $L$ = `original_max_positions`):

    - `"default"`: $\theta'_i = \theta_i$.
    - `"linear"` (position interpolation, Chen et al., 2023,
      https://arxiv.org/abs/2306.15595): $\theta'_i = \theta_i / s$, every pair alike.
    - `"dynamic"` (NTK-aware, "dynamic NTK"): a larger base, chosen from the length $n$
      of the sequence seen, $n = \max(\text{max position} + 1, L)$:
      $\text{base}' = \text{base}\,(s\,n/L - (s - 1))^{d/(d-2)}$; nothing changes up
      to $L$ tokens.
    - `"yarn"` (Peng et al., 2023, https://arxiv.org/abs/2309.00071): pairs that turn
      more than `beta_fast` times in $L$ tokens keep $\theta_i$, pairs that turn fewer
      than `beta_slow` times get $\theta_i / s$, a linear ramp between; and cos and sin
      are multiplied by the attention factor
      ([`attention_scaling`][attnlab.rules.rope_scaling.RopeScaling.attention_scaling]), which
      sharpens the softmax.
    - `"llama3"` (Llama 3.1): pairs with a wavelength below $L$ / `high_freq_factor`
      keep $\theta_i$, those above $L$ / `low_freq_factor` get $\theta_i / s$, and in
      between the two are mixed with weight $(L/\lambda_i - \text{low}) / (\text{high}
      - \text{low})$ on the unscaled one.
    - `"proportional"` (Gemma 4's global layers): the first
      $\lfloor f\,d/2 \rfloor$ pairs ($f$ = `fraction`) keep $\theta_i / s$, the others
      turn by zero: they pass unrotated, position-free features inside a rotated head.
      Unlike partial RoPE (`Rope.dims`), the kept pairs have the frequencies of the whole
      head ($\text{base}^{-2i/d}$ over all $d$ features), and with the `"half"` layout
      feature $i$ pairs with feature $i + d/2$ as in full RoPE.

    Every rule computes in float32 in the order `transformers` does, so the frequencies
    agree with its `ROPE_INIT_FUNCTIONS` to the last bit or nearly (the tests check).

    The dynamic rule follows `transformers`' rotary embedding in one call: its
    frequencies come from the positions of that call (the largest position + 1, over the
    whole batch), so a cached decoding step at position $p$ rotates its new query and key
    with the frequencies of $n = p + 1$, while the keys already in the cache keep the
    frequencies they were rotated with. `transformers` keeps, between calls, the
    frequencies of the longest length seen until a call shorter than $L$ resets them;
    the two agree whenever the lengths do not shrink while above $L$ (one forward, or a
    prefill and its decoding steps), which is every use in attnlab.

    Attributes:
        rope_type: The rule, one of `"default"`, `"linear"`, `"dynamic"`, `"yarn"`,
            `"llama3"`.
        factor: How many times longer the new context is, $s \ge 1$.
        original_max_positions: $L$, the context of pre-training:
            `original_max_position_embeddings` for `"yarn"` and `"llama3"`,
            `max_position_embeddings` for `"dynamic"` (as `transformers` reads them);
            required by those three.
        low_freq_factor: `"llama3"`: wavelengths above $L$ / this are fully scaled.
        high_freq_factor: `"llama3"`: wavelengths below $L$ / this are kept.
        beta_fast: `"yarn"`: pairs turning more often than this in $L$ tokens are kept.
        beta_slow: `"yarn"`: pairs turning less often than this are fully scaled.
        mscale: `"yarn"`: with `mscale_all_dim`, the attention factor is
            $m(s, \text{mscale}) / m(s, \text{mscale\_all\_dim})$ (DeepSeek-V3).
        mscale_all_dim: `"yarn"`: see `mscale`.
        attention_factor: `"yarn"`: the factor on cos and sin, if the config gives it.
        truncate: `"yarn"`: round the ramp's ends to whole pairs (the default).
        fraction: `"proportional"`: the share of the pairs that turn
            (`partial_rotary_factor`), in $(0, 1]$.

    Raises:
        ValueError: If `rope_type` is unknown, `factor` is below 1, a rule misses
            `original_max_positions`, or a factor is out of range.
        TypeError: If a number is not a number.

    Examples:
        >>> from attnlab.rules.rope import rope_frequencies
        >>> llama31 = RopeScaling("llama3", factor=8.0, original_max_positions=8192)
        >>> f = llama31.frequencies(128, base=500000.0)
        >>> torch.equal(f[:20], rope_frequencies(128, base=500000.0)[:20])  # fast: kept
        True
        >>> round(float(rope_frequencies(128, base=500000.0)[-1] / f[-1]), 4)  # slow: / 8
        8.0
    """

    rope_type: RopeType = "default"
    factor: float = 1.0
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    fraction: float = 1.0

    def __post_init__(self) -> None:
        check_choice("rope_type", self.rope_type, _ROPE_TYPES)
        if check_positive_float("factor", self.factor) < 1.0:
            raise ValueError(f"factor must be at least 1 (a longer context), got {self.factor!r}")
        if self.rope_type in _NEEDS_ORIGINAL and self.original_max_positions is None:
            raise ValueError(
                f"rope_type={self.rope_type!r} needs original_max_positions (the "
                "context of pre-training), got None"
            )
        if self.original_max_positions is not None:
            check_positive_int("original_max_positions", self.original_max_positions)
        low = check_positive_float("low_freq_factor", self.low_freq_factor)
        high = check_positive_float("high_freq_factor", self.high_freq_factor)
        if self.rope_type == "llama3" and not high > low:
            raise ValueError(
                f"high_freq_factor must be greater than low_freq_factor, got "
                f"high_freq_factor={high} and low_freq_factor={low}"
            )
        check_positive_float("beta_fast", self.beta_fast)
        check_positive_float("beta_slow", self.beta_slow)
        for name in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(self, name) is not None:
                check_positive_float(name, getattr(self, name))
        check_bool("truncate", self.truncate)
        if not 0.0 < check_positive_float("fraction", self.fraction) <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction!r}")
        if self.fraction != 1.0 and self.rope_type != "proportional":
            raise ValueError(
                f"fraction={self.fraction!r} is a setting of rope_type='proportional', "
                f"not of {self.rope_type!r}"
            )

    @classmethod
    def from_hf(cls, config: Any) -> RopeScaling:
        """The scaling of a Hugging Face config: its `rope_parameters` (or `rope_scaling`).

        Reads `rope_type` and the keys its rule uses, with `transformers`' defaults for
        the optional ones; `"dynamic"` takes $L$ from `config.max_position_embeddings`,
        and a `"yarn"` config without `factor` gets `max_position_embeddings /
        original_max_position_embeddings` (as DeepSeek-V3's code allows).

        Raises:
            ValueError: If the type is not one of the six (e.g. `"longrope"`), or a key
                the rule needs is missing (the message names it), or a value is out of
                range.

        Examples:
            >>> from transformers import LlamaConfig
            >>> config = LlamaConfig(rope_parameters={
            ...     "rope_type": "linear", "rope_theta": 1e4, "factor": 4.0})
            >>> RopeScaling.from_hf(config)
            RopeScaling(rope_type='linear', factor=4.0)
        """
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        params = dict(params or {})
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in _ROPE_TYPES:
            allowed = ", ".join(repr(t) for t in _ROPE_TYPES)
            raise ValueError(
                f"rope_type must be one of {allowed}, got {kind!r} (config.rope_parameters)"
            )
        if kind == "default":
            return cls()

        def need(key: str) -> Any:
            if params.get(key) is None:
                raise ValueError(
                    f"config.rope_parameters with rope_type={kind!r} needs {key!r}, "
                    f"got keys {sorted(params)}"
                )
            return params[key]

        if kind == "dynamic":
            return cls("dynamic", float(need("factor")), int(config.max_position_embeddings))
        if kind == "linear":
            return cls("linear", float(need("factor")))
        if kind == "proportional":
            share = float(params.get("partial_rotary_factor", 1.0))
            return cls("proportional", float(params.get("factor", 1.0)), fraction=share)
        original = int(need("original_max_position_embeddings"))
        if kind == "llama3":
            return cls(
                "llama3",
                float(need("factor")),
                original,
                low_freq_factor=float(need("low_freq_factor")),
                high_freq_factor=float(need("high_freq_factor")),
            )
        factor = params.get("factor")
        if factor is None:
            factor = config.max_position_embeddings / original

        def optional(key: str) -> float | None:
            value = params.get(key)
            return None if value is None else float(value)

        return cls(
            "yarn",
            float(factor),
            original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=optional("mscale"),
            mscale_all_dim=optional("mscale_all_dim"),
            attention_factor=optional("attention_factor"),
            truncate=bool(params.get("truncate", True)),
        )

    def __repr__(self) -> str:
        shown = [f"rope_type={self.rope_type!r}"]
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                shown.append(f"{f.name}={value!r}")
        return f"RopeScaling({', '.join(shown)})"

    @property
    def is_dynamic(self) -> bool:
        """Whether the frequencies depend on the sequence length (`"dynamic"`)."""
        return self.rope_type == "dynamic"

    def attention_scaling(self) -> float:
        r"""The factor on cos and sin (so on every score, squared): 1 except for YaRN.

        YaRN's is `attention_factor` if given, else $m(s, \text{mscale}) / m(s,
        \text{mscale\_all\_dim})$ when both are set (DeepSeek-V3, where it is 1 because
        the two are equal: its softmax scale carries the correction instead), else
        $m(s) = 0.1 \ln s + 1$.

        Examples:
            >>> round(RopeScaling("yarn", 4.0, 32768).attention_scaling(), 6)  # Qwen2.5
            1.138629
        """
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)

    @entry
    def frequencies(
        self,
        dim: int,
        base: float = 10000.0,
        *,
        seq_len: int | Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        r"""The scaled frequencies $\theta'_i$ of the `dim // 2` rotated pairs, float32.

        Args:
            dim: Rotated features per head (`head_dim`, or fewer with partial RoPE).
            base: RoPE's base.
            seq_len: `"dynamic"` only: the length seen, an int or a 0-d integer tensor
                (no host sync: the frequencies are computed on its device); None or a
                length up to $L$ gives the unscaled frequencies.
            device: Where to create the tensor.

        Returns:
            float32 `(dim // 2,)`.

        Examples:
            >>> from attnlab.rules.rope import rope_frequencies
            >>> ntk = RopeScaling("dynamic", factor=2.0, original_max_positions=16)
            >>> torch.equal(ntk.frequencies(8, seq_len=16), rope_frequencies(8))
            True
            >>> bool((ntk.frequencies(8, seq_len=64) <= rope_frequencies(8)).all())
            True
        """
        if checking():
            dim, base = check_head_dim(dim, "dim"), check_base(base)
            check_device("device", device)
            if self.is_dynamic and dim <= 2:
                raise ValueError(f"rope_type='dynamic' needs dim > 2, got dim={dim}")
        return self._scaled(dim, base, seq_len, device)

    def _scaled(
        self,
        dim: int,
        base: float,
        seq_len: int | Tensor | None,
        device: torch.device | str | None,
    ) -> Tensor:
        kind, s = self.rope_type, self.factor
        original = self.original_max_positions
        if kind == "dynamic":
            # NTK-aware: a larger base for a longer sequence, in float32 as transformers.
            assert original is not None  # checked at construction
            if seq_len is None:
                seq_len = original
            if isinstance(seq_len, Tensor):
                n: Tensor | int = torch.clamp(seq_len, min=original)
                device = seq_len.device if device is None else device
            else:
                n = max(int(seq_len), original)
            grown = base * ((s * n / original) - (s - 1)) ** (dim / (dim - 2))
            if isinstance(grown, Tensor):
                grown = grown.to(device=device, dtype=torch.float32)
            return _frequencies(dim, grown, device)  # RoPE's own, with the grown base
        freqs = _frequencies(dim, base, device)  # (dim/2,)
        if kind == "linear":
            return freqs / s
        if kind == "proportional":  # the first pairs turn, the others stand still
            turning = int(self.fraction * dim // 2)
            return torch.cat((freqs[:turning], freqs.new_zeros(dim // 2 - turning))) / s
        if kind == "llama3":
            assert original is not None
            low, high = self.low_freq_factor, self.high_freq_factor
            wavelength = 2 * math.pi / freqs
            scaled = torch.where(wavelength > original / low, freqs / s, freqs)
            # Between the two wavelengths: mix the scaled and kept frequency.
            mix = (original / wavelength - low) / (high - low)
            between = (wavelength >= original / high) & (wavelength <= original / low)
            return torch.where(between, (1 - mix) * scaled / s + mix * scaled, scaled)
        if kind == "yarn":
            assert original is not None
            return self._yarn(dim, base, original, device)
        return freqs

    def _yarn(
        self, dim: int, base: float, original: int, device: torch.device | str | None
    ) -> Tensor:
        """YaRN's ramp between kept and interpolated pairs, by turns in `original` tokens."""

        def pair_turning(turns: float) -> float:
            # The (fractional) pair index whose wavelength fits `turns` times in L tokens.
            return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a ramp of zero width
        periods = base ** (torch.arange(0, dim, 2, device=device).float() / dim)  # 1/theta
        kept, interpolated = 1.0 / periods, 1.0 / (self.factor * periods)  # (dim/2,) each
        ramp = ((torch.arange(dim // 2, device=device).float() - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1 for fast pairs, 0 for slow ones
        return interpolated * (1 - keep) + kept * keep
