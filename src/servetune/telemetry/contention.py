"""Other processes hold cores a CPU engine's threads want (seed 003 §13, low utilisation:
"check the CPU"; seed 000 §6.2, CPU bottleneck), read from one run's telemetry summary
(`telemetry.sampler.summarize`). `diagnose` names it; `tune` acts on it (`tune.hostfit`).

Why a rule of its own beside `diagnose`'s starved host (a wait share of half the engine's
runnable time): a llama.cpp server's threads meet at a barrier every step, so the one
thread that shares its core with another process holds the whole step back, and its
wait share sits at the boundary. Measured here (llama.cpp's default threads, all 2 cores;
Gemma 3 270M; one `while True` loop on one core): the engine ran 1.00 core and waited
1.00 core's worth (49.9% of its runnable time), other processes held 0.99 of the 2
cores, and P50 TPOT was 632 ms against ~12 ms idle. The starved-host rule missed it;
comparing what the engine's threads want (run + wait) with the cores the others leave
does not. An engine whose own threads outnumber an otherwise idle host's cores is not
this: the others must hold half a core or more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIN_OTHERS = 0.5  # other processes hold half a core or more (mean over the run)
MIN_WAIT = 0.25  # the engine waited a quarter core's worth or more (diagnose's STARVED_CORES)
OVER = 0.5  # its threads want half a core or more beyond the cores the others leave


@dataclass(frozen=True)
class Contention:
    """Cores of the host, held by others, run and waited for by the engine (means)."""

    cores: int
    others: float
    engine: float
    wait: float

    @property
    def free_cores(self) -> int:
        return free_cores(self.cores, self.others)

    def describe(self) -> str:
        return (
            f"other processes held {self.others:.1f} of {self.cores} cores while the "
            f"engine's threads ran {self.engine:.1f} and waited {self.wait:.1f} cores' worth"
        )


def free_cores(cores: int, others: float) -> int:
    """The whole cores other processes leave, at least one: what the engine's threads
    should be."""
    return max(1, round(cores - others))


def contention(tel: Mapping[str, Any]) -> Contention | None:
    """The contention a run's telemetry summary shows, or None (no host telemetry, a
    remote engine, or enough free cores)."""
    cores = int(tel.get("host_cpu_cores_max") or 0)
    others = tel.get("other_cpu_cores_mean")
    engine = tel.get("engine_cpu_cores_mean")
    wait = tel.get("engine_runq_wait_cores_mean")
    if not cores or others is None or engine is None or wait is None:
        return None
    c = Contention(cores, float(others), float(engine), float(wait))
    wanted = c.engine + c.wait
    if c.others >= MIN_OTHERS and c.wait >= MIN_WAIT and wanted >= cores - c.others + OVER:
        return c
    return None
