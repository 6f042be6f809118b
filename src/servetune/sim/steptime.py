"""Step-time models: how long one engine iteration takes, given what is in the batch.

A step is described by six features (all per step, summed over the batch):

- ``prefill_tokens``  prompt tokens computed this step (chunks included)
- ``decode_seqs``     sequences decoding one token this step
- ``kv_read_tokens``  KV-cache tokens read by attention: each decode's context plus, for
  each prefill chunk, the tokens already cached before it
- ``attn_pairs``      (query, key) pairs of attention over the whole batch: a decode with
  context c adds c; a chunk of n tokens after c cached adds n x c + n^2 / 2 (causal)
- ``prefill_sq``      sum over prefill chunks of n (n + 1) / 2 (a chunk's causal self-pairs;
  calibrated tier only: on vLLM's CPU backend a fresh prompt's attention grows with the
  square of the chunk, far faster than the decodes' reads that ``attn_pairs`` prices)
- ``cached_pairs``    sum over prefill chunks of n x cached: the (new, cached) pairs of a
  chunk that reads context already in the KV cache (a prefix-cache hit, or a long prompt's
  later chunks). Calibrated tier only, a price on top of ``attn_pairs``: such a pair
  costs vLLM's CPU backend about what a fresh prompt's own pair does (fitted 0.62-0.81
  us over three sweeps, against 0.93-1.0 us); without it a hit's pairs paid only
  ``attn_pairs``' 0.01-0.03 us (4 users sharing 512 of 704 prompt tokens: TTFT
  1.09-1.22 s real, 0.76-0.78 s replayed; docs/calibration.md)
- the batch's token count, prefill_tokens + decode_seqs, drives weight reads and all-reduce

Two tiers (FIELD-NOTES "two-tier latency model"; AIConfigurator labels its SILICON/HYBRID
tiers the same way):

- ``roofline``: seed 000 §4.2's bound from the planner's own functions
  (:mod:`servetune.plan.roofline`), with stated efficiency factors and a per-step overhead:
  t = overhead + max(bytes / (BW x eta_mem), FLOPs / (peak x eta_flops)) + TP all-reduce.
- ``calibrated``: t = c0 + c_prefill x prefill_tokens + c_decode x decode_seqs
  + c_kv x kv_read_tokens + c_attn x attn_pairs + c_sq x prefill_sq
  + c_cached x cached_pairs, coefficients fitted by
  least squares from measured runs (BLIS's beta/alpha form: per-step, per-token and
  per-KV-read terms), then refined by replay (`sim.calibrate.fit_by_replay`), with the
  front-end terms `api_overhead_s` (per chunk, out) and `ingress_s` (per request, in).

Both are vectorised over numpy arrays so a decode-only stretch is priced in one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.hardware.spec import HardwareSpec
from servetune.model.spec import ModelSpec
from servetune.plan import roofline
from servetune.plan.memory import MemoryBudget
from servetune.plan.quant import served_format

FEATURES = (
    "const",
    "prefill_tokens",
    "decode_seqs",
    "kv_read_tokens",
    "attn_pairs",
    "prefill_sq",
    "cached_pairs",
)

# Stated defaults of the roofline tier. Achievable HBM bandwidth is ~80-90% of the datasheet
# on H100/A100 streaming kernels (STREAM-like copies); dense GEMMs reach ~50-70% of peak in
# serving (MFU reported by vLLM/SGLang prefill profiles); CPU engines reach much less.
DEFAULT_EFFICIENCY = {
    "gpu": {"mem": 0.80, "flops": 0.55, "step_overhead_s": 2.0e-3, "api_overhead_s": 5.0e-3},
    # A CPU forward pass (oneDNN / ggml) reaches ~50% of DRAM bandwidth and ~30% of the
    # AVX-512 peak; Python-side scheduling costs more per step than on a GPU box.
    "cpu": {"mem": 0.50, "flops": 0.30, "step_overhead_s": 5.0e-3, "api_overhead_s": 5.0e-3},
}


def chunk_attn_pairs(cached: int, n: int) -> float:
    """Causal attention pairs of a prefill chunk of n tokens after `cached` tokens:
    each new token i (0-based) attends to cached + i + 1 keys -> n x cached + n (n + 1) / 2."""
    return n * cached + n * (n + 1) / 2


@dataclass
class StepModel:
    """Prices steps; `tier` labels every prediction it makes."""

    tier: str
    # calibrated: the coefficient vector over FEATURES (seconds per unit)
    coef: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    # roofline: derived coefficients (seconds per unit), see `roofline_model`
    mem_per_kv_token_s: float = 0.0
    flops_per_token_s: float = 0.0
    flops_per_pair_s: float = 0.0
    overhead_s: float = 0.0
    weights_s: object = None  # callable(batch tokens) -> seconds of weight reads
    comm_s: object = None  # callable(batch tokens) -> seconds of TP all-reduce
    # Added to every streamed chunk's arrival (HTTP, detokenise, SSE framing); BLIS alpha_0.
    api_overhead_s: float = 0.0
    # Front-end time before the engine core sees a request (HTTP, tokenise, hand-off to
    # the engine process): ingress_s + ingress_per_token_s x prompt tokens, served one
    # request at a time (vLLM's API server is one asyncio process). It is what breaks the
    # lock-step of a burst: the first request of a burst reaches an idle engine alone and
    # runs a step by itself, the rest arrive during that step and wait for the next one.
    ingress_s: float = 0.0
    ingress_per_token_s: float = 0.0
    # Front-end time each streamed token costs (detokenise, SSE framing: `sim.gpu_step`).
    # The one front end serves ingress and streams, so this is booked on it when a request
    # is handed over: a front end saturated by streams paces the next hand-overs.
    stream_s: float = 0.0
    # Closed loops start at independent phases of their cycle (`sim.phases`) instead of
    # all at once: what a GPU engine's measurements see once its users de-synchronise.
    spread_closed_loop: bool = False
    # First time the engine runs a step of a given token count (calibrated tier, CPU
    # engines): new_shape_s + new_shape_per_token_s x tokens more. vLLM's CPU backend
    # builds a oneDNN primitive per GEMM shape, and its batch is flattened to one token
    # dimension, so every new step size pays it once per engine process (measured here:
    # a 903-token step took 960 ms the first time, then 590 and 495; `Scheduler.shapes`
    # keeps the history). Zero on GPUs, where vLLM pads to captured CUDA-graph sizes.
    new_shape_s: float = 0.0
    new_shape_per_token_s: float = 0.0
    notes: dict[str, float] = field(default_factory=dict)
    # One line for people: the rule behind the figures and the tier's expected error.
    note: str = ""
    # Derived, not arguments: `coef` as plain floats (indexing a numpy array per step costs
    # more than the arithmetic) and the decode lines per batch size (`decode_line`).
    _coef: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _lines: dict[int, tuple[float, float, float, float, float]] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._coef = tuple(float(v) for v in self.coef)

    @property
    def has_shape_cost(self) -> bool:
        return self.new_shape_s > 0 or self.new_shape_per_token_s > 0

    def new_shape_cost_s(self, tokens: int) -> float:
        """Extra seconds of the first step of `tokens` tokens in an engine's life."""
        return self.new_shape_s + self.new_shape_per_token_s * tokens

    def time_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_read_tokens: float,
        attn_pairs: float,
        prefill_sq: float,
        cached_pairs: float = 0.0,
    ) -> float:
        """Seconds of one step with these features (module docstring)."""
        if self.tier == "calibrated":
            c = self._coef
            return (
                c[0]
                + c[1] * prefill_tokens
                + c[2] * decode_seqs
                + c[3] * kv_read_tokens
                + c[4] * attn_pairs
                + c[5] * prefill_sq
                + c[6] * cached_pairs
            )
        tokens = prefill_tokens + decode_seqs
        mem = self.weights_s(tokens) + self.mem_per_kv_token_s * kv_read_tokens
        comp = self.flops_per_token_s * tokens + self.flops_per_pair_s * attn_pairs
        return self.overhead_s + max(mem, comp) + self.comm_s(tokens)

    def extra_passes_s(self, sizes: tuple[int, ...]) -> float:
        """Seconds a step adds for running as more than one forward pass: each pass after
        the first (`sizes`: its tokens; llama.cpp's ubatches, `sim.policies.ubatch_sizes`)
        runs the whole network again. Calibrated: the per-step constant c0 again per pass
        (c0 is fitted on steps of one pass, and on a CPU it is mostly the pass over the
        weights). Roofline: the weight reads (and all-reduce) of a pass of that many
        tokens; the engine's per-step overhead is paid once, and the pass's share of the
        per-token work is already in the step's time."""
        if not sizes:
            return 0.0
        if self.tier == "calibrated":
            return self._coef[0] * len(sizes)
        return sum(self.weights_s(t) + self.comm_s(t) for t in sizes)

    def decode_line(self, batch: int) -> tuple[float, float, float, float, float]:
        """A decode-only step of `batch` sequences as a function of its context sum x:
        base + max(m0 + m1 x, f0 + f1 x) (roofline: weight + KV reads vs FLOPs; calibrated:
        c0 + c_decode b + (c_kv + c_attn) x, the FLOP branch -inf). Cached per batch size:
        the one formula behind `decode_time_s`, `decode_ends_s` and `decode_times_s`."""
        line = self._lines.get(batch)
        if line is None:
            if self.tier == "calibrated":
                c = self._coef
                line = (c[0] + c[2] * batch, 0.0, c[3] + c[4], -math.inf, 0.0)
            else:
                line = (
                    self.overhead_s + self.comm_s(batch),
                    self.weights_s(batch),
                    self.mem_per_kv_token_s,
                    self.flops_per_token_s * batch,
                    self.flops_per_pair_s,
                )
            self._lines[batch] = line
        return line

    def decode_time_s(self, batch: int, context_sum: float, extra_s: float = 0.0) -> float:
        """Seconds of one decode-only step, in plain floats (numpy's per-call overhead
        dominates a one-element array; most steps of a Poisson run are single). `extra_s`:
        what the batch's split into passes adds per step (`extra_passes_s`)."""
        base, m0, m1, f0, f1 = self.decode_line(batch)
        return base + extra_s + max(m0 + m1 * context_sum, f0 + f1 * context_sum)

    def decode_ends_s(
        self, t0: float, batch: int, ctx0: float, n: int, extra_s: float = 0.0
    ) -> list[float]:
        """End times of `n` decode-only steps of an unchanged batch starting at `t0`, the
        context sum growing by `batch` a step. Short stretches (most of a Poisson run's
        jumps) in plain floats, long ones in one numpy pass."""
        if n <= 16:
            base, m0, m1, f0, f1 = self.decode_line(batch)
            base += extra_s
            out, t, x = [], t0, ctx0
            for _ in range(n):
                t += base + max(m0 + m1 * x, f0 + f1 * x)
                out.append(t)
                x += batch
            return out
        ctx = ctx0 + batch * np.arange(n, dtype=np.float64)
        return (t0 + np.cumsum(self.decode_times_s(batch, ctx) + extra_s)).tolist()

    def decode_times_s(self, batch: int, context_sum: np.ndarray) -> np.ndarray:
        """Seconds of decode-only steps of `batch` sequences whose total contexts are
        `context_sum` (one entry per step): the jump over an unchanged batch."""
        base, m0, m1, f0, f1 = self.decode_line(batch)
        return base + np.maximum(m0 + m1 * context_sum, f0 + f1 * context_sum)


