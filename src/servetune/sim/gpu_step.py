"""The `gpu` step-time tier: one vLLM engine step on an NVIDIA GPU, priced from per-kernel
figures (data/gpu/kernels.yaml, each with its source) instead of one efficiency guess.

A step of `tokens` tokens (prefill chunks + one per decoding sequence) over `seqs`
sequences takes

    t = cpu_step + cpu_per_seq x seqs                      engine CPU: schedule, prepare, sample
      + per_layer x layers                                 kernel launch gaps and tails
      + max(weight bytes / (BW x hbm_eff[dtype]),           linear layers
            FLOPs / (peak x mamf x model_gemm_eff x sustained x tile_eff(tokens)))
      + max(KV read(seqs, KV tokens), attention FLOPs / (peak16 x fa_eff))  one kind of step;
        a hybrid batch (chunk + decodes): the decodes' max(...) + the chunk's FLOPs term
      + 2 x layers x all-reduce(tokens x hidden x 2 B, tp)  (Megatron-LM: two per layer)

- linear layers, on a GPU with a measured GEMM table (data/gpu/gemm_<gpu>.json: H100 SXM,
  H200 and B300, vLLM 0.24.0's kernels as NVIDIA AIConfigurator timed them; a block-scaled
  FP8 checkpoint's at vLLM's block-scaled path, `gemm_kind`) and a dense model in bf16/fp16
  or fp8, or an MoE model whose routed experts are measured (below): the sum of the
  measured times of each layer's GEMMs (fused QKV, output, fused gate-up, down of a dense
  or shared-expert MLP, an MoE router; per-GPU shards) and the LM head at M = sequences (vLLM
  computes logits at one token a sequence, `lm_head_rows`), interpolated between measured
  shapes (`GemmTable.curve_s`, `at_m`), each no faster than the share of its best measured
  rate a GPU held at its power limit keeps (`power_capped`, `sustained_gemm`: the tables
  time bursts at the boost clock), plus the bytes the elementwise kernels between them move
  (norms, SiLU x mul, RoPE) at the 16-bit HBM share. Elsewhere the formula: weight-streaming
  bound at small batches, compute bound from a few hundred tokens on; the compute side at
  the dtype the GEMMs run in (fp8 on Hopper for FP8 checkpoints and `quantization=fp8`,
  plan.quant.weight_format) at the measured maximum achievable matmul rate (MAMF) times the
  share a model's own shapes and the elementwise kernels between the GEMMs leave of it
  (model_gemm_eff) and the sustained clock's share (`sustained_gemm`), less the rows padded
  up to whole GEMM tiles; the LM head's FLOPs at the step's sequences, the rest at its
  tokens. MoE routed experts run as a grouped GEMM: each expert gets tokens x k / E rows,
  padded on its own to the fused-MoE kernel's tiles (`moe_tile_m`); on a GPU with a measured
  fused-MoE table (data/gpu/moe_<gpu>.json: H100 SXM and H200, vLLM 0.24.0's kernels as
  AIConfigurator timed them) that holds the model's shape, they take the measured time
  instead (`measured_moe`) and the GEMM table (or, without one, the weight stream) the
  other weights. The weight stream's
  share of the HBM bandwidth is also the GEMMs' dtype's (`KernelFigures.hbm_for`): vLLM's
  FP8 GEMMs quantise their activations first and stream slower than 16-bit ones.
- attention: decode reads each sequence's KV (`Windowed`): on a GPU with measured decode
  lines (data/gpu/attn_<gpu>.json: H100 SXM, H200, B200, B300: vLLM 0.24.0's kernels as
  AIConfigurator timed them) a floor plus a price per KV token at the step's sequence count,
  elsewhere the KV bytes at attn_eff of the bandwidth; sliding-window layers read at most
  their window of each sequence, and compute at most their window of keys a query
  (`Windowed`). A prefill chunk computes n x cached + n (n+1)/2
  (query, key) pairs at 4 x layers x heads x head_dim FLOPs each (QK^T and AV). In a
  hybrid batch the chunk's compute-bound attention follows the decodes' memory-bound one
  instead of hiding under it: today's kernels do not overlap them (POD-Attention, Kamath
  et al., ASPLOS 2025, is the kernel that does, 28% faster on average).
- the engine's CPU side and front end (ingress per request, streaming per token, the
  engine-to-client latency) come from the engine's entry in the same file; closed-loop
  users start at spread phases of their cycle (`sim.phases`, `spread_closed_loop`). The
  front end is one server for ingress and streaming (`sim.clients`): it hands a burst
  over one request at a time, and once its streams saturate it, it paces new requests
  (vLLM's API server at high concurrency).

Pipeline parallelism multiplies every per-layer term by pp, as the roofline tier does.
The figures, their sources and the published runs that check them: docs/fidelity-gpu.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.hardware.spec import HardwareSpec
from servetune.model.params import layer_split
from servetune.model.spec import ModelSpec
from servetune.plan import roofline
from servetune.plan.kv import kv_heads_per_gpu
from servetune.plan.memory import MemoryBudget
from servetune.plan.quant import WeightFormat, served_format
from servetune.sim.gpu_kernels import (
    GemmTable,
    MoeTable,
    allreduce_s,
    at_m,
    attn_table,
    engine_cpu_figures,
    gemm_table,
    kernel_figures,
    moe_table,
    power_capped,
    tile_efficiency,
)
from servetune.sim.steptime import StepModel


@dataclass(frozen=True)
class Windowed:
    """An attention cost summed over layers, in one quantity of a step: KV tokens read
    (decode) or (query, key) pairs computed (prefill). A fixed part (the kernel's floor),
    a price per unit on full-attention layers, and one on sliding-window layers, which
    count at most `window` per sequence (KV read) or per query token (pairs)."""

    fixed_s: float
    full_s: float  # per unit, over the full-attention layers
    swa_s: float = 0.0  # per unit, over the sliding-window layers
    window: int = 0

    def time_s(self, units: float, rows: int) -> float:
        """Seconds for `units` (the step's sum) over `rows` sequences or query tokens."""
        swa = self.swa_s * min(units, self.window * rows) if self.swa_s else 0.0
        return self.fixed_s + self.full_s * units + swa

    def line(self, rows: int) -> tuple[float, float]:
        """`time_s` as intercept and slope in the units, for sums past the window (a decode
        stretch's line, `GpuStepModel.decode_line`)."""
        return self.fixed_s + self.swa_s * self.window * rows, self.full_s


@dataclass
class GpuStepModel(StepModel):
    """Prices a step from its features (StepModel's interface) with the formula above."""

    cpu_step_s: float = 0.0
    cpu_per_seq_s: float = 0.0
    layers_floor_s: float = 0.0  # launch gaps and kernel tails, per step (per layer x layers)
    # callable(sequences) -> Windowed: decode attention's cost of reading the KV cache
    kv_read_s: Any = None
    pairs_cost: Windowed = Windowed(0.0, 0.0)  # per causal (query, key) pair computed
    linear_s: Any = None  # callable(tokens, sequences) -> seconds of the linear layers
    allreduce_step_s: Any = None  # callable(tokens) -> seconds of the step's all-reduces

    def time_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_read_tokens: float,
        attn_pairs: float,
        prefill_sq: float,
        cached_pairs: float = 0.0,
    ) -> float:
        """Seconds of one step (module docstring): `cached_pairs` are in `attn_pairs`
        already, priced alike on a GPU. The sequences in a step are its
        decoders plus at least one prefilling request when it has prefill tokens."""
        tokens = prefill_tokens + decode_seqs
        seqs = decode_seqs + (1 if prefill_tokens else 0)
        return (
            self.cpu_step_s
            + self.cpu_per_seq_s * seqs
            + self.kernels_s(
                prefill_tokens, decode_seqs, kv_read_tokens, attn_pairs, prefill_sq + cached_pairs
            )
            + self.allreduce_step_s(tokens)
        )

    def kernels_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_read_tokens: float,
        attn_pairs: float,
        chunk_pairs: float = 0.0,
    ) -> float:
        """One GPU's kernels of a step: `time_s` without the engine's CPU side and the
        all-reduces, what a forward pass timed on one GPU holds (validate.steps' device
        rows). `chunk_pairs`: the prefill chunks' share of `attn_pairs`."""
        tokens = prefill_tokens + decode_seqs
        n = max(decode_seqs + (1 if prefill_tokens else 0), 1)
        kv = self.kv_read_s(n).time_s(kv_read_tokens, n)
        if decode_seqs and prefill_tokens:
            # A hybrid batch: the decodes' memory-bound attention, then the chunks'
            # compute-bound one. Today's kernels do not overlap the two (POD-Attention,
            # Kamath et al., ASPLOS 2025: overlapping them saves 28% of attention time on
            # average against independently optimised prefill and decode kernels).
            decode = max(kv, self.pairs_cost.time_s(attn_pairs - chunk_pairs, decode_seqs))
            attn = decode + self.pairs_cost.time_s(chunk_pairs, prefill_tokens)
        else:
            attn = max(kv, self.pairs_cost.time_s(attn_pairs, max(tokens, 1)))
        return self.layers_floor_s + self.linear_s(tokens, n) + attn

    def decode_line(self, batch: int) -> tuple[float, float, float, float, float]:
        """A decode-only step of `batch` sequences against its context sum x:
        base + max(kv0 + kv1 x, f0 + f1 x), the base holding CPU, linear layers and
        all-reduces (StepModel.decode_line's form); the KV line takes each sequence's
        sliding-window layers as full (contexts past the window, `Windowed.line`)."""
        line = self._lines.get(batch)
        if line is None:
            base = (
                self.cpu_step_s
                + self.layers_floor_s
                + self.cpu_per_seq_s * batch
                + self.linear_s(batch, batch)
                + self.allreduce_step_s(batch)
            )
            kv0, kv1 = self.kv_read_s(batch).line(batch)
            f0, f1 = self.pairs_cost.line(batch)
            line = (base, kv0, kv1, f0, f1)
            self._lines[batch] = line
        return line

    def extra_passes_s(self, sizes: tuple[int, ...]) -> float:
        """vLLM runs a step as one forward pass; llama.cpp's ubatches never reach here."""
        return sum(self.linear_s(t, t) + self.allreduce_step_s(t) for t in sizes)


