"""The edge of the planner: resolve CLI-style arguments (catalog look-ups, files) into a
PlanRequest, run it, and shape the stable JSON output."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from servetune.engines import launch_command, launch_commands
from servetune.engines.base import Device, LaunchSpec, PlannedPool
from servetune.engines.config import EngineConfig, KVDtype, Quantization
from servetune.engines.extra import knob_in_extra
from servetune.engines.rules import check_batch_limits, check_model_config
from servetune.errors import InputError, from_validation_error
from servetune.hardware.catalog import get_hardware
from servetune.hardware.spec import HardwareSpec
from servetune.model.catalog import get_model, serving_reference
from servetune.model.spec import ModelSpec
from servetune.plan import kv as kvmath
from servetune.plan.memory import Overheads, check_kv_cache_space
from servetune.plan.planner import (
    Evaluation,
    Plan,
    PlanRequest,
    check_tp_within_node,
    make_plan,
    node_tp_fix,
    resolve_max_model_len,
    scenario_config,
)
from servetune.plan.presets import Scenario, get_scenario, recommend_engine
from servetune.plan.quant import (
    GGUF_TYPES,
    WEIGHT_FORMATS,
    check_dtype_runs_on,
    check_runs_on,
    format_source,
    method_runs_on,
    needs_prequantized,
    weight_format,
)
from servetune.units import GiB

_DTYPES = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
}


@dataclass
class PlanArgs:
    """`servetune plan` options, as given (None = not given)."""

    model: str
    gpu: str
    gpus: int = 1
    scenario: str | None = "chat"
    dtype: str = "auto"
    quant: str | None = None
    kv_dtype: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_space: float | None = None
    block_size: int | None = None  # None: the engine's own (vLLM 16, SGLang page 1)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tp: int | None = None
    pp: int = 1
    enforce_eager: bool = False
    avg_context: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    overhead: list[str] = field(default_factory=list)
    hardware_file: Path | None = None
    engine: str = "vllm"
    # SGLang's own flags that size its pool (`--swa-full-tokens-ratio`,
    # `--disable-hybrid-swa-memory`), as `simulate --extra` passes them; its command alone
    # carries them
    extra: tuple[str, ...] = ()
    # The values are flags the user passed (`servetune plan`): an explicit 0.9 or 16 is the
    # user's own. Callers that fill PlanArgs from an EngineConfig (report) leave it False:
    # there those values are the defaults, which SGLang reads as not given (sglang_pool).
    from_flags: bool = False


@dataclass
class PlanResult:
    plan: Plan
    model: ModelSpec
    hardware: HardwareSpec
    scenario: Scenario | None
    engine: str
    engine_reason: str
    launch: dict[str, Any]
    weight_format_origin: str = "--dtype"  # --quant, scenario <name>, checkpoint, --dtype
    kv_dtype_note: str = ""  # why the planned KV dtype is not the scenario's (`kv_dtype_fallback`)
    launch_withheld: str = ""  # why a config that fits has no launch commands (`run_plan`)


PLAN_FIELDS = frozenset(f.name for f in fields(PlanArgs))  # what `plan` has a flag for


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_KNOB_FLAGS = {
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "quantization": "quant",
    "kv_cache_space_gib": "kv_cache_space",
}


def _as_flag(exc: InputError, tp_fix: str | None = None) -> InputError:
    """An engine rule's error on a knob, under the `plan` flag that sets it. A TP size
    refused for the model's heads is answered with `tp_fix` (`planner.node_tp_fix`: the
    sizes that split them within one node), not every size the engine accepts."""
    if exc.field not in EngineConfig.model_fields:
        return exc
    fix = tp_fix if exc.field == "tensor_parallel_size" and tp_fix else exc.fix
    return InputError(_flag(_KNOB_FLAGS.get(exc.field, exc.field)), exc.problem, fix)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not 0 < value < math.inf:  # also refuses nan and inf
        raise InputError(_flag(name), f"must be a finite number > 0 (got {value})")


# More GPUs than any one deployment holds (the largest training clusters hold ~100k): a
# typo (`--gpus 1000000000` planned `--data-parallel-size 1000000000`), not a plan.
MAX_GPUS = 100_000


def check_gpus(gpus: int, flag: str = "--gpus") -> None:
    """`gpus` of one deployment: 1 to MAX_GPUS (plan's --gpus, simulate's)."""
    if not 1 <= gpus <= MAX_GPUS:
        raise InputError(flag, f"{gpus:,} is not allowed", f"give 1 to {MAX_GPUS:,} GPUs")


def parse_overheads(items: list[str]) -> Overheads:
    """`name=GiB` pairs -> Overheads, naming the bad item on error."""
    values: dict[str, float] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise InputError(
                "--overhead",
                f"{item!r} is not name=GiB",
                f"names: {', '.join(Overheads.model_fields)}",
            )
        if key.strip() not in Overheads.model_fields:
            raise InputError(
                "--overhead",
                f"unknown name {key.strip()!r}",
                f"names: {', '.join(Overheads.model_fields)}",
            )
        try:
            values[key.strip()] = float(raw)
        except ValueError:
            raise InputError("--overhead", f"{key}: {raw!r} is not a number") from None
    try:
        return Overheads(**values)
    except ValidationError as exc:
        raise from_validation_error(exc, "--overhead") from None


def build_request(args: PlanArgs) -> tuple[PlanRequest, Scenario | None]:
    """Validate arguments and load the model and hardware (file I/O happens here)."""
    for name in (
        "gpus",
        "block_size",
        "pp",
        "tp",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "avg_context",
        "input_len",
        "output_len",
        "kv_cache_space",
        "gpu_memory_utilization",
    ):
        _positive(name, getattr(args, name))
    check_gpus(args.gpus)
    for name in ("model", "gpu", "quant", "kv_dtype", "scenario", "engine", "dtype"):
        if getattr(args, name, None) is not None and not str(getattr(args, name)).strip():
            # an unset shell variable: never silently "none" or the default
            raise InputError(_flag(name), "is empty", "give a value or leave the flag out")
    if args.dtype.lower() not in _DTYPES:
        raise InputError("--dtype", f"unknown dtype {args.dtype!r}", f"use {', '.join(_DTYPES)}")
    model = get_model(args.model)
    hardware = get_hardware(args.gpu, args.hardware_file)
    scenario = None
    if args.scenario and args.scenario.lower() != "none":
        scenario = get_scenario(args.scenario)
    knobs: dict[str, Any] = {
        "engine": args.engine,
        "dtype": _DTYPES[args.dtype.lower()],
        "quantization": args.quant.lower() if args.quant else None,
        "kv_cache_dtype": (args.kv_dtype or "auto").lower(),
        "tensor_parallel_size": args.tp or 1,
        "pipeline_parallel_size": args.pp,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_space_gib": args.kv_cache_space,
        "enforce_eager": args.enforce_eager,
    }
    if args.extra:
        if args.engine != "sglang":  # only SGLang's pool reads flags without a knob
            raise InputError(
                "--extra", f"the {args.engine} plan reads no extra flags", "use the knob flags"
            )
        knobs["extra_args"] = args.extra
    check_kv_cache_space(args.kv_cache_space, "--kv-cache-space")
    if args.block_size is not None:
        knobs["block_size"] = args.block_size
    if args.gpu_memory_utilization is not None:
        knobs["gpu_memory_utilization"] = args.gpu_memory_utilization
    try:
        config = EngineConfig(**knobs)
    except ValidationError as exc:
        err = from_validation_error(exc)
        raise InputError(
            _flag(err.field.replace("kv_cache_dtype", "kv_dtype").replace("quantization", "quant")),
            err.problem,
        ) from None
    rule_device: Device = "cpu" if hardware.kind == "cpu" else "gpu"
    check_engine_device(args.engine, hardware)
    check_tp_within_node(args.tp, args.pp, model, hardware)
    try:  # the engine's start-up rules (TP divides the heads, block size), as flags
        check_model_config(config, model, device=rule_device)
    except InputError as exc:
        raise _as_flag(exc, node_tp_fix(model, hardware)) from None
    knob = knob_in_extra(config, rule_device)
    if knob is not None:  # the plan sizes the knob: the flag would change the engine only
        name = _KNOB_FLAGS.get(knob[1], knob[1])
        fix = f"use {_flag(name)}" if name in PLAN_FIELDS else "plan without it"
        raise InputError("--extra", f"{knob[0]} is the {knob[1]} knob's flag", fix)
    explicit = {k for k, v in knobs.items() if v is not None}
    if args.kv_dtype is None:
        explicit.discard("kv_cache_dtype")
    if args.gpu_memory_utilization is None:
        explicit.discard("gpu_memory_utilization")
    # what the user set, when known: SGLang's sizing and command read it (sglang_pool)
    given = frozenset(explicit) if args.from_flags else None
    if scenario is not None:
        # a scenario's utilization is vLLM's knob: SGLang keeps its own fraction unless given
        keep = explicit | {"gpu_memory_utilization"} if args.engine == "sglang" else explicit
        config = scenario_config(scenario, config, keep, model)
    quant_flag = "--quant" if args.quant else "--scenario"
    check_engine_loads(config, model, args.model, quant_flag, rule_device, hardware)
    config, kv_note = kv_dtype_fallback(config, args, scenario, rule_device)
    check_dtype_runs_on(config.dtype, hardware)  # an explicit bfloat16 below cc 8.0
    fmt = weight_format(config.dtype, config.quantization, model)
    check_runs_on(
        fmt,
        hardware,
        quant_flag if config.quantization else "--gpu",
        dtype=config.dtype,
        engine=config.engine,
        shipped=format_source(config.quantization, model) == "checkpoint",
    )
    try:
        max_len = resolve_max_model_len(model, config)
    except InputError as exc:
        raise _as_flag(exc) from None
    input_tokens, output_tokens = request_lengths(args, scenario, max_len)
    check_request_fits(args, scenario, model, max_len, input_tokens, output_tokens)
    req = PlanRequest(
        model=model,
        hardware=hardware,
        gpus=args.gpus,
        config=config,
        tp_given=args.tp is not None or args.pp > 1,  # either fixes the parallelism
        avg_context=args.avg_context,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        scenario=scenario.name if scenario else None,
        overheads=parse_overheads(args.overhead),
        given_knobs=given,
        kv_dtype_note=kv_note,
    )
    return req, scenario


def check_engine_device(engine: str, hardware: HardwareSpec) -> None:
    """SGLang is planned (and simulated, sim.engine.setup) as its GPU server only: its
    mem_fraction_static sizing (plan.sglang_pool) is of device memory."""
    if engine == "sglang" and hardware.kind != "gpu":
        raise InputError(
            "--engine",
            f"servetune plans SGLang's GPU server only, and {hardware.name} is a CPU host",
            "give a GPU with --gpu, or use --engine vllm (its CPU backend)",
        )


# Formats servetune sizes that are weight quantizations (the rest are --dtype's).
_QUANT_FORMATS = get_args(Quantization)
# llama.cpp's types: an engine loads them from a .gguf file (`gguf_reference`).


def _missing_flag(
    cfg: EngineConfig, reference: str, device: Device, knob: str = "quantization"
) -> str | None:
    """Why `cfg.engine` has no flag for `cfg.<knob>` (None: it has one), read from the
    engine adapter's launch command (LaunchSpec.why_unsupported), as simulate's `--set`
    check reads it."""
    spec = launch_command(cfg.engine, cfg, reference, device=device)
    return spec.why_unsupported(knob)


def kv_dtype_fallback(
    cfg: EngineConfig, args: PlanArgs, scenario: Scenario | None, device: Device
) -> tuple[EngineConfig, str]:
    """A KV cache dtype the planned engine cannot run is never sized (an 8-bit pool the
    engine would not give doubles the capacity): `--kv-dtype` naming one is refused in
    one line, as `check_engine_loads` refuses a weight format; a scenario's (long-context:
    fp8) falls back to the engine's own 16-bit KV (`auto`), with a note saying so."""
    why = _missing_flag(cfg, args.model, device, "kv_cache_dtype")
    if why is None:
        return cfg, ""
    runs = [
        d
        for d in get_args(KVDtype)
        if _missing_flag(cfg.with_(kv_cache_dtype=d), args.model, device, "kv_cache_dtype") is None
    ]
    detail = f": {why}" if why else ""
    if args.kv_dtype is not None:
        raise InputError(
            "--kv-dtype",
            f"{cfg.engine} has no flag for {cfg.kv_cache_dtype}{detail}",
            f"drop it, or use one {cfg.engine} runs: {', '.join(runs)}",
        )
    origin = f"scenario {scenario.name}'s" if scenario else "the"
    note = (
        f"{origin} {cfg.kv_cache_dtype} KV cache is not one {cfg.engine} runs{detail}; "
        "planned with its 16-bit KV (auto)"
    )
    return cfg.with_(kv_cache_dtype="auto"), note


