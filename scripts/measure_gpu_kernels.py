"""Time, on a real NVIDIA GPU, the kernels the `gpu` step-time tier prices, so that its
packaged tables (data/gpu/gemm_<gpu>.json: NVIDIA AIConfigurator's vLLM 0.24.0 timings)
can be checked against a machine of our own.

Measured, each as vLLM runs it on a GPU:
- the linear layers of the held-out set's models (Llama-3.1-8B, Llama-3.1-70B, Qwen3-32B),
  per-GPU shards at TP 1-8, at M = 1-8192 tokens, in bf16 (`torch.nn.functional.linear`)
  and FP8 (`torch._scaled_mm`, per-token activation scales and per-channel weight scales,
  with and without the activation quantisation before it, vLLM's w8a8 path: unfused
  torch ops, and one kernel compiled by torch.compile as vLLM's own);
  replayed from a CUDA graph (vLLM's decode) and cycling over copies of the weight that
  together exceed the L2 cache (a model's layers do not find their weights in L2);
- the launch gap of one kernel replayed from a CUDA graph (what `per_layer_us` carries);
- HBM copy bandwidth;
- causal prefill attention (torch SDPA's cuDNN and FlashAttention-2 backends);
- whole forward passes of one GPU's shard of Llama-3.1-8B (bf16 and FP8, TP 1 and 4),
  Llama-3.1-70B (FP8, TP 2 and 8) and Qwen3-32B (bf16, TP 2 and 8): decode, prefill and
  mixed steps;
- a breakdown of lone prefills (whole, cuDNN attention, no attention, GEMMs alone);
- one GEMM sustained for 2 ms to 2 s, with the SM clock and power sampled (NVML).

Needs only PyTorch with CUDA (not servetune: the GPU machine has no servetune
dependencies). Writes one JSON file (parts: kernels, steps or steps:MODEL:TP:DTYPE,
breakdown:MODEL:TP:DTYPE, sustained, sustained_more; kernels and steps by default):
    python scripts/measure_gpu_kernels.py OUT.json [kernels] [steps | steps:llama-3.1-70b:2:fp8 ...]
        [breakdown:qwen3-32b:2:bf16 ...]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Per-GPU linear shards (name, N out, K in) of a model at TP size tp: Megatron-LM
# column-parallel QKV and gate/up, row-parallel O and down (Shoeybi et al., 2019).
MODELS = {
    # hidden, query heads, KV heads, head size, FFN (HF config.json of each model)
    "llama-3.1-8b": (4096, 32, 8, 128, 14336),
    "llama-3.1-70b": (8192, 64, 8, 128, 28672),
    "qwen3-32b": (5120, 64, 8, 128, 25600),
}
TPS = {"llama-3.1-8b": (1, 4), "llama-3.1-70b": (1, 2, 4, 8), "qwen3-32b": (1, 2, 4, 8)}
# layers, vocabulary; Qwen3 also normalises each query and key head (q_norm, k_norm)
DEPTH = {"llama-3.1-8b": (32, 128256), "llama-3.1-70b": (80, 128256), "qwen3-32b": (64, 151936)}
M_ROWS = (1, 8, 32, 128, 512, 2048, 8192)
# Whole forward passes: the small-model row (Llama-3.1-8B FP8 at TP4) and TP1, and
# the held-out set's larger models on one GPU's shard (`steps` runs them all; `steps:MODEL:
# TP:DTYPE` one)
STEP_CONFIGS = (
    ("llama-3.1-8b", 1, "bf16"),
    ("llama-3.1-8b", 1, "fp8"),
    ("llama-3.1-8b", 4, "fp8"),
    ("llama-3.1-70b", 2, "fp8"),
    ("llama-3.1-70b", 8, "fp8"),
    ("qwen3-32b", 2, "bf16"),
    ("qwen3-32b", 8, "bf16"),
)
L2_BYTES = 60 * 2**20  # H100/H200 L2 (50/60 MB); the weights cycled must exceed it
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def shards(model: str, tp: int) -> list[tuple[str, int, int]]:
    h, q, kv, d, ffn = MODELS[model]
    kv_tp = max(kv // tp, 1)
    return [
        ("qkv", (q // tp + 2 * kv_tp) * d, h),
        ("o", h, q * d // tp),
        ("gate_up", 2 * ffn // tp, h),
        ("down", h, ffn // tp),
    ]


def graph_time_us(fn, calls: int, replays: int = 3) -> float:
    """Microseconds per call of `fn(i)` for i in range(calls), captured once in a CUDA
    graph and replayed: the median of `replays` timed replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(calls, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    del g
    return sorted(times)[len(times) // 2]


def eager_time_us(fn, calls: int) -> float:
    """Microseconds per call launched one by one from Python (CPU launch cost included
    where the kernels are shorter than it)."""
    for i in range(min(calls, 3)):
        fn(i)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(calls):
        fn(i)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / calls


def calls_for(m: int, n: int, k: int) -> int:
    """Calls per graph: ~10 ms of GPU work, 4 at least, 300 at most."""
    est_us = max(2 * m * n * k / 600e12, 2 * n * k / 3.5e12) * 1e6 + 4
    return int(min(300, max(4, 10_000 / est_us)))


def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-6) / FP8_MAX
    return (x.float() / s).to(torch.float8_e4m3fn), s


quant_fused = torch.compile(_quant, dynamic=True)


def time_gemm(row: dict, w16: list, w8: list, sw: torch.Tensor) -> None:
    """Add to `row` the times of its M x K by K x N GEMM in bf16 and FP8 (graph and eager),
    cycling over the weight copies."""
    m, k, copies = row["m"], row["k"], len(w16)
    x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x8 = x16.to(torch.float8_e4m3fn)
    sx = torch.rand(m, 1, device="cuda", dtype=torch.float32) + 0.5

    def bf16(i: int) -> torch.Tensor:
        return F.linear(x16, w16[i % copies])

    def scaled(i: int, xq: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(
            xq, w8[i % copies].t(), scale_a=s, scale_b=sw, out_dtype=torch.bfloat16
        )

    def fp8_noquant(i: int) -> torch.Tensor:
        return scaled(i, x8, sx)

    def fp8(i: int) -> torch.Tensor:
        # vLLM's dynamic per-token activation quantisation as unfused torch ops, then the GEMM
        return scaled(i, *_quant(x16))

    def fp8_fused(i: int) -> torch.Tensor:
        # the same with the quantisation in one compiled kernel, as vLLM's own
        return scaled(i, *quant_fused(x16))

    calls = calls_for(m, row["n"], k)
    variants = (
        ("bf16", bf16),
        ("fp8_noquant", fp8_noquant),
        ("fp8", fp8),
        ("fp8_fused", fp8_fused),
    )
    for key, fn in variants:
        try:
            row[f"{key}_graph_us"] = round(graph_time_us(fn, calls), 3)
            row[f"{key}_eager_us"] = round(eager_time_us(fn, min(calls, 50)), 3)
        except Exception as e:  # a shape a kernel refuses: recorded, not fatal
            row[f"{key}_error"] = str(e).splitlines()[0][:200]


def gemm_rows() -> list[dict]:
    rows = []
    seen = set()
    for model, tps in TPS.items():
        for tp in tps:
            for name, n, k in shards(model, tp):
                if (n, k) in seen:
                    continue
                seen.add((n, k))
                copies = max(1, min(64, math.ceil(4 * L2_BYTES / (n * k * 2))))
                w16 = [
                    torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)
                ]
                w8 = [w.to(torch.float8_e4m3fn) for w in w16]
                sw = torch.rand(1, n, device="cuda", dtype=torch.float32) + 0.5
                for m in M_ROWS:
                    row = {"model": model, "tp": tp, "layer": name, "m": m, "n": n, "k": k}
                    time_gemm(row, w16, w8, sw)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del w16, w8
                torch.cuda.empty_cache()
    return rows


def launch_gap_us() -> dict:
    """One tiny kernel replayed from a CUDA graph, 2,000 in a row: the gap a kernel costs
    whatever its work (the floor of `per_layer_us`)."""
    x = torch.zeros(1, device="cuda")
    return {
        "tiny_add_graph_us": round(graph_time_us(lambda i: x.add_(1), 2000), 3),
        "tiny_add_eager_us": round(eager_time_us(lambda i: x.add_(1), 2000), 3),
    }


def copy_bandwidth() -> dict:
    a = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    b = torch.empty_like(a)
    us = graph_time_us(lambda i: b.copy_(a), 20)
    return {
        "bytes": 2**30,
        "us": round(us, 2),
        "read_plus_write_tb_s": round(2 * 2**30 / us / 1e6, 3),
    }


def prefill_attention() -> list[dict]:
    rows = []
    for heads, kv in ((64, 8), (32, 8), (16, 2), (8, 1), (4, 1)):
        for t in (512, 1024, 2048, 4096, 8192, 16384):
            q = torch.randn(1, heads, t, 128, device="cuda", dtype=torch.bfloat16)
            # KV heads repeated to the query heads (GQA's FLOPs are the same; not every
            # backend takes enable_gqa)
            k = torch.randn(1, kv, t, 128, device="cuda", dtype=torch.bfloat16)
            k = k.repeat_interleave(heads // kv, dim=1)
            v = torch.randn_like(k)
            flops = 4 * t * t / 2 * heads * 128  # causal: half of QK^T and PV
            row = {"q_heads": heads, "kv_heads": kv, "tokens": t, "causal_flops": flops}

            def sdpa(i: int, q=q, k=k, v=v) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            for name, backend in (
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("flash", SDPBackend.FLASH_ATTENTION),
            ):
                try:
                    with sdpa_kernel(backend):
                        us = eager_time_us(sdpa, 10)
                    row[f"{name}_us"] = round(us, 2)
                    row[f"{name}_tflops"] = round(flops / us / 1e6, 1)
                except Exception as e:
                    row[f"{name}_error"] = str(e).splitlines()[0][:200]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w).to(x.dtype)


def _add_rms(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor):
    res = x + res
    return _rms(res, w), res


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, 128], neox-style halves (Llama)
    a, b = x[..., :64].float(), x[..., 64:].float()
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(x.dtype)


