"""What servetune can do with each engine, stated once: runs here or not (and why),
the version its adapter targets, whether it exports Prometheus metrics servetune maps,
and whether the simulator has a scheduler model for it. `servetune engine list` prints
it; docs/engines.md and the README table say the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from servetune.engines.registry import adapter, exports_metrics

# Engines the simulator has a scheduler model for (sim/engine.py refuses the others;
# tests/test_engine_list.py checks the two agree). SGLang's (sim/sglang_policy.py,
# sim/sglang_sched.py): docs/engines.md "SGLang in the simulator".
SIMULATED = ("vllm", "sglang", "llamacpp")

# Why an engine cannot run on a CPU-only host (what was tried: docs/engines.md).
NEEDS_GPU = {
    "sglang": "needs a CUDA/ROCm GPU: its wheels ship GPU kernels, the CPU kernel builds "
    "only from git",
    "tgi": "needs a GPU: no server package on PyPI, the launcher is a Rust build or the "
    "TGI docker image",
    "trtllm": "NVIDIA GPU only: the wheel comes from pypi.nvidia.com",
}


@dataclass(frozen=True)
class EngineSupport:
    """One row of `engine list`."""

    engine: str
    here: str  # installed | stale pins | installable | not on this machine
    why: str | None  # how to install, or why it cannot run here
    version: str | None  # installed version, else the version the adapter targets
    where: str | None
    metrics: bool  # Prometheus /metrics mapped to canonical names
    simulator: bool  # a scheduler model in `servetune simulate`
    flags_checked: str | None  # the version its flags are checked against (flagcheck)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def support(
    engine: str,
    *,
    installed_version: str | None,
    where: str | None,
    installable: bool,
    how_to_install: str,
    target_version: str | None,
    has_gpu: bool,
    stale: str | None = None,
) -> EngineSupport:
    """One engine's row from what was found on this machine (`where` None: not found).
    `stale`: where servetune's cache holds an install of older pins, which is not run."""
    mod = adapter(engine)
    if where is not None:
        here, why = "installed", None
    elif stale is not None:
        here, why = (
            "stale pins",
            (
                f"the cached install at {stale} was made under other pins than today's and is "
                f"not run: `servetune engine install {engine}` rebuilds it"
            ),
        )
    elif installable or (has_gpu or engine not in NEEDS_GPU):
        here, why = "installable", how_to_install
    else:
        here, why = "not on this machine", NEEDS_GPU[engine]
    return EngineSupport(
        engine=engine,
        here=here,
        why=why,
        version=installed_version or target_version or getattr(mod, "TARGET_VERSION", None),
        where=where,
        metrics=exports_metrics(engine),
        simulator=engine in SIMULATED,
        flags_checked=getattr(mod, "TARGET_VERSION", None),
    )
