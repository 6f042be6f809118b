"""The known profile the calibration tests simulate runs under, shared by their files:
runs made with it are ground truth a fit must recover, and a scaled copy is an engine
slower in everything (a repeat on a busier host)."""

from __future__ import annotations

from servetune.engines.config import EngineConfig
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.results.schema import RunResult
from servetune.sim.engine import simulate
from servetune.sim.profile import Profile

CFG = EngineConfig(max_num_seqs=4, max_model_len=2048, kv_cache_tokens=20000)
TRUTH = Profile(
    engine="vllm",
    model="llama-3.2-1b",
    hardware="cpu-host",
    coefficients={"const": 0.01, "prefill_tokens": 4e-4, "decode_seqs": 1.5e-3},
    api_overhead_s=0.003,
)


def scaled(profile: Profile, k: float) -> Profile:
    """`profile` with every step term and the API overhead times `k`."""
    return profile.model_copy(
        update={
            "coefficients": {t: k * v for t, v in profile.coefficients.items()},
            "api_overhead_s": k * profile.api_overhead_s,
        }
    )


def sim_run(
    case, profile: Profile = TRUTH, cfg: EngineConfig = CFG, *, shapes: set[int] | None = None
) -> RunResult:
    """`case` simulated under `profile` on Llama-3.2-1B on the CPU host, requests kept."""
    res, _ = simulate(
        get_model("llama-3.2-1b"), get_hardware("cpu-host"), cfg, case, profile=profile,
        keep_requests=True, shapes=shapes,
    )  # fmt: skip
    return res
