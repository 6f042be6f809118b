"""Validation of the simulator against real engines (fidelity), above `sim` and `bench`.

`cases` holds the workloads (calibration sweep, held-out set), `harness` the real runs and
their simulated replays, `compare` the figures, errors, noise floor and verdict, and
`fidelity` the harness end to end: fit on the calibration runs, compare the held-out ones.
"""

from servetune.validate.cases import (
    calibration_cases,
    closed_workload,
    fixed_tokens,
    heldout_cases,
    is_calibration,
)
from servetune.validate.compare import (
    E2E,
    FIGURES,
    NOISE_FLOOR_TITLE,
    TARGETS,
    Row,
    abs_pct_errors,
    by_workload,
    compare_runs,
    figures,
    format_table,
    median_figures,
    medians_over,
    noise_floor,
    verdict,
)
from servetune.validate.fidelity import Outcome, compare_case, compare_saved, validate_runs
from servetune.validate.harness import (
    HARNESS_ENGINES,
    Harness,
    bench_real,
    check_harness_engine,
    engine_version,
    harness_for,
    least_disturbed_per_case,
    preemptions_of,
    run_blocks,
    run_live,
    run_seed,
    save_run,
    simulate_like,
)

__all__ = [
    "E2E",
    "FIGURES",
    "HARNESS_ENGINES",
    "NOISE_FLOOR_TITLE",
    "TARGETS",
    "Harness",
    "Outcome",
    "Row",
    "abs_pct_errors",
    "bench_real",
    "by_workload",
    "calibration_cases",
    "check_harness_engine",
    "closed_workload",
    "compare_case",
    "compare_runs",
    "compare_saved",
    "engine_version",
    "figures",
    "fixed_tokens",
    "format_table",
    "harness_for",
    "least_disturbed_per_case",
    "heldout_cases",
    "is_calibration",
    "median_figures",
    "medians_over",
    "noise_floor",
    "preemptions_of",
    "run_blocks",
    "run_live",
    "run_seed",
    "save_run",
    "simulate_like",
    "validate_runs",
    "verdict",
]
