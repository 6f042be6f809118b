"""The fidelity harness's workloads: the calibration sweep and the held-out set.

Each case is a `WorkloadSpec` (completions API: the server's tokenizer counts the raw
prompt exactly) whose `name` identifies it in saved runs. Workloads named `cal-*` are the
calibration set the profile is fitted on; every other one is held out and only checked.
"""

from __future__ import annotations

from servetune.workload.spec import (
    Arrival,
    Fixed,
    LengthDist,
    LogNormal,
    PrefixGroups,
    SubWorkload,
    Uniform,
    WorkloadSpec,
)

CALIBRATION_PREFIX = "cal-"


def is_calibration(name: str) -> bool:
    """Whether a workload (by name) belongs to the calibration sweep."""
    return name.startswith(CALIBRATION_PREFIX)


def fixed_tokens(v: int) -> Fixed:
    """A fixed length distribution of `v` tokens."""
    return Fixed(value=v)


def harness_workload(
    name: str,
    arrival: Arrival,
    count: int,
    inp: LengthDist,
    out: LengthDist,
    *,
    seed: int = 0,
    prefix: PrefixGroups | None = None,
) -> WorkloadSpec:
    """One synthetic workload of the harness's shape: `count` requests, one traffic class."""
    sub = SubWorkload(input_tokens=inp, output_tokens=out, prefix=prefix)
    return WorkloadSpec(
        name=name, api="completions", seed=seed, count=count, arrival=arrival, mix=[sub]
    )


def closed_workload(
    name: str,
    conc: int,
    count: int,
    inp: LengthDist,
    out: LengthDist,
    *,
    seed: int = 0,
    prefix: PrefixGroups | None = None,
) -> WorkloadSpec:
    """A closed-loop workload: `conc` users sending `count` requests in all."""
    arrival = Arrival(kind="closed", concurrency=conc)
    return harness_workload(name, arrival, count, inp, out, seed=seed, prefix=prefix)


def mixed_cases() -> list[WorkloadSpec]:
    """The sweep's runs of what users run: shared prefixes served from the prefix cache,
    long and short requests in one batch, bursty arrivals. Without them the fit never
    sees a cache hit (its new tokens' reads of the cached context have a price of their
    own, `cached_pairs` in `steptime.FEATURES`, that only replaying hits can fit) nor a
    long prefill landing among short decodes, and it prices both by extrapolation. Each
    (case, repeat) is run under its own seed (`harness.bench_real`), so its prefixes are
    new to the engine: the cache is cold at the start of every repeat, as the simulator
    assumes, with no reset endpoint needed (vLLM's POST /reset_prefix_cache exists only in
    its dev mode). Lengths, prefix sizes and burstiness differ from every held-out
    workload."""
    long_prefixed = SubWorkload(
        name="long",
        weight=0.4,
        input_tokens=Uniform(low=420, high=1000),
        output_tokens=fixed_tokens(40),
        prefix=PrefixGroups(groups=1, tokens=384),
    )
    short = SubWorkload(
        name="short",
        weight=0.6,
        input_tokens=Uniform(low=32, high=128),
        output_tokens=fixed_tokens(32),
    )
    # Gamma shape 0.25: inter-arrival CV 2 (CV^2 = 1 / shape), clumps of requests.
    bursty = Arrival(kind="gamma", rate=2.0, burstiness=0.25)
    return [
        WorkloadSpec(
            name="cal-mix-gamma-prefix",
            api="completions",
            seed=31,
            count=20,
            arrival=bursty,
            mix=[short, long_prefixed],
        ),
        # Cache hits at full batch: 512 of 704 prompt tokens shared by all four users.
        closed_workload(
            "cal-c4-prefix",
            4,
            10,
            fixed_tokens(704),
            fixed_tokens(24),
            seed=37,
            prefix=PrefixGroups(groups=1, tokens=512),
        ),
    ]


def calibration_cases() -> list[WorkloadSpec]:
    """The live profiling sweep: batch 1..4 (closed-loop concurrency) x short and long
    prompts, so prefill, decode and KV-read costs vary independently, one Poisson run of
    fixed lengths, one closed loop of varied lengths, and the runs of `mixed_cases`."""
    out = [
        closed_workload(
            f"cal-c{conc}-p{prompt}",
            conc,
            2 * conc + 2,
            fixed_tokens(prompt),
            fixed_tokens(24),
            seed=conc * 7 + prompt,
        )
        for conc in (1, 2, 4)
        for prompt in (64, 768)
    ]
    # One open-loop run: arrivals mid-step and prefills mixed with decodes at varying
    # batch sizes, which closed loops of equal lengths rarely produce.
    poisson = Arrival(kind="poisson", rate=2.0)
    out.append(
        harness_workload(
            "cal-poisson-p512", poisson, 10, fixed_tokens(512), fixed_tokens(24), seed=23
        )
    )
    # Varied prompt lengths: most steps have a size the engine has not run before, which
    # costs extra the first time (steptime.StepModel.new_shape_s); fixed-length runs repeat
    # their few step sizes. Lengths and concurrency differ from every held-out case.
    varied = Uniform(low=40, high=900)
    out.append(closed_workload("cal-c2-varied", 2, 10, varied, fixed_tokens(24), seed=29))
    return out + mixed_cases()


def heldout_cases() -> list[WorkloadSpec]:
    """Workloads the profile never saw: other lengths, distributions and arrival kinds."""
    lognormal = LogNormal(mean=250, sigma=0.6, max=1200)
    return [
        closed_workload(
            "closed-c3-uniform", 3, 12, Uniform(low=100, high=500), Uniform(low=16, high=40)
        ),
        closed_workload("closed-c4-p300", 4, 12, fixed_tokens(300), fixed_tokens(32), seed=3),
        harness_workload(
            "poisson-lognormal",
            Arrival(kind="poisson", rate=3.0),
            16,
            lognormal,
            fixed_tokens(24),
            seed=5,
        ),
        # Over max_num_seqs (4): requests queue for a slot -> the TTFT cliff.
        closed_workload("closed-c8-p200", 8, 16, fixed_tokens(200), fixed_tokens(24), seed=11),
        # Shared prefixes: a prefix-cache hit removes most of the prefill.
        closed_workload(
            "prefix-c2",
            2,
            10,
            fixed_tokens(640),
            fixed_tokens(16),
            seed=13,
            prefix=PrefixGroups(groups=1, tokens=576),
        ),
        closed_workload("noprefix-c2", 2, 10, fixed_tokens(640), fixed_tokens(16), seed=13),
    ]
