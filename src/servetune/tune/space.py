"""The search space: EngineConfig knobs and the values to try, read from YAML.

    engine: vllm
    fixed: {max_model_len: 8192}                 # every config gets these
    baseline: {}                                  # the untuned start (engine defaults + fixed)
    knobs:
      max_num_seqs: [8, 16, 32, 64, 128]          # a list...
      max_num_batched_tokens: {min: 2048, max: 16384, mult: 2}   # ...or a range
      gpu_memory_utilization: [0.85, 0.90, 0.93]
    constraints:
      - max_num_batched_tokens >= max_num_seqs

Validation happens here, once, so a bad space is one line and exit 2 before anything runs:
unknown knobs (with the closest names), values EngineConfig refuses, knobs the engine has
no flag for, an empty space, and a contradictory one (every combination refused).
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servetune.engines.config import EngineConfig
from servetune.engines.registry import ADAPTERS, launch_command
from servetune.errors import InputError, closest
from servetune.filekinds import SPACE_KEYS, check_kind
from servetune.yamlfile import load_yaml

# Knobs that size memory, in seed 003 §13's OOM handling order (first = first to lower).
MEMORY_KNOBS = (
    "gpu_memory_utilization",
    "kv_cache_space_gib",
    "kv_cache_tokens",
    "max_num_batched_tokens",
    "max_num_seqs",
    "parallel_slots",
    "max_model_len",
)
# Settings a study holds fixed and never searches: extra flags (e.g. --load-format dummy)
# and the engine release the simulator prices (EngineConfig.engine_version).
_FIXED_ONLY = {"extra_args", "engine_version"}
_NOT_KNOBS = {"engine"} | _FIXED_ONLY
# Combinations a space may hold: every one is checked (EngineConfig + constraints, ~20 us
# each on this host), so 100,000 is ~2 s before the first trial; 1e6 was ~20 s of silence.
_MAX_POINTS = 100_000


@dataclass(frozen=True)
class SearchSpace:
    """Validated space: `knobs` maps each knob to its values in the order given."""

    engine: str
    knobs: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    constraints: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        n = 1
        for v in self.knobs.values():
            n *= len(v)
        return n

    def points(self) -> Iterator[dict[str, Any]]:
        """Every combination, in grid order (last knob fastest)."""
        names = list(self.knobs)
        for combo in itertools.product(*(self.knobs[k] for k in names)):
            yield dict(zip(names, combo, strict=True))

    def config(self, point: Mapping[str, Any]) -> EngineConfig:
        """fixed + point as a validated EngineConfig (ValueError when refused)."""
        return EngineConfig.model_validate({**self.fixed, **point, "engine": self.engine})

    def baseline_config(self) -> EngineConfig:
        return self.config(self.baseline)

    def why_invalid(self, point: Mapping[str, Any]) -> str | None:
        """None when `point` is a config to try, else the reason (a constraint, a refusal)."""
        values = {**self.fixed, **point}
        for c in self.constraints:
            if not check_constraint(c, values):
                return f"constraint {c!r}"
        try:
            self.config(point)
        except ValueError as exc:
            return _first_error(exc)
        return None

    def valid_points(self) -> list[dict[str, Any]]:
        return [p for p in self.points() if self.why_invalid(p) is None]

    def point_of(self, cfg: EngineConfig) -> dict[str, Any]:
        """The knob values of `cfg` (for configs made from this space)."""
        return {k: getattr(cfg, k) for k in self.knobs}

    def fingerprint(self) -> str:
        blob = json.dumps(
            [self.engine, self.knobs, self.fixed, self.baseline, self.constraints],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "knobs": {k: list(v) for k, v in self.knobs.items()},
            "fixed": self.fixed,
            "baseline": self.baseline,
            "constraints": list(self.constraints),
        }


def config_key(cfg: EngineConfig) -> str:
    """Stable short id of a config (what the store's trial runs are keyed by)."""
    blob = json.dumps(cfg.model_dump(mode="json", exclude_defaults=True), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def config_label(cfg: EngineConfig, names: list[str] | tuple[str, ...]) -> str:
    """`max_num_seqs=64 gpu_memory_utilization=0.9`: the knobs that vary, for tables."""
    return " ".join(f"{k}={fmt_value(getattr(cfg, k))}" for k in names) or "baseline"


def fmt_value(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# --- parsing --------------------------------------------------------------------------


def load_space(path: str | Path) -> SearchSpace:
    data = load_yaml(path, "--space")
    if isinstance(data, dict) and "space" in data and "knobs" not in data:
        data = data["space"]
    return parse_space(data)


def parse_space(data: Any, engine: str | None = None) -> SearchSpace:
    """A validated SearchSpace from a mapping (YAML). `engine` overrides the file's."""
    if data is None:
        raise InputError("space", "the space is empty", "give knobs: {max_num_seqs: [8, 16, 32]}")
    if not isinstance(data, dict):
        raise InputError("space", "must be a mapping with `knobs:`", "see docs/tune.md")
    unknown = set(data) - set(SPACE_KEYS)
    if unknown:
        check_kind(data, "search space", "space")
        raise InputError(
            "space", f"unknown key {sorted(unknown)[0]!r}", f"keys: {', '.join(SPACE_KEYS)}"
        )
    eng = engine or data.get("engine") or "vllm"
    if eng not in ADAPTERS:  # every engine servetune can launch (mlx, transformers too)
        near = closest(str(eng), ADAPTERS)
        raise InputError(
            "space.engine",
            f"unknown engine {eng!r}",
            f"one of {', '.join(ADAPTERS)}" if not near else f"did you mean {', '.join(near)}?",
        )
    raw_knobs = data.get("knobs") or {}
    if not isinstance(raw_knobs, dict):
        raise InputError("space.knobs", "must map knob names to value lists")
    if not raw_knobs:
        raise InputError("space.knobs", "the space has no knobs", "e.g. max_num_seqs: [8, 16, 32]")
    fixed = _mapping(data.get("fixed"), "space.fixed")
    baseline = _mapping(data.get("baseline"), "space.baseline")
    knobs: dict[str, tuple[Any, ...]] = {}
    for name, spec in raw_knobs.items():
        _check_name(str(name), "space.knobs")
        values = _values(str(name), spec)
        if not values:
            raise InputError(f"space.knobs.{name}", "has no values", "give at least one value")
        knobs[str(name)] = values
    size = math.prod(len(v) for v in knobs.values())
    if size > _MAX_POINTS:  # before any value is checked: checking is what takes the time
        raise InputError(
            "space",
            f"{size:,} combinations, more than the {_MAX_POINTS:,} a space may hold",
            "fewer values per knob: a range with mult, or a larger step",
        )
    if both := sorted(set(knobs) & set(fixed)):  # the knobs' values replaced the fixed one
        raise InputError(
            f"space.fixed.{both[0]}",
            "is also a knob: fixed means every config, a knob varies",
            "keep it in one of fixed or knobs",
        )
    for name in (*fixed, *baseline):
        if name not in _FIXED_ONLY:
            _check_name(name, "space.fixed" if name in fixed else "space.baseline")
    constraints = data.get("constraints") or []
    if isinstance(constraints, str):
        constraints = [constraints]
    names = set(knobs) | set(fixed) | set(EngineConfig.model_fields)
    for c in constraints:
        _check_bound(str(c), parse_constraint(str(c), names), set(knobs) | set(fixed))
    space = SearchSpace(eng, knobs, fixed, baseline, tuple(str(c) for c in constraints))
    _check_values(space)
    _check_engine_maps(space)
    try:
        space.baseline_config()
    except ValueError as exc:
        raise InputError("space.baseline", _first_error(exc)) from None
    reasons: dict[str, int] = {}
    for p in space.points():
        why = space.why_invalid(p)
        if why is None:
            return space
        reasons[why] = reasons.get(why, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
    raise InputError(
        "space",
        f"contradictory: all {space.size} combinations are refused ("
        + "; ".join(f"{n} by {why}" for why, n in top)
        + ")",
        "relax the constraints or the values",
    )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(where, "must be a mapping of knob: value")
    return {str(k): v for k, v in value.items()}


def _check_name(name: str, where: str) -> None:
    if name in _FIXED_ONLY and where == "space.knobs":
        raise InputError(f"{where}.{name}", "is not searched", f"put {name} under space.fixed")
    if name in _NOT_KNOBS or name not in EngineConfig.model_fields:
        near = closest(name, [k for k in EngineConfig.model_fields if k not in _NOT_KNOBS])
        hint = f"did you mean {', '.join(near)}?" if near else "see EngineConfig's knobs"
        raise InputError(where, f"unknown knob {name!r}", hint)


def _values(name: str, spec: Any) -> tuple[Any, ...]:
    """A list, a scalar, or a range {min, max, mult | step}."""
    where = f"space.knobs.{name}"
    if isinstance(spec, list):
        nested = next((v for v in spec if isinstance(v, (list, dict))), None)
        if nested is not None:
            raise InputError(where, f"{nested!r} is not one value", "list the values flat")
        out = list(dict.fromkeys(spec))  # duplicates dropped, order kept
    elif isinstance(spec, dict):
        extra = sorted(str(k) for k in set(spec) - {"min", "max", "mult", "step"})
        if extra:  # named: "needs min, max and mult" read wrong beside all three
            near = closest(extra[0], ["min", "max", "mult", "step"])
            hint = f"did you mean {', '.join(near)}?" if near else "min, max and mult or step"
            raise InputError(f"{where}.{extra[0]}", "a range has no such key", hint)
        if "min" not in spec or "max" not in spec:
            raise InputError(where, "a range needs min, max and mult or step", "or give a list")
        mult, step = spec.get("mult"), spec.get("step")
        if (mult is None) == (step is None):
            raise InputError(where, "give exactly one of mult (x2: 8,16,32) or step (+1)")
        times = mult is not None  # x mult each value, else + step
        lo, hi, by = (
            _number(where, k, spec[k]) for k in ("min", "max", "mult" if times else "step")
        )
        if hi < lo:
            raise InputError(where, f"range min {lo!r} .. max {hi!r} is empty")
        n = _range_length(where, lo, hi, by, times)
        out = [lo * by**i if times else lo + by * i for i in range(n)]
        if isinstance(lo, float) or isinstance(by, float):
            out = [round(float(x), 6) for x in out]
    else:
        out = [spec]
    return tuple(out)


def _number(where: str, key: str, value: Any) -> int | float:
    """A range bound or step: a finite number (YAML reads `1e12` as text: say so)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        hint = "YAML reads 1e12 as text: write 1.0e+12" if isinstance(value, str) else None
        raise InputError(where, f"{key} must be a finite number (got {value!r})", hint)
    return value


def _range_length(where: str, lo: float, hi: float, by: float, times: bool) -> int:
    """How many values min..max holds, `times` by x `by` (mult) else by + `by` (step),
    refused past _MAX_POINTS before any is made (a step of 1 to 1e12 is a trillion)."""
    if times:
        if by <= 1 or lo <= 0:
            raise InputError(where, "a mult range needs mult > 1 and min > 0")
        steps = math.log(hi / lo) / math.log(by)
    else:
        if by <= 0:
            raise InputError(where, "step must be > 0")
        steps = (hi - lo) / by  # a float: a tiny step makes it inf, never an int overflow
    if steps + 1 > _MAX_POINTS:
        raise InputError(
            where,
            f"min {lo:g} .. max {hi:g} gives {steps + 1:,.0f} values, more than the "
            f"{_MAX_POINTS:,} a space may hold",
            "use mult (x2: 8,16,32) or a larger step",
        )
    return int(steps + 1e-9) + 1


def _check_values(space: SearchSpace) -> None:
    """Each value alone must be one EngineConfig accepts (names the knob and value)."""
    for name, values in space.knobs.items():
        for v in values:
            try:
                EngineConfig.model_validate({"engine": space.engine, name: v})
            except ValueError as exc:
                raise InputError(f"space.knobs.{name}", f"{v!r}: {_first_error(exc)}") from None


def _check_engine_maps(space: SearchSpace) -> None:
    """A knob the engine has no flag for would make every trial the same config; under
    `fixed:` it was kept in the winner's config and left out of its launch command."""
    entries = [("knobs", name, values) for name, values in space.knobs.items()]
    entries += [("fixed", name, [v]) for name, v in space.fixed.items()]
    for part, name, values in entries:
        for v in values:
            try:
                spec = launch_command(space.engine, space.config({name: v}), "model")
            except InputError:
                continue  # an engine-specific refusal of one value: left to why_invalid
            except ValueError:
                continue
            why = spec.why_unsupported(name)
            if why is not None:
                raise InputError(
                    f"space.{part}.{name}",
                    f"{space.engine} has no flag for {name}" + (f": {why}" if why else ""),
                    "drop it from the space (the engine would not run with it)",
                )


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", exc)).removeprefix("Value error, ")
        return f"{loc}: {msg}" if loc else msg
    return str(exc).splitlines()[0]


# --- constraints: a tiny, safe expression language ------------------------------------

_CMP = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_BIN = {
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Div: operator.truediv,
}


def parse_constraint(text: str, names: set[str]) -> ast.Expression:
    """`a <= b * 4`, `a != 1 or b == 2`: comparisons of knobs and numbers, and/or/not.
    Anything else (calls, attributes, unknown names) is refused, so no code runs."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise InputError("space.constraints", f"{text!r} is not an expression") from None
    for node in ast.walk(tree):
        ok = isinstance(
            node,
            (
                ast.Expression,
                ast.Compare,
                ast.BinOp,
                ast.BoolOp,
                ast.UnaryOp,
                ast.Name,
                ast.Constant,
                ast.Load,
                ast.And,
                ast.Or,
                ast.Not,
                ast.USub,
                *_CMP,
                *_BIN,
            ),
        )
        if not ok:
            raise InputError("space.constraints", f"{text!r}: {type(node).__name__} not allowed")
        if isinstance(node, ast.Name) and node.id not in names | {"None", "true", "false"}:
            near = closest(node.id, names)
            hint = f"did you mean {', '.join(near)}?" if near else None
            raise InputError("space.constraints", f"{text!r}: unknown name {node.id!r}", hint)
    return tree


def _check_bound(text: str, tree: ast.Expression, space_names: set[str]) -> None:
    """Refuse a constraint on a knob the space neither varies nor fixes: every config
    leaves it unset, and an unset knob makes its comparisons true, so the constraint
    would never bind (`dtype > 1` kept every config, silently)."""
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else None
        if name in EngineConfig.model_fields and name not in space_names:
            raise InputError(
                "space.constraints",
                f"{text!r}: {name} is neither a knob nor fixed in the space, so the "
                "constraint never binds",
                f"add {name} to knobs or fixed, or drop the constraint",
            )


def check_constraint(text: str, values: Mapping[str, Any]) -> bool:
    """Evaluate a constraint; a knob left unset (None) makes its comparisons true."""
    tree = parse_constraint(text, set(values) | set(EngineConfig.model_fields))
    defaults = {k: f.default for k, f in EngineConfig.model_fields.items()}
    env = {**defaults, **values, "true": True, "false": False}
    try:
        return bool(_eval(tree.body, env))
    except ZeroDivisionError:
        raise InputError("space.constraints", f"{text!r} divides by zero") from None
    except (TypeError, OverflowError) as exc:  # `dtype > 1`, a string compared to a number
        raise InputError("space.constraints", f"{text!r} cannot be evaluated: {exc}") from None


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return None if node.id == "None" else env.get(node.id)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return None if v is None else -v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        return None if a is None or b is None else _BIN[type(node.op)](a, b)
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v, env) for v in node.values]
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env)
            if left is None or right is None:
                is_eq = type(op) in (ast.Eq, ast.NotEq)
                if is_eq and not _CMP[type(op)](left, right):
                    return False
                left = right
                continue
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    raise InputError("space.constraints", f"cannot evaluate {type(node).__name__}")
