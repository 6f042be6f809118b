"""Kernel figures per accelerator for the `gpu` step-time tier, read from the packaged
`data/gpu/kernels.yaml` (each figure names its source there), and the pure functions that
turn them into seconds: GEMM efficiency against the tokens in the batch, all-reduce time
against message size and TP.

A GPU without an entry gets the `default` figures on its own datasheet peaks; `KernelFigures.
rule` says which, so every prediction can name it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.yamlfile import parse_yaml


@dataclass(frozen=True)
class KernelFigures:
    """One accelerator's figures (see kernels.yaml for what each means)."""

    mamf: dict[str, float]
    gemm_tile_m: int
    hbm_eff: float  # weight streaming of 16-bit GEMMs (and any dtype not in hbm_eff_by_dtype)
    hbm_eff_by_dtype: dict[str, float]
    attn_eff: float
    fa_eff: float
    model_gemm_eff: float
    per_layer_s: float
    attn_floor_s: float  # decode attention's floor a layer where no measured line applies
    # share of a GEMM table's best short-burst rate a GEMM keeps at the power limit
    sustained_gemm: float
    allreduce_latency_s: dict[int, float]
    allreduce_busbw_bytes_s: dict[int, float]  # by TP size, as the latency
    # measured all-reduce times by TP size against message bytes (allreduce_<gpu>.json)
    allreduce_curve: dict[int, tuple[np.ndarray, np.ndarray]] | None
    rule: str  # "measured (h100-sxm)" or "no measurements: default figures on <gpu>'s peaks"

    def mamf_for(self, dtype: str) -> float:
        """Achievable share of the dense peak for `dtype` (16-bit's when not listed, as
        `HardwareSpec.peak_flops` falls back to the 16-bit rate)."""
        for d in (dtype, "bf16", "fp16"):
            if d in self.mamf:
                return self.mamf[d]
        return min(self.mamf.values())

    def hbm_for(self, dtype: str) -> float:
        """Share of the datasheet HBM bandwidth that decode GEMMs running in `dtype` reach
        while streaming their weights (FP8 GEMMs quantise their activations first)."""
        return self.hbm_eff_by_dtype.get(dtype, self.hbm_eff)


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = (resources.files("servetune") / "data" / "gpu" / "kernels.yaml").read_text("utf-8")
    return parse_yaml(text)