def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def model_steps(
    model: str = "llama-3.1-8b",
    tp: int = 1,
    dtype: str = "bf16",
    ctx: int = 2048,
    breakdown: bool = False,
) -> list[dict]:
    """Whole forward passes of one GPU's `tp`-way shard of `model` (random weights; bf16,
    or FP8 weights with per-token activation quantisation in one compiled kernel), as vLLM
    runs them: elementwise kernels fused by torch.compile, replayed from a CUDA graph. The
    steps: decodes of B sequences with `ctx` tokens of KV each (each KV head's query heads
    as its rows), lone causal prefills of T tokens, and mixed steps (a prefill chunk
    beside B decodes, chunked prefill). All-reduces are not run (one GPU). The LM head is
    timed apart: vLLM computes logits for one token a sequence. `breakdown`: lone prefills
    only, whole and without attention or without anything but the GEMMs."""
    h, nq, nkv, d, ffn = MODELS[model]
    nq, nkv, ffn = nq // tp, max(nkv // tp, 1), ffn // tp
    layers, vocab = DEPTH[model]
    qk_norm = model.startswith("qwen3")
    add_rms, rms, rope, silu_mul = (
        torch.compile(f, dynamic=True) for f in (_add_rms, _rms, _rope, _silu_mul)
    )

    def w(n: int, k: int) -> torch.Tensor:
        x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        return x.to(torch.float8_e4m3fn) if dtype == "fp8" else x

    ws = [(w((nq + 2 * nkv) * d, h), w(h, nq * d), w(2 * ffn, h), w(h, ffn)) for _ in range(layers)]
    scales = {n: torch.ones(1, n, device="cuda") for n in ((nq + 2 * nkv) * d, h, 2 * ffn)}

    def linear(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        if dtype == "bf16":
            return F.linear(x, wt)
        xq, sx = quant_fused(x)
        return torch._scaled_mm(
            xq, wt.t(), scale_a=sx, scale_b=scales[wt.shape[0]], out_dtype=torch.bfloat16
        )

    norm = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    head_norm = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    head = torch.randn(vocab // tp, h, device="cuda", dtype=torch.bfloat16) * 0.02
    group = nq // nkv
    cudnn = SDPBackend.CUDNN_ATTENTION
    rows: list[dict] = []
    tag = {"model": model, "tp": tp, "dtype": dtype}

    def forward(x: torch.Tensor, attend, gemms_only: bool = False) -> torch.Tensor:
        """The shard's layers; `gemms_only` leaves out everything but the GEMMs (a
        breakdown's baseline: the activations pass through unnormalised)."""
        t = x.shape[0]
        cos = torch.ones(t, 1, d // 2, device="cuda")
        sin = torch.zeros(t, 1, d // 2, device="cuda")
        res = torch.zeros_like(x)
        for i, (wqkv, wo, wgu, wd) in enumerate(ws):
            if gemms_only:
                qkv = linear(x, wqkv)
                y = linear(qkv[:, : nq * d].contiguous(), wo)
                x = linear(linear(y, wgu)[:, :ffn].contiguous(), wd)
                continue
            y, res = add_rms(x, res, norm)
            q, k, v = linear(y, wqkv).split((nq * d, nkv * d, nkv * d), dim=-1)
            q, k = q.reshape(t, nq, d), k.reshape(t, nkv, d)
            if qk_norm:
                q, k = rms(q, head_norm), rms(k, head_norm)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            o = attend(i, q, k, v.view(t, nkv, d))
            y, res = add_rms(linear(o.reshape(t, nq * d), wo), res, norm)
            x = linear(silu_mul(linear(y, wgu)), wd)
        return rms(x + res, norm)

    def causal(q, k, v, backend=None):
        """Causal attention over one prompt. torch picks the kernel (FlashAttention-2 for
        grouped heads) unless `backend` names one: cuDNN's fused attention (FlashAttention-3
        class on Hopper) takes no grouped heads, so the KV heads are repeated to the query
        heads for it."""
        if backend is not None:
            k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                is_causal=True,
                enable_gqa=backend is None,
            )
        return o.squeeze(0).transpose(0, 1)

    def timed(row: dict, fn, replays: int) -> None:
        try:
            row["us"] = round(graph_time_us(fn, 1, replays=replays), 1)
        except Exception as e:  # recorded, the other steps still run
            row["error"] = str(e)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)

    if breakdown:
        # lone prefills four ways: whole (with cuDNN's attention too); attention replaced
        # by its input (the difference is attention in the forward pass); GEMMs alone (the
        # further difference is the norms, RoPE, SiLU x mul and residual adds between them)
        for tokens in (512, 2048, 8192):
            x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
            for kind, fn in (
                ("prefill", lambda i, x=x: forward(x, lambda i, q, k, v: causal(q, k, v))),
                (
                    "prefill_cudnn_attention",
                    lambda i, x=x: forward(x, lambda i, q, k, v: causal(q, k, v, cudnn)),
                ),
                ("prefill_no_attention", lambda i, x=x: forward(x, lambda i, q, k, v: q)),
                ("prefill_gemms_only", lambda i, x=x: forward(x, None, gemms_only=True)),
            ):
                timed({**tag, "kind": kind, "tokens": tokens}, fn, 3)
        return rows

    for batch, prefill in ((1, 0), (8, 0), (32, 0), (128, 0), (128, 2560), (32, 2048)):
        kc = [
            torch.randn(batch, nkv, ctx + 1, d, device="cuda", dtype=torch.bfloat16)
            for _ in range(layers)
        ]
        vc = [torch.randn_like(c) for c in kc]

        def attend(i, q, k, v, kc=kc, vc=vc, batch=batch, prefill=prefill):
            kc[i][:, :, ctx] = k[prefill:]
            vc[i][:, :, ctx] = v[prefill:]
            qg = q[prefill:].reshape(batch, nkv, group, d)  # a KV head's query heads as rows
            o = F.scaled_dot_product_attention(qg, kc[i], vc[i]).reshape(batch, nq, d)
            if prefill:
                o = torch.cat((causal(q[:prefill], k[:prefill], v[:prefill]), o))
            return o

        x = torch.randn(prefill + batch, h, device="cuda", dtype=torch.bfloat16)
        kind = "mixed" if prefill else "decode"
        row = {**tag, "kind": kind, "seqs": batch, "ctx": ctx, "prefill_tokens": prefill}
        timed(row, lambda i, x=x, attend=attend: forward(x, attend), 5)
        del kc, vc
        torch.cuda.empty_cache()

    for tokens in (512, 2048, 8192):
        x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
        row = {**tag, "kind": "prefill", "tokens": tokens}
        timed(row, lambda i, x=x: forward(x, lambda i, q, k, v: causal(q, k, v)), 3)
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        row = {**tag, "kind": "lm_head", "m": m}
        timed(row, lambda i, x=x: F.linear(x, head), 3)
    return rows


SUSTAINED = (  # (N, K, M rows, dtype): compute-bound prefill GEMMs, and decode-sized ones
    (28672, 4096, 2048, "bf16"),
    (57344, 8192, 8192, "bf16"),
)
SUSTAINED_MORE = (
    (57344, 8192, 8192, "fp8"),
    (28672, 8192, 2048, "fp8"),
    (57344, 8192, 128, "bf16"),
    (57344, 8192, 128, "fp8"),
)


def sustained_gemm(specs=SUSTAINED) -> list[dict]:
    """One GEMM replayed back to back for ~2 ms, ~20 ms, ~200 ms and ~2 s of GPU time, with
    the SM clock and power sampled meanwhile (NVML): whether a long prefill's GEMMs run at
    the clocks that short timings (the packaged tables') see. FP8: the scaled GEMM alone."""
    import threading

    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows = []
    for n, k, m, dtype in specs:
        w = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        if dtype == "fp8":
            w = [v.to(torch.float8_e4m3fn) for v in w]
            x = x.to(torch.float8_e4m3fn)
        sx = torch.ones(m, 1, device="cuda")
        sw = torch.ones(1, n, device="cuda")

        def gemm(i: int, x=x, w=w, sx=sx, sw=sw, dtype=dtype) -> torch.Tensor:
            if dtype == "fp8":
                return torch._scaled_mm(
                    x, w[i % 2].t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16
                )
            return F.linear(x, w[i % 2])

        one_us = graph_time_us(gemm, 4)
        for target_ms in (2, 20, 200, 2000):
            calls = max(2, int(target_ms * 1000 / one_us))
            samples: list[tuple[int, float]] = []
            stop = threading.Event()

            def sample(samples=samples, stop=stop) -> None:
                while not stop.is_set():
                    clock = pynvml.nvmlDeviceGetClockInfo(dev, pynvml.NVML_CLOCK_SM)
                    watts = pynvml.nvmlDeviceGetPowerUsage(dev) / 1000
                    samples.append((clock, watts))
                    time.sleep(0.005)

            # idle first, so every length starts from a cool, boosted GPU
            torch.cuda.synchronize()
            time.sleep(1.0)
            t = threading.Thread(target=sample)
            t.start()
            us = graph_time_us(gemm, calls, replays=1)
            stop.set()
            t.join()
            clocks = [c for c, _ in samples] or [0]
            watts = [p for _, p in samples] or [0.0]
            row = {
                "n": n, "k": k, "m": m, "dtype": dtype, "calls": calls, "us_per_call": round(us, 2),
                "tflops": round(2 * m * n * k / us / 1e6, 1),
                "sm_mhz_min": min(clocks), "sm_mhz_median": sorted(clocks)[len(clocks) // 2],
                "watts_max": round(max(watts), 1),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    out, parts = sys.argv[1], set(sys.argv[2:]) or {"kernels", "steps"}
    torch.backends.cuda.matmul.allow_tf32 = True
    started = time.time()
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    result = {
        "device": torch.cuda.get_device_name(),
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    torch._dynamo.config.cache_size_limit = 64
    if "kernels" in parts:
        result["launch_gap"] = launch_gap_us()
        print(json.dumps(result["launch_gap"]), flush=True)
        result["prefill_attention"] = prefill_attention()
        result["gemm"] = gemm_rows()
    if "sustained" in parts:
        result["sustained_gemm"] = sustained_gemm()
    if "sustained_more" in parts:
        result["sustained_gemm"] = sustained_gemm(SUSTAINED_MORE)
    picked = [p.split(":") for p in parts if p.startswith(("steps:", "breakdown:"))]
    configs = [(p[1], int(p[2]), p[3], p[0] == "breakdown") for p in picked]
    if "steps" in parts:
        configs += [(m, t, d, False) for m, t, d in STEP_CONFIGS]
    if configs:
        result["model_steps"] = []
        for model, tp, dtype, breakdown in configs:
            try:
                result["model_steps"] += model_steps(model, tp, dtype, breakdown=breakdown)
            except Exception as e:  # the figures above are kept whatever happens here
                print(f"{model} tp{tp} {dtype}: {e!r}"[:500], flush=True)
            torch.cuda.empty_cache()
    if "kernels" in parts:
        result["copy"] = copy_bandwidth()  # last: the clocks are up by then
        print(json.dumps(result["copy"]), flush=True)
    result["seconds"] = round(time.time() - started, 1)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out} in {result['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