def window_layers(model: ModelSpec) -> tuple[int, int, int]:
    """Full-attention layers, sliding-window layers and the window (the model's config:
    gpt-oss alternates the two, Gemma 2/3 interleave them, Mistral v0.1 slides on all)."""
    swa = model.sliding_window_layers if model.sliding_window else 0
    return model.num_layers - swa, swa, model.sliding_window or 0


def kv_reader(
    model: ModelSpec,
    hw: HardwareSpec,
    budget: MemoryBudget,
    tp: int,
    pp: int,
    kv_dtype: str,
    attn_eff: float,
    floor_s: float,
) -> tuple[Any, bool]:
    """callable(sequences) -> Windowed, and whether it reads measured lines: the GPU's
    measured decode-attention lines (data/gpu/attn_<gpu>.json: vLLM 0.24.0's kernels as
    AIConfigurator timed them) where they hold the model's per-GPU
    shape, else the KV bytes streamed at `attn_eff` of the HBM bandwidth above `floor_s` a
    layer. Every layer term times pp, as the rest of the tier."""
    layers = model.num_layers
    full_layers, swa_layers, window = window_layers(model)
    table = attn_table(hw.name) if model.mla is None else None
    heads = model.num_attention_heads // tp
    shape = (kv_dtype, heads, kv_heads_per_gpu(model, tp), model.head_dim)

    def over_layers(fixed: float, per_token: float) -> Windowed:
        """One layer's floor and price per KV token, summed over the layers."""
        return Windowed(
            layers * fixed * pp, full_layers * per_token * pp, swa_layers * per_token * pp, window
        )

    if table is None or table.line(*shape, 1) is None:
        per_token = budget.kv_bytes_per_token / layers / (hw.bandwidth_bytes_s * attn_eff)
        flat = over_layers(floor_s, per_token)
        return (lambda seqs: flat), False

    @lru_cache(maxsize=4096)
    def read(seqs: int) -> Windowed:
        return over_layers(*table.line(*shape, seqs))  # type: ignore[misc]

    return read, True


