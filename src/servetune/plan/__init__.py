"""Capacity planning: memory budget, KV capacity, parallelism, roofline bounds, starting flags.

Everything here is pure maths over ModelSpec + HardwareSpec + EngineConfig; the
CLI (`servetune plan`) and the simulator/tuner call the same functions.
"""