def given_sglang_flags(spec: LaunchSpec, cfg: EngineConfig, given: frozenset[str]) -> LaunchSpec:
    """SGLang's command with the values the user gave that its adapter leaves out as
    EngineConfig's defaults (0.9, 16: docs/sglang-sim.md), so it starts with the pool the
    plan sized from them rather than SGLang's own fraction and page size."""
    extra: list[str] = []
    if "gpu_memory_utilization" in given and "--mem-fraction-static" not in spec.argv:
        extra += ["--mem-fraction-static", f"{cfg.gpu_memory_utilization:g}"]
    if "block_size" in given and "--page-size" not in spec.argv:
        extra += ["--page-size", str(cfg.block_size)]
    return replace(spec, argv=[*spec.argv, *extra]) if extra else spec


def _sizes(dtype: str, quant: str, model: ModelSpec) -> bool:
    """Whether `quant` applies to `model` (MXFP4 needs MoE experts: quant._applicable)."""
    try:
        weight_format(dtype, quant, model)
    except InputError:
        return False
    return True


def check_engine_loads(
    cfg: EngineConfig,
    model: ModelSpec,
    given: str,
    flag: str,
    device: Device,
    hw: HardwareSpec | None = None,
) -> None:
    """A weight format the planned engine cannot load is refused in simulate's words
    (cli.engine_cmd `_check_engine_has_flags`: "<engine> has no flag for it: <why>"):
    planning the engine on it would size weights it never serves. GGUF types are checked
    against a .gguf file, which vLLM loads them from. `given`: the --model argument. The
    formats offered instead are those `hw` also runs (`plan.quant.method_runs_on`)."""
    quant = cfg.quantization
    if quant is None:
        return
    reference = gguf_reference(given, quant) if quant in GGUF_TYPES else given
    why = _missing_flag(cfg, reference, device)
    if why is None:
        return
    loads = [
        q
        for q in _QUANT_FORMATS
        if q not in GGUF_TYPES
        and _missing_flag(cfg.with_(quantization=q), given, device) is None
        and _sizes(cfg.dtype, q, model)
        and (hw is None or method_runs_on(q, hw))
    ]
    detail = f": {why}" if why else ""
    fix = f"drop it, or use one {cfg.engine} loads: {', '.join(loads)}" if loads else "drop it"
    raise InputError(flag, f"{cfg.engine} has no flag for it{detail}", fix)