def routed_experts(model: ModelSpec) -> tuple[float, float]:
    """Routed-expert weights one token multiplies (k experts x 3 gated-MLP matrices on every
    MoE layer) and the share of a batch's tokens each expert gets (k / E, uniform routing);
    (0, 0) for dense models."""
    moe = model.moe
    if moe is None:
        return 0.0, 0.0
    layers = model.num_layers - moe.first_dense_layers
    params = layers * moe.experts_per_token * 3 * model.hidden_size * moe.expert_intermediate_size
    return float(params), moe.experts_per_token / moe.num_experts


def moe_dtype(fmt: WeightFormat) -> str | None:
    """The measured MoE table's dtype for experts stored in `fmt` (scripts/
    moe_table_from_aic.py): GPT-OSS's MXFP4, FP8 (vLLM's Fp8MoEMethod), 16-bit; None for
    formats the table has not timed (int4, GGUF), which the formula prices."""
    if fmt.name == "mxfp4":
        return "mxfp4"
    if fmt.compute == "fp8":
        return "fp8"
    if fmt.compute in ("bf16", "fp16") and fmt.class_bits.get("experts", fmt.body_bits) == 16:
        return "bf16"
    return None


def measured_moe(
    model: ModelSpec, fmt: WeightFormat, table: MoeTable | None, tp: int, kept: float = 1.0
) -> tuple[Any, float] | None:
    """The routed experts of every MoE layer from measured fused-MoE times (callable:
    tokens -> seconds) and the expert weight bytes one GPU holds (which the formula's
    weight stream then leaves out); None where the table lacks the model's shape."""
    moe = model.moe
    if moe is None or table is None or model.mla is not None:
        return None
    dtype = moe_dtype(fmt)
    inter = moe.expert_intermediate_size
    curve = (
        None
        if dtype is None
        else table.curve_s(
            dtype, model.hidden_size, inter, moe.num_experts, moe.experts_per_token, tp
        )
    )
    if curve is None:
        return None
    layers = model.num_layers - moe.first_dense_layers
    bits = fmt.class_bits.get("experts", fmt.body_bits)
    expert_bytes = layers * moe.num_experts * 3 * model.hidden_size * inter * bits / 8 / tp
    grid = table.tokens
    curve = power_capped(grid, curve, kept)

    def experts_s(tokens: int) -> float:
        return layers * at_m(grid, curve, max(int(tokens), 1))

    return experts_s, expert_bytes