def roofline_model(
    model: ModelSpec,
    hw: HardwareSpec,
    cfg: EngineConfig,
    budget: MemoryBudget,
    efficiency: dict[str, float] | None = None,
) -> StepModel:
    """The roofline tier, with its coefficients read off the planner's functions (no
    re-derivation): a decode step at batch 1 and context 0/1 gives the per-token FLOP cost
    and the per-(token, key) attention and KV-read costs; weight reads (MoE-aware) and the
    all-reduce come from `roofline.weight_bytes_read` and `roofline.allreduce_s`."""
    eff = {**DEFAULT_EFFICIENCY["cpu" if hw.kind == "cpu" else "gpu"], **(efficiency or {})}
    fmt = served_format(cfg.dtype, cfg.quantization, model, hw)
    tp = cfg.tensor_parallel_size
    w, kvb = budget.weights_bytes, budget.kv_bytes_per_token

    def step(context: int) -> roofline.StepCost:
        return roofline.decode_step(model, hw, w, kvb, 1, context, fmt.compute, tp)

    s0, s1 = step(0), step(1)
    eta_m, eta_f = eff["mem"], eff["flops"]
    if hw.kind == "cpu" and hw.cores and cfg.threads:
        # A CPU engine with t of the host's cores threads gets t/cores of its FLOPs and,
        # on a small host whose cores each pull their own share, of its bandwidth.
        share = min(cfg.threads, hw.cores) / hw.cores
        eta_m, eta_f = eta_m * share, eta_f * share
    bw = hw.bandwidth_bytes_s * eta_m

    @lru_cache(maxsize=4096)
    def weights_s(tokens: int) -> float:
        return roofline.weight_bytes_read(model, w, max(int(tokens), 1)) / bw

    @lru_cache(maxsize=4096)
    def comm_s(tokens: int) -> float:
        # the pass's all-reduces (Megatron-LM's two a layer), as roofline.decode_step charges them
        return roofline.comm_s(model, hw, tp, max(int(tokens), 1))

    # PP: a token passes every stage in turn; the planner's bounds multiply by pp too.
    pp = cfg.pipeline_parallel_size
    return StepModel(
        tier="roofline",
        mem_per_kv_token_s=(s1.memory_s - s0.memory_s) / eta_m * pp,
        flops_per_token_s=s0.compute_s / eta_f * pp,
        flops_per_pair_s=(s1.compute_s - s0.compute_s) / eta_f * pp,
        overhead_s=eff["step_overhead_s"],
        weights_s=(lambda t: weights_s(int(t)) * pp),
        comm_s=(lambda t: comm_s(int(t)) * pp),
        api_overhead_s=eff["api_overhead_s"],
        notes={k: float(v) for k, v in eff.items()},
    )


def calibrated_model(
    coef: dict[str, float],
    api_overhead_s: float,
    ingress_s: float = 0.0,
    ingress_per_token_s: float = 0.0,
    new_shape_s: float = 0.0,
    new_shape_per_token_s: float = 0.0,
) -> StepModel:
    """The calibrated tier from a profile's coefficients (missing ones are zero)."""
    vec = np.array([float(coef.get(f, 0.0)) for f in FEATURES])
    return StepModel(
        tier="calibrated",
        coef=vec,
        api_overhead_s=api_overhead_s,
        ingress_s=ingress_s,
        ingress_per_token_s=ingress_per_token_s,
        new_shape_s=new_shape_s,
        new_shape_per_token_s=new_shape_per_token_s,
    )