def release_key(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a release string such as "v0.15.1rc2" (suffixes dropped):
    what `releases` entries are ordered by."""
    parts = re.findall(r"\d+", version.lstrip("v").split("+")[0])[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def engine_cpu_figures(engine: str, version: str | None = None) -> tuple[dict[str, float], str]:
    """The CPU side of `engine` on a GPU box (ingress, per-chunk, per-step seconds) for its
    release `version`: the newest `releases` entry at or below it overrides the base
    figures; no version, or one older than every entry, keeps them. Also returns which
    figures those are, for the prediction's note."""
    engines = _data()["engines"]
    if engine not in engines:
        raise InputError(
            "tier", f"the gpu tier has no CPU-side figures for {engine}", "use roofline"
        )
    entry = dict(engines[engine])
    releases = entry.pop("releases", None) or []
    base = entry.pop("base_release", None)
    figures = {k: float(v) for k, v in entry.items()}
    used = f"CPU side: {engine}{f' {base}' if base else ''}'s figures"
    if releases:
        used += " (engine_version picks another release's)"
    if version is None:
        return figures, used
    at = release_key(version)
    matching = [r for r in releases if release_key(str(r["since"])) <= at]
    if not matching:
        return figures, used
    newest = max(matching, key=lambda r: release_key(str(r["since"])))
    figures.update({k: float(v) for k, v in newest.items() if k != "since"})
    return figures, f"CPU side: {engine} >= {newest['since']}'s figures (engine_version {version})"


def kernel_figures(hw: HardwareSpec) -> KernelFigures:
    """The figures for `hw`: its own entry, else the default rule on its datasheet."""
    table = _data()["accelerators"]
    own = table.get(hw.name)
    if own is None:
        rule = f"no kernel measurements for {hw.name}: default figures on its datasheet peaks"
    elif set(own) >= set(table["default"]):
        rule = f"kernel figures for {hw.name} from public measurements (data/gpu/kernels.yaml)"
    else:  # a partial entry: its own figures, the default rule for the rest
        rule = (
            f"kernel figures for {hw.name}: {', '.join(sorted(own))} its own "
            "(data/gpu/kernels.yaml, each with its source), the rest default figures on its "
            "datasheet peaks"
        )
    entry = {**table["default"], **(own or {})}
    ar = entry["allreduce"]
    if "measured" in ar:  # vLLM's measured curve: the rule's two figures are not used
        ar = {**table["default"]["allreduce"], **ar}
    busbw = ar["busbw_gbs"]
    if busbw is None:  # the default rule: 80% of the links a TP group reaches its peers by
        # (HardwareSpec.allreduce_gbs, as the roofline tier: on MI300X's point-to-point mesh
        # a pair shares one of 7 links, all 7 at TP 8); PCIe's 16 GB/s without a figure
        busbw = {
            tp: 0.8 * (hw.allreduce_gbs(tp) if hw.interconnect_gbs > 0 else 16.0)
            for tp in range(2, 9)
        }
    if not isinstance(busbw, dict):  # one figure for every TP size
        busbw = {2: busbw}
    return KernelFigures(
        mamf={str(k): float(v) for k, v in entry["mamf"].items()},
        gemm_tile_m=int(entry["gemm_tile_m"]),
        hbm_eff=float(entry["hbm_eff"]),
        hbm_eff_by_dtype={
            str(k): float(v) for k, v in (entry.get("hbm_eff_by_dtype") or {}).items()
        },
        attn_eff=float(entry["attn_eff"]),
        fa_eff=float(entry["fa_eff"]),
        model_gemm_eff=float(entry["model_gemm_eff"]),
        per_layer_s=float(entry["per_layer_us"]) * 1e-6,
        attn_floor_s=float(entry.get("attn_floor_us", 0.0)) * 1e-6,
        sustained_gemm=float(entry.get("sustained_gemm", 1.0)),
        allreduce_latency_s={int(k): float(v) * 1e-6 for k, v in ar["latency_us"].items()},
        allreduce_busbw_bytes_s={int(k): float(v) * 1e9 for k, v in busbw.items()},
        allreduce_curve=allreduce_curve(ar["measured"]) if "measured" in ar else None,
        rule=rule,
    )


def tile_efficiency(tokens: int, tile_m: int) -> float:
    """Share of a GEMM's tiles doing useful rows: M tokens run in ceil(M / tile_m) tiles of
    tile_m rows (CUTLASS/cuBLAS CTA tiling), so M = 129 on 128-row tiles wastes 127 rows."""
    m = max(int(tokens), 1)
    return m / (tile_m * math.ceil(m / tile_m))


def allreduce_s(fig: KernelFigures, tp: int, message_bytes: float) -> float:
    """One all-reduce of `message_bytes` over `tp` GPUs: vLLM's measured time where the GPU
    has a curve (log-log between measured sizes, in proportion past the largest), else a
    latency plus the ring's 2 (tp - 1) / tp x bytes over bus bandwidth (nccl-tests'
    busbw convention); each at the largest listed TP size at or below tp."""
    if tp <= 1:
        return 0.0
    if fig.allreduce_curve:
        sizes, seconds = fig.allreduce_curve[by_tp({k: k for k in fig.allreduce_curve}, tp)]
        return at_m(sizes, seconds, max(message_bytes, float(sizes[0])))
    lat = by_tp(fig.allreduce_latency_s, tp)
    return lat + 2 * (tp - 1) / tp * message_bytes / by_tp(fig.allreduce_busbw_bytes_s, tp)


def by_tp(figures: dict[int, float], tp: int) -> float:
    """The figure listed for the largest TP size at or below `tp` (the smallest listed
    one below all of them)."""
    sizes = sorted(figures)
    return figures[max([s for s in sizes if s <= tp] or sizes[:1])]


@dataclass(frozen=True)
class GemmTable:
    """Measured GEMM times on one GPU (data/gpu/gemm_<gpu>.json, built by
    scripts/gemm_table_from_aic.py from NVIDIA AIConfigurator's vLLM 0.24.0 measurements):
    microseconds of M x K by K x N per weight dtype, on a grid of M, N and K."""

    source: str
    engine: str  # the engine whose kernels were timed
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    us: dict[str, np.ndarray]  # dtype -> [m, n, k] microseconds

    def curve_s(self, dtype: str, n: int, k: int) -> np.ndarray:
        """Seconds of an N x K GEMM at each measured M: time per weight element
        interpolated linearly in log N and log K, clamped to the grid's edges (where a
        weight is streamed or computed at the edge's rate)."""
        wn, i_n = _log_weights(self.n, n)
        wk, ik = _log_weights(self.k, k)
        sub = self.us[dtype][:, i_n][:, :, ik] / np.outer(self.n[i_n], self.k[ik])
        return np.exp(np.einsum("j,l,mjl->m", wn, wk, np.log(sub))) * n * k * 1e-6

    def time_s(self, dtype: str, m: int, n: int, k: int) -> float:
        """Seconds of one GEMM of `m` rows (`at_m` over `curve_s`)."""
        return at_m(self.m, self.curve_s(dtype, n, k), m)


def power_capped(grid: np.ndarray, seconds: np.ndarray, kept: float) -> np.ndarray:
    """A GEMM's short-burst times (`seconds` at the rows `grid`) as a GPU held at its power
    limit runs them: no faster than `kept` of the shape's best measured rate (FLOPs per
    second; the fastest time per row). Burst timings run at the boost clock; under a
    sustained load the clock falls and compute-bound GEMMs keep only `kept` of that rate,
    while weight-streaming ones, far below it, keep their time (measured on an H200:
    docs/fidelity-gpu.md, "Sustained GEMMs run slower than short timings")."""
    if kept >= 1.0:
        return seconds
    return np.maximum(seconds, grid * float(np.min(seconds / grid)) / kept)


def at_m(grid: np.ndarray, seconds: np.ndarray, m: int) -> float:
    """`seconds` measured at the rows `grid`, read at `m`: log time against log M between
    grid points, the first point below the grid, and in proportion to M past its end.
    Scalar arithmetic: the simulator reads it on every step, where numpy calls on
    two-element arrays were a tenth of a tuner trial."""
    lo, hi, f = _bracket(grid, m)
    log_s = (
        math.log(seconds[hi])
        if lo == hi
        else ((1.0 - f) * math.log(seconds[lo]) + f * math.log(seconds[hi]))
    )
    return math.exp(log_s) * max(m / float(grid[-1]), 1.0)


def _bracket(grid: np.ndarray, x: float) -> tuple[int, int, float]:
    """The grid points around `x` (lo, hi; the same one at a grid point or outside the
    grid, at its nearest edge) and x's place between them, linear in log x."""
    x = min(max(float(x), float(grid[0])), float(grid[-1]))
    hi = int(grid.searchsorted(x))
    if grid[hi] == x:
        return hi, hi, 0.0
    lo_x, hi_x = float(grid[hi - 1]), float(grid[hi])
    return hi - 1, hi, (math.log(x) - math.log(lo_x)) / (math.log(hi_x) - math.log(lo_x))


def _log_weights(grid: np.ndarray, x: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the two grid points around `x` and their weights (`_bracket`), as arrays
    to weight a table's rows with."""
    lo, hi, f = _bracket(grid, x)
    if lo == hi:
        return np.array([1.0]), np.array([hi])
    return np.array([1.0 - f, f]), np.array([lo, hi])


@dataclass(frozen=True)
class MoeTable:
    """Measured fused-MoE times on one GPU (data/gpu/moe_<gpu>.json, built by
    scripts/moe_table_from_aic.py from NVIDIA AIConfigurator's vLLM 0.24.0 measurements):
    microseconds of one layer's routed experts at each step size, per expert dtype and
    model shape, under skewed (power-law) routing."""

    source: str
    engine: str
    tokens: np.ndarray
    us: dict[str, dict[str, np.ndarray]]  # dtype -> "HxIxExK/tpN" -> [tokens] microseconds

    def curve_s(
        self, dtype: str, hidden: int, inter: int, experts: int, top_k: int, tp: int
    ) -> np.ndarray | None:
        """Seconds of one layer's routed experts at each measured step size; None where
        the table has not timed this shape (the caller prices it with the formula).

        vLLM's tensor-parallel experts split only the expert intermediate dimension (each
        GPU holds every expert's `inter / tp` columns of w13 and rows of w2, and runs the
        same fused kernel on them), so a GPU's kernel is fixed by (hidden, inter / tp,
        experts, top_k). A TP the table did not time is read from the timed shards of the
        same hidden size, experts and top-k on either side of its width, linearly in the
        width (the kernel's two GEMMs grow linearly with it); outside them, None."""
        shapes = self.us.get(dtype, {})
        us = shapes.get(f"{hidden}x{inter}x{experts}x{top_k}/tp{tp}")
        if us is not None:
            return us * 1e-6
        widths = self.shard_widths(dtype, hidden, experts, top_k)
        width = inter / tp
        below = [w for w in widths if w < width]
        above = [w for w in widths if w > width]
        if not below or not above:
            return None
        lo, hi = max(below), min(above)
        f = (width - lo) / (hi - lo)
        return ((1.0 - f) * widths[lo] + f * widths[hi]) * 1e-6

    def shard_widths(
        self, dtype: str, hidden: int, experts: int, top_k: int
    ) -> dict[float, np.ndarray]:
        """The timed per-GPU expert widths (inter / tp) of one (hidden, experts, top_k),
        each with its times; the faster where two shapes shard to the same width."""
        out: dict[float, np.ndarray] = {}
        prefix = f"{hidden}x"
        for key, us in self.us.get(dtype, {}).items():
            if not key.startswith(prefix):
                continue
            shape, tp = key.split("/tp")
            _, inter, e, k = (int(x) for x in shape.split("x"))
            if (e, k) == (experts, top_k):
                w = inter / int(tp)
                out[w] = us if w not in out else np.minimum(out[w], us)
        return out


@lru_cache(maxsize=8)
def moe_table(gpu: str) -> MoeTable | None:
    """The measured fused-MoE table of `gpu`, None where none is packaged."""
    raw = _packaged(f"moe_{gpu}.json")
    if raw is None:
        return None
    return MoeTable(
        source=raw["source"],
        engine=raw["engine"],
        tokens=np.array(raw["tokens"], dtype=float),
        us={
            d: {k: np.array(v, dtype=float) for k, v in shapes.items()}
            for d, shapes in raw["us"].items()
        },
    )


@dataclass(frozen=True)
class AttnTable:
    """Measured decode attention on one GPU (data/gpu/attn_<gpu>.json, built by
    scripts/attention_table_from_aic.py from NVIDIA AIConfigurator's vLLM 0.24.0
    measurements of its decode kernels, `kernels`, the faster at each point): per KV dtype
    and per-GPU shape, at each measured batch size, one layer's time as
    fixed + per_token x (KV tokens read)."""

    source: str
    kernels: tuple[str, ...]  # the vLLM kernels timed (FlashAttention-3, FlashInfer, ...)
    lines: dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]

    def line(
        self, kv_dtype: str, heads: int, kv_heads: int, head_dim: int, batch: int
    ) -> tuple[float, float] | None:
        """(fixed, per-token) seconds of one layer's decode attention over `batch`
        sequences: linear in log batch between measured sizes; past the largest, the fixed
        part in proportion to the batch (more sequences, more work items); None where the
        table has not timed the shape."""
        got = self.lines.get(kv_dtype, {}).get(f"{heads}/{kv_heads}/{head_dim}")
        if got is None:
            return None
        grid, fixed_us, per_token_ns = got
        w, i = _log_weights(grid, batch)
        over = max(batch / float(grid[-1]), 1.0)
        return float(w @ fixed_us[i]) * 1e-6 * over, float(w @ per_token_ns[i]) * 1e-9


@lru_cache(maxsize=8)
def attn_table(gpu: str) -> AttnTable | None:
    """The measured decode-attention table of `gpu`, None where none is packaged."""
    raw = _packaged(f"attn_{gpu}.json")
    if raw is None:
        return None
    lines = {
        kv: {
            name: (
                np.array(v["batch"], dtype=float),
                np.array(v["fixed_us"], dtype=float),
                np.array(v["per_token_ns"], dtype=float),
            )
            for name, v in shapes.items()
        }
        for kv, shapes in raw["lines"].items()
    }
    return AttnTable(source=raw["source"], kernels=tuple(raw["kernels"]), lines=lines)


@lru_cache(maxsize=8)
def allreduce_curve(name: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """vLLM's measured all-reduce in data/gpu/`name` (allreduce_<gpu>.json, built by
    scripts/allreduce_table_from_aic.py): message bytes and seconds by TP size."""
    raw = _packaged(name)
    if raw is None:
        raise FileNotFoundError(f"data/gpu/{name}, named by kernels.yaml, is not packaged")
    sizes = np.array(raw["bytes"], dtype=float)
    return {int(tp): (sizes, np.array(us, dtype=float) * 1e-6) for tp, us in raw["us"].items()}


def _packaged(name: str) -> Any:
    """A JSON file of data/gpu, None where none is packaged."""
    path = resources.files("servetune") / "data" / "gpu" / name
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


@lru_cache(maxsize=8)
def gemm_table(gpu: str) -> GemmTable | None:
    """The measured GEMM table of `gpu`, None where none is packaged."""
    raw = _packaged(f"gemm_{gpu}.json")
    if raw is None:
        return None
    return GemmTable(
        source=raw["source"],
        engine=raw["engine"],
        m=np.array(raw["m"], dtype=float),
        n=np.array(raw["n"], dtype=float),
        k=np.array(raw["k"], dtype=float),
        us={d: np.array(v, dtype=float) for d, v in raw["us"].items()},
    )