# servetune's own request when neither a flag nor a scenario gives one (`request_lengths`).
DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS = 1024, 256


def request_lengths(args: PlanArgs, scenario: Scenario | None, max_len: int) -> tuple[int, int]:
    """Prompt and output tokens of one request: the flags', else the scenario's, else
    servetune's default (1,024 + 256), which alone is shortened to fit `max_len` (it is
    no input of the user's, so nothing given is changed)."""
    prompt = args.input_len or (scenario.input_tokens if scenario else None)
    output = args.output_len or (scenario.output_tokens if scenario else None)
    if prompt is None and output is None:
        output = min(DEFAULT_OUTPUT_TOKENS, max(1, max_len // 5))
    if output is None:
        output = max(1, min(DEFAULT_OUTPUT_TOKENS, max_len - (prompt or 0)))
    if prompt is None:
        prompt = max(1, min(DEFAULT_INPUT_TOKENS, max_len - output))
    return prompt, output


def _limit_origin(args: PlanArgs, scenario: Scenario | None, model: ModelSpec) -> str:
    """Where max_model_len came from, in the user's terms."""
    if args.max_model_len is not None:
        return "--max-model-len"
    if scenario is not None and scenario.max_model_len < model.context_limit:
        return f"scenario {scenario.name}"
    return model.context_limit_origin


def check_request_fits(
    args: PlanArgs,
    scenario: Scenario | None,
    model: ModelSpec,
    max_len: int,
    prompt: int,
    output: int,
) -> None:
    """A request longer than max_model_len never runs: vLLM answers it HTTP 400 and SGLang
    refuses it (max_req_input_len), so a plan that sized or timed it clamped would report
    a workload that cannot be served. Same for --avg-context: no sequence holds more than
    max_model_len. One line naming the flag that set the length, and the fix."""
    ceiling = model.context_limit
    origin = _limit_origin(args, scenario, model)

    def raise_to(n: int) -> str:
        return f"raise --max-model-len to at least {n:,} ({model.name} allows {ceiling:,})"

    if args.avg_context is not None and args.avg_context > max_len:
        fix = f"use at most {max_len:,}"
        if args.avg_context <= ceiling:
            fix += f", or {raise_to(args.avg_context)}"
        raise InputError(
            "--avg-context",
            f"{args.avg_context:,} tokens is more than max_model_len {max_len:,} ({origin}), "
            "which no sequence outgrows",
            fix,
        )
    total = prompt + output
    if total <= max_len:
        return
    scenario_name = f"scenario {scenario.name}" if scenario else "servetune's default"
    where_in = "--input-len" if args.input_len else scenario_name
    where_out = "--output-len" if args.output_len else scenario_name
    if args.input_len or args.output_len:
        field_name = "--input-len" if args.input_len else "--output-len"
    else:
        field_name = "--scenario" if scenario else "--max-model-len"
    if total <= ceiling:
        fix = raise_to(total) + ", or shorten the requests"
    else:
        fix = (
            f"give --input-len and --output-len that sum to at most {ceiling:,} "
            f"({model.name}'s context), or a model with a longer context"
        )
    raise InputError(
        field_name,
        f"requests of {prompt:,} prompt ({where_in}) + {output:,} output ({where_out}) = "
        f"{total:,} tokens exceed max_model_len {max_len:,} ({origin}): the engine refuses "
        "every one",
        fix,
    )


def gguf_reference(given: str, weight_format: str) -> str:
    """llama-server loads a GGUF file: name one after the model and the plan's weight
    format (llama.cpp's convert/quantize type names: K-quants, MXFP4 for GPT-OSS experts,
    else the 16-bit conversion), or pass through a path that already is one."""
    if given.endswith(".gguf"):
        return given
    stem = Path(serving_reference(given)).name
    if weight_format in (*GGUF_TYPES, "mxfp4"):
        kind = weight_format.upper()
    else:
        kind = _GGUF_NEAREST.get(weight_format, "BF16")
    return f"{stem}-{kind}.gguf"


# the GGUF type nearest a non-GGUF weight format's size: an FP8 checkpoint had been named
# a BF16 GGUF, twice the weights the plan sized (DeepSeek-V3 on 8 H200s)
_GGUF_NEAREST = {"fp16": "F16", "fp32": "F32", "fp8": "Q8_0", "int8": "Q8_0",
                 "awq": "Q4_K_M", "gptq": "Q4_K_M"}  # fmt: skip


def gguf_note(weight_format: str) -> str | None:
    """What the llama.cpp line's GGUF differs by from the format the plan sized."""
    kind = _GGUF_NEAREST.get(weight_format)
    if kind is None or weight_format in ("fp16", "fp32"):
        return None
    return (
        f"weights: llama.cpp loads GGUF, {kind} is the type nearest {weight_format} "
        f"({WEIGHT_FORMATS[kind.lower()].body_bits:g} bits a weight against "
        f"{WEIGHT_FORMATS[weight_format].body_bits:g}): the pool above is {weight_format}'s"
    )


def planned_pool(ev: Evaluation) -> PlannedPool:
    """The plan's KV pool in the terms engine adapters size KV with."""
    b = ev.budget
    return PlannedPool(
        kv_tokens=ev.kv_capacity_tokens,
        kv_bytes=b.kv_pool_bytes,
        free_after_load_bytes=b.free_after_load_bytes,
    )


def run_plan(args: PlanArgs) -> PlanResult:
    req, scenario = build_request(args)
    given = [k for k in ("max_num_seqs", "max_num_batched_tokens") if getattr(args, k)]
    try:
        plan = make_plan(req)
        b = plan.evaluation.budget
        # vLLM's start-up rule on the values in force (the scenario's, vLLM's defaults)
        check_batch_limits(plan.evaluation.config, b.max_num_seqs, b.max_num_batched_tokens, given)
    except InputError as exc:
        raise _as_flag(exc) from None
    default_scenario = scenario or get_scenario("chat")
    engine, reason = recommend_engine(req.hardware, default_scenario)
    if args.engine != engine:  # the plan above is the asked engine's, not the recommended
        own = args.engine in ("vllm", "sglang")  # the engines whose pool the planner sizes
        how = "" if own else " with vLLM's memory model: its own is not modelled"
        reason += f" (the plan above is sized for --engine {args.engine}{how})"
    cfg = plan.evaluation.config
    device = "cpu" if req.hardware.kind == "cpu" else "gpu"
    launch: dict[str, Any] = {}
    withheld = prequantized_note(cfg.quantization, req.model, args.model, req.hardware)
    if plan.evaluation.fits and not withheld:  # a command that cannot start would mislead
        pool = planned_pool(plan.evaluation)
        ref = serving_reference(args.model)
        plain = cfg.with_(extra_args=())  # the extra flags are SGLang's (checked above)
        launch = launch_commands(plain, ref, device=device, pool=pool)
        gguf = gguf_reference(args.model, plan.evaluation.budget.weight_format)
        spec = launch_command("llamacpp", plain, gguf, device=device, pool=pool)
        if note := gguf_note(plan.evaluation.budget.weight_format):
            spec = replace(spec, notes=[*spec.notes, note])
        launch["llamacpp"] = spec
        if cfg.extra_args:
            launch["sglang"] = launch_command("sglang", cfg, ref, device=device, pool=pool)
        if "sglang" in launch and req.given_knobs is not None:
            launch["sglang"] = given_sglang_flags(launch["sglang"], cfg, req.given_knobs)
    origin = weight_format_origin(
        plan.evaluation.budget.weight_format_source, args.quant is not None, plan.scenario
    )
    return PlanResult(
        plan,
        req.model,
        req.hardware,
        scenario,
        engine,
        reason,
        launch,
        origin,
        req.kv_dtype_note,
        withheld,
    )


def prequantized_note(quant: str | None, model: ModelSpec, given: str, hw: HardwareSpec) -> str:
    """Why no command is printed for `quant` on a 16-bit checkpoint that the engines load
    only pre-quantized (`plan.quant.needs_prequantized`: AWQ, GPTQ, MXFP4): the plan sizes
    the weights in that format, and the release to serve is another checkpoint. Empty
    otherwise. Where `hw` runs fp8, which vLLM quantizes to at load, it is offered too
    (A100: Marlin W8A16)."""
    if not quant or not needs_prequantized(quant, model):
        return ""
    alt = (
        ", or plan --quant fp8, which vLLM quantizes to at load"
        if method_runs_on("fp8", hw)
        else ""
    )
    return (
        f"{given} is a 16-bit checkpoint and vLLM cannot quantize it to {quant} at load: "
        f"serve a pre-quantized {quant.upper()} release of it (plan that checkpoint's "
        f"config.json with --model){alt}"
    )


def weight_format_origin(source: str, quant_given: bool, scenario: str | None) -> str:
    """Where the plan's weight format came from, in the user's terms (`source` is
    MemoryBudget.weight_format_source)."""
    if source == "quantization":
        return "--quant" if quant_given else f"scenario {scenario}"
    if source == "checkpoint":
        return "checkpoint quantization_config"
    return "--dtype"


def plan_to_json(result: PlanResult) -> dict[str, Any]:
    """The stable, machine-readable form of a plan (keys documented in docs/plan.md)."""
    plan, ev = result.plan, result.plan.evaluation
    b, cfg = ev.budget, ev.config
    return {
        "model": plan.model,
        "hardware": plan.hardware,
        "gpus": plan.gpus,
        "scenario": plan.scenario,
        "params_total": result.model.params_total,
        "params_active": result.model.params_active,
        "weight_format": b.weight_format,
        "weight_format_note": b.weight_format_note,
        "weight_format_source": result.weight_format_origin,
        "weights_bytes": round(b.weights_total_bytes),
        "weights_per_gpu_bytes": round(b.weights_bytes),
        "activation_bytes": round(b.activation_bytes),
        "overhead_bytes": round(b.overhead_bytes),
        "device_bytes": round(b.device_bytes),
        "usable_bytes": round(b.usable_bytes),
        "kv_pool_bytes": round(b.kv_pool_bytes),
        "kv_dtype_bytes": b.kv_dtype_bytes,
        "kv_dtype_note": result.kv_dtype_note,
        "kv_bytes_per_token": kvmath.kv_bytes_per_token(result.model, b.kv_dtype_bytes),
        "kv_bytes_per_token_per_gpu": b.kv_bytes_per_token,
        "kv_blocks": ev.kv_blocks,
        "block_size": ev.block_tokens,  # SGLang: its page size
        "kv_capacity_tokens": ev.kv_capacity_tokens,
        # SGLang's window-layer pool of a hybrid sliding-window model (plan.sglang_pool)
        "kv_window_pool_tokens": b.kv_window_pool_tokens,
        "max_model_len": ev.max_model_len,
        # a config that does not start serves nobody: no concurrency to report
        "max_concurrency": ev.max_concurrency if ev.fits else None,
        "max_concurrency_at_max_model_len": ev.max_concurrency_at_max_model_len
        if ev.fits
        else None,
        "concurrency_limited_by": ev.concurrency_limited_by,
        # vLLM's own pool, known to within a share (plan.memory.POOL_DOUBT): what one
        # that much smaller holds; None where the pool is known or the config does not fit
        "smaller_pool": ev.smaller_pool.model_dump() if ev.fits and ev.smaller_pool else None,
        "fits": ev.fits,
        "breaking_term": ev.breaking_term,
        "verdict": ev.verdict,
        "tp": cfg.tensor_parallel_size,
        "pp": cfg.pipeline_parallel_size,
        "dp": cfg.data_parallel_size,
        "tpot_lower_bound_ms": plan.bounds.tpot_lower_bound_ms,
        "ttft_lower_bound_ms": plan.bounds.ttft_lower_bound_ms,
        "bounds": plan.bounds.model_dump(),
        "parallelism": [o.model_dump() for o in plan.parallelism],
        "fixes": [f.model_dump() for f in plan.fixes],
        "engine_config": cfg.model_dump(),
        "engine_recommendation": {"engine": result.engine, "reason": result.engine_reason},
        "launch": {name: spec.shell() for name, spec in result.launch.items()},
        "launch_unsupported": {
            name: list(spec.unsupported) for name, spec in result.launch.items()
        },
        "launch_notes": {name: list(spec.notes) for name, spec in result.launch.items()},
        "launch_withheld": result.launch_withheld,
        "gib": {"weights": b.weights_bytes / GiB, "kv_pool": b.kv_pool_bytes / GiB},
    }
