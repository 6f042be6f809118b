"""Capacity planning: memory budget, KV capacity, parallelism, roofline bounds, starting flags.

Everything here is pure maths over ModelSpec + HardwareSpec + EngineConfig; the
CLI (`servetune plan`) and the simulator/tuner call the same functions.
"""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "PlanArgs": "service",
    "PlanResult": "service",
    "run_plan": "service",
    "plan_to_json": "service",
    "PlanRequest": "planner",
    "Plan": "planner",
    "Evaluation": "planner",
    "evaluate": "planner",
    "make_plan": "planner",
    "MemoryBudget": "memory",
    "Overheads": "memory",
    "memory_budget": "memory",
    "kv_bytes_per_token": "kv",
    "WeightFormat": "quant",
    "weight_format": "quant",
    "Scenario": "presets",
    "get_scenario": "presets",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