def moe_tile_m(tokens: int, experts: int) -> int:
    """Rows of one tile of vLLM's fused-MoE GEMM (the Triton kernel's BLOCK_SIZE_M in
    vllm/model_executor/layers/fused_moe/fused_moe.py `get_default_config`): 16 while the
    step's tokens are no more than the experts, 64 past that. Not the dense GEMMs' 128:
    an expert that gets 2 of a step's rows pads them to 16, not to 128."""
    return 16 if tokens <= experts else 64


def layer_gemms(model: ModelSpec, tp: int) -> list[tuple[int, int, int]]:
    """(layers, N, K) of the GEMMs one GPU runs in the model's linear layers under `tp`-way
    tensor parallelism (Megatron-LM's split, as vLLM shards them), routed experts left out
    (`measured_moe` prices them): every layer's fused QKV (column-parallel) and output
    projection (row-parallel), a dense MLP layer's fused gate-up and down, an MoE layer's
    shared experts alike; KV heads are replicated when there are fewer than GPUs."""
    q, kv = shard_heads(model, tp)
    h = model.hidden_size
    dense_layers, moe_layers = layer_split(model)
    gemms = [(model.num_layers, q + 2 * kv, h), (model.num_layers, h, q)]
    for layers, inter in (
        (dense_layers, model.intermediate_size // tp),
        (moe_layers, shared_intermediate(model) // tp),
    ):
        if layers and inter:
            gemms += [(layers, 2 * inter, h), (layers, h, inter)]
    return gemms


def shared_intermediate(model: ModelSpec) -> int:
    """Width of an MoE layer's shared experts together (0 without any)."""
    moe = model.moe
    return moe.num_shared_experts * moe.shared_expert_intermediate_size if moe else 0


def elementwise_bytes_per_token(model: ModelSpec, tp: int) -> int:
    """HBM bytes one token moves over all layers through the kernels between the GEMMs,
    16-bit activations (vLLM's llama-style layer): two fused residual-add RMSNorms over
    the full hidden state (read x and residual, write both: 4 x hidden each) and rotary
    embedding in place on the query and key shards (read and write) in every layer, SiLU x
    mul over a dense or shared-expert gate-up shard (read 2 x inter, write inter); the
    routed experts' activation is inside the fused-MoE kernel `measured_moe` times."""
    q, kv = shard_heads(model, tp)
    dense_layers, moe_layers = layer_split(model)
    per_layer = 8 * model.hidden_size + 2 * (q + kv)
    silu = dense_layers * (model.intermediate_size // tp)
    silu += moe_layers * (shared_intermediate(model) // tp)
    return 2 * (model.num_layers * per_layer + 3 * silu)


def shard_heads(model: ModelSpec, tp: int) -> tuple[int, int]:
    """Query and key (= value) widths one GPU holds under `tp`-way tensor parallelism
    (KV heads as the KV cache holds them, `plan.kv.kv_heads_per_gpu`)."""
    kv = kv_heads_per_gpu(model, tp) * model.head_dim
    return model.num_attention_heads * model.head_dim // tp, kv


def measured_linear(
    table: GemmTable, model: ModelSpec, dtype: str, tp: int, stream_bytes_s: float, kept: float
) -> Any:
    """Linear layers from measured GEMM times (callable: tokens, sequences -> seconds),
    routed experts left out: the GEMMs of `layer_gemms` at `dtype` at M = tokens, an MoE
    layer's router (vLLM keeps it 16-bit and whole on every GPU) and the 16-bit LM head
    (vLLM keeps it unquantised) at M = sequences (`lm_head_rows`); each GEMM no faster than
    `kept` of its best measured rate (`power_capped`: a loaded GPU at its power limit);
    plus the elementwise kernels between them, streamed at `stream_bytes_s` (the table's
    FP8 times hold the activation quantisation; the fitted per-layer floor holds every
    kernel's launch)."""
    grid = table.m
    head = (max(model.vocab_size // tp, 1), model.hidden_size)
    # seconds at each measured M, summed once: a step then reads one curve per M
    body = sum(
        layers * power_capped(grid, table.curve_s(dtype, n, k), kept)
        for layers, n, k in layer_gemms(model, tp)
    )
    moe_layers = layer_split(model)[1]
    if model.moe is not None and moe_layers:
        router = table.curve_s("bf16", model.moe.num_experts, model.hidden_size)
        body = body + moe_layers * power_capped(grid, router, kept)
    head_curve = power_capped(grid, table.curve_s("bf16", *head), kept)
    elementwise_s = elementwise_bytes_per_token(model, tp) / stream_bytes_s

    def linear(tokens: int, seqs: int) -> float:
        t = max(int(tokens), 1)
        return (
            at_m(grid, body, t)
            + at_m(grid, head_curve, lm_head_rows(t, seqs))
            + (t * elementwise_s)
        )

    return linear


MARLIN_TILE_M = 16  # rows of a Marlin tensor-core fragment (m16 mma; IST-DASLab/marlin)


def dense_bits(fmt: WeightFormat) -> float:
    """Bits a weight of the dense GEMMs (attention, MLP): a checkpoint's own scheme keeps
    them in `class_bits` beside a 16-bit body (`plan.quant.scheme_format`)."""
    bits = [fmt.class_bits[c] for c in ("attention", "mlp") if c in fmt.class_bits]
    return min(bits) if bits else fmt.body_bits


def weight_only(fmt: WeightFormat) -> bool:
    """Weights stored narrower than the 16-bit activations they multiply (AWQ, GPTQ):
    dequantised inside the GEMM, so the GEMM streams the narrow weights. A checkpoint's
    own AWQ/GPTQ/W4A16 reads its classes' bits: its 16-bit body had priced it at bf16's
    measured GEMMs (Llama-3.1-8B AWQ: TPOT 8.66 ms, as bf16; `--set quantization=awq`
    5.19)."""
    return fmt.compute in ("bf16", "fp16") and dense_bits(fmt) < 16


def gemm_kind(fmt: WeightFormat, table: GemmTable | None) -> str | None:
    """The measured table's dtype for GEMMs in `fmt`: 16-bit formats share bf16's kernels;
    a checkpoint's block-scaled FP8 runs vLLM's block-scaled path (`fp8_block`, where the
    GPU's table has it, else the per-token FP8 one). None for weight-only formats (AWQ,
    GPTQ: 4-bit weights, 16-bit activations): their kernels (Marlin's) stream a quarter of
    the bytes a 16-bit GEMM of the table does, so the formula prices them (its weight
    stream at the format's bits, its FLOPs at the 16-bit peak)."""
    if weight_only(fmt):
        return None
    if fmt.compute == "fp16":
        return "bf16"
    if fmt.compute == "fp8" and fmt.block_scaled and table is not None:
        return "fp8_block" if "fp8_block" in table.us else "fp8"
    return fmt.compute


def lm_head_rows(tokens: int, seqs: int) -> int:
    """Rows the LM head multiplies in a step: one a sequence, not one a token. vLLM
    computes logits only at each scheduled request's last token (the model runner's
    `logits_indices`, partial prefill chunks included, their samples discarded)."""
    return max(min(int(seqs), int(tokens)), 1)


def gpu_model(
    model: ModelSpec, hw: HardwareSpec, cfg: EngineConfig, budget: MemoryBudget
) -> GpuStepModel:
    """The `gpu` tier for `model` under `cfg` on `hw`, from the planner's memory budget
    (weights and KV bytes per GPU) and the kernel figures of `hw`."""
    fig = kernel_figures(hw)
    cpu, cpu_rule = engine_cpu_figures(cfg.engine, cfg.engine_version)
    fmt = served_format(cfg.dtype, cfg.quantization, model, hw)
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    weights = budget.weights_bytes
    bw = hw.bandwidth_bytes_s
    hbm_eff = fig.hbm_for(fmt.compute)
    gemm_flops_s = (
        hw.peak_flops(fmt.compute)
        * fig.mamf_for(fmt.compute)
        * fig.model_gemm_eff
        * fig.sustained_gemm
    )
    expert_params, rows_per_expert = routed_experts(model)
    n_experts = model.moe.num_experts if model.moe is not None else 0
    flops_per_token = 2 * (model.params_matmul_active - expert_params) / tp
    head_flops = 2 * model.vocab_size * model.hidden_size / tp  # per row (`lm_head_rows`)
    expert_flops_per_token = 2 * expert_params / tp
    attn16_flops_s = hw.peak_flops("bf16") * fig.fa_eff
    heads = model.num_attention_heads
    pair_s = 4 * heads * model.head_dim / tp / attn16_flops_s * pp  # one layer's pair
    full_layers, swa_layers, window = window_layers(model)
    layers = model.num_layers

    # routed experts from measured fused-MoE times where the GPU's table has the shape
    moe_measured = measured_moe(model, fmt, moe_table(hw.name), tp, fig.sustained_gemm)
    # measured GEMM times where the GPU has a table in the GEMMs' dtype and the model's
    # routed experts (if any) are measured too; the formula below (MAMF, tiles, HBM share)
    # everywhere else
    table = gemm_table(hw.name)
    gemm_dtype = gemm_kind(fmt, table)
    # Weight-only formats (AWQ, GPTQ) run Marlin's kernels: 16-row tensor-core fragments,
    # "close to ideal (4x) speedups up to batchsizes of 16-32 tokens" over FP16 weights
    # (IST-DASLab/marlin's README), so a decode batch streams their 4-bit weights instead
    # of padding M to a 128-row CUTLASS tile.
    tile_m = MARLIN_TILE_M if weight_only(fmt) else fig.gemm_tile_m
    measured = None
    priced = model.mla is None and (model.moe is None or moe_measured is not None)
    if table is not None and priced and gemm_dtype is not None and gemm_dtype in table.us:
        measured = measured_linear(
            table, model, gemm_dtype, tp, bw * fig.hbm_for("bf16"), fig.sustained_gemm
        )

    kv_dtype = "fp8" if budget.kv_dtype_bytes == 1 else "bf16"  # the planner's pool
    kv_read_s, kv_measured = kv_reader(
        model, hw, budget, tp, pp, kv_dtype, fig.attn_eff, fig.attn_floor_s
    )

    @lru_cache(maxsize=8192)
    def linear(tokens: int, seqs: int) -> float:
        t = max(int(tokens), 1)
        if measured is not None:
            return measured(t, seqs) + (moe_measured[0](t) if moe_measured else 0.0)
        flops = flops_per_token * t - head_flops * (t - lm_head_rows(t, seqs))
        compute = flops / (gemm_flops_s * tile_efficiency(t, tile_m))
        if moe_measured is not None:
            experts_s, expert_bytes = moe_measured
            read = max(weights - expert_bytes, 0.0) / (bw * hbm_eff)
            return max(read, compute) * pp + experts_s(t)  # experts_s: all layers
        read = roofline.weight_bytes_read(model, weights, t) / (bw * hbm_eff)
        if expert_flops_per_token:
            # grouped GEMM: each expert's rows are padded to whole tiles on their own
            per_expert = max(1, round(t * rows_per_expert))
            eff = tile_efficiency(per_expert, moe_tile_m(t, n_experts))
            compute += expert_flops_per_token * t / (gemm_flops_s * eff)
        return max(read, compute) * pp

    @lru_cache(maxsize=8192)
    def comm(tokens: int) -> float:
        t = max(int(tokens), 1)
        calls = roofline.tp_allreduces(model)
        return sum(n * allreduce_s(fig, tp, t * width * nbytes) for n, width, nbytes in calls) * pp

    sm = GpuStepModel(
        tier="gpu",
        cpu_step_s=cpu["step_s"],
        cpu_per_seq_s=cpu["per_seq_s"],
        layers_floor_s=fig.per_layer_s * layers * pp,
        kv_read_s=kv_read_s,
        pairs_cost=Windowed(0.0, full_layers * pair_s, swa_layers * pair_s, window),
        linear_s=linear,
        allreduce_step_s=comm,
        api_overhead_s=cpu["api_overhead_s"],
        ingress_s=cpu["ingress_s"],
        ingress_per_token_s=cpu["ingress_per_token_s"],
        stream_s=cpu["stream_s"],
        spread_closed_loop=True,
        # The roofline tier's keys, with the same meaning (HBM and GEMM shares of the
        # datasheet, step and chunk overheads), so stored runs of either tier read alike.
        notes={
            "mem": hbm_eff,
            "flops": fig.mamf_for(fmt.compute),
            "step_overhead_s": cpu["step_s"],
            "api_overhead_s": cpu["api_overhead_s"],
        },
    )
    sm.note = fig.rule
    if measured is not None and table is not None:
        sm.note += (
            f"; GEMMs at {table.engine} kernels' measured times (AIConfigurator's tables, "
            f"data/gpu/gemm_{hw.name}.json)"
        )
        if gemm_dtype == "fp8_block":
            sm.note += "; block-scaled FP8 weights at vLLM's block-scaled GEMMs"
    elif table is not None and gemm_dtype is None:
        sm.note += (
            f"; GEMMs by the formula: {fmt.name}'s {dense_bits(fmt):.1f}-bit weights with "
            "16-bit activations are not in the measured tables"
        )
    attn = attn_table(hw.name)
    if kv_measured and attn is not None:
        sm.note += (
            f"; decode attention at vLLM 0.24.0's measured {' / '.join(attn.kernels)} times "
            f"(AIConfigurator's tables, data/gpu/attn_{hw.name}.json)"
        )
    if moe_measured is not None:
        sm.note += (
            "; routed experts at vLLM 0.24.0's measured fused-MoE times (AIConfigurator's "
            f"tables, data/gpu/moe_{hw.name}.json)"
        )
    sm.note += f"; {cpu_rule}"
    return sm
