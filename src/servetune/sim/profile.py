"""Calibrated step-time profiles: the coefficients, stored as JSON, checked on load.

A profile holds the calibrated tier's coefficients for one (engine, version, model,
hardware) and how well they fitted; :mod:`servetune.sim.calibrate` fits them from measured
runs. Loading refuses anything that is not a profile, and `Profile.check` a profile
measured on another engine, model or hardware. Every step and front-end term is a
finite number of seconds in [0, MAX_TERM_S] (a NaN step hung `simulate`, a negative one
made negative TTFTs), named as `steptime.FEATURES` names them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator

from servetune.errors import InputError, from_validation_error
from servetune.outfile import replaced
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.sim.steptime import FEATURES
from servetune.yamlfile import read_text

PROFILE_KIND = "servetune-sim-profile"
PROFILE_VERSION = 1  # the newest profile format this servetune reads
# The most any term may be, in seconds per unit: a step of a minute is far past any engine
# serving interactively, and a larger one overflows the simulator's nanosecond clock
# (`"const": 1e9` gave 0 tok/s and a cast warning).
MAX_TERM_S = 60.0
FIX = "recalibrate (servetune calibrate)"


def _seconds(v: float) -> float:
    if not (math.isfinite(v) and 0.0 <= v <= MAX_TERM_S):
        raise ValueError(f"must be a finite number of seconds from 0 to {MAX_TERM_S:g}")
    return v


Seconds = Annotated[float, AfterValidator(_seconds)]


class FitQuality(BaseModel):
    samples: int
    runs: list[str] = Field(default_factory=list)
    r2: float
    rel_rmse: float
    confidence: Literal["high", "medium", "low"]  # the rules: sim.confidence
    dropped: list[str] = Field(default_factory=list)
    # Step terms fitted on the decode-only gaps (sim.calibrate.decode_line) and held
    # there by the replay fit.
    held: list[str] = Field(default_factory=list)
    # Why the confidence is not "high" (one line each), and the runs that would lift it.
    problems: list[str] = Field(default_factory=list)
    fixes: list[str] = Field(default_factory=list)
    # "least squares" on per-step gaps, or "least squares + replay" (sim.calibrate.
    # fit_by_replay, which needs the engine's knobs); after a replay rel_rmse is the
    # root mean squared log error of the replayed figures.
    method: str = "least squares"
    # How far repeats of one workload differ (sim.calibrate.repeat_spread): the host's
    # part of the replay error; None when no workload ran twice.
    repeat_spread: float | None = None


class Profile(BaseModel):
    """Coefficients of the calibrated tier for one (engine, version, model, hardware)."""

    kind: str = PROFILE_KIND
    version: int = PROFILE_VERSION
    engine: str
    engine_version: str = "unknown"
    model: str
    hardware: str
    tier: str = "calibrated"
    # Seconds per unit of each `steptime.FEATURES` term; a missing one is 0 (a profile
    # from before the term), but a profile file must carry "const" (`load_profile`).
    coefficients: dict[str, Seconds]
    stderr: dict[str, float] = Field(default_factory=dict)
    api_overhead_s: Seconds = 0.0
    # Serial front-end time per request before the engine sees it (steptime.StepModel).
    ingress_s: Seconds = 0.0
    ingress_per_token_s: Seconds = 0.0
    # First-time cost of a new step size (steptime.StepModel.new_shape_s).
    new_shape_s: Seconds = 0.0
    new_shape_per_token_s: Seconds = 0.0
    fit: FitQuality | None = None
    created_utc: str = ""

    @field_validator("version")
    @classmethod
    def _readable_version(cls, v: int) -> int:
        if not 1 <= v <= PROFILE_VERSION:  # a newer format's fields would be misread
            known = "1" if PROFILE_VERSION == 1 else f"1 to {PROFILE_VERSION}"
            raise ValueError(f"this servetune reads profile version {known}")
        return v

    @field_validator("coefficients")
    @classmethod
    def _known_terms(cls, coef: dict[str, float]) -> dict[str, float]:
        unknown = [k for k in coef if k not in FEATURES]
        if unknown:  # a misspelt term would be priced at 0 unseen
            raise ValueError(
                f"unknown term {', '.join(map(repr, unknown))}: the terms are {', '.join(FEATURES)}"
            )
        return coef

    @property
    def fit_for_use(self) -> bool:
        """False for a profile whose fit failed a rule (`sim.confidence`): it is written
        when asked, marked, but never picked up as anyone's default."""
        return self.fit is None or self.fit.confidence != "low"

    def warning(self) -> str | None:
        """One line for stderr when the profile is not fit for use, else None."""
        if self.fit_for_use:
            return None
        fit = self.fit
        assert fit is not None
        why = f" ({'; '.join(fit.problems)})" if fit.problems else ""
        return (
            f"profile {self.key} has LOW confidence{why}: its predictions may be far off; "
            f"fix: {'; '.join(fit.fixes) or FIX}"
        )

    @property
    def key(self) -> str:
        return f"{self.engine}@{self.engine_version}/{self.model}/{self.hardware}"

    def check(self, engine: str, model: str, hardware: str) -> None:
        """Refuse a profile measured on another engine, model or hardware."""
        if (self.engine, self.model, self.hardware) != (engine, model, hardware):
            raise InputError(
                "--profile",
                f"profile is for {self.engine}/{self.model} on {self.hardware}, "
                f"not {engine}/{model} on {hardware}",
                "calibrate one for this combination (servetune calibrate) or drop --profile",
            )


def load_profile(path: str | Path) -> Profile:
    """The profile in `path`; anything else, or a profile with a bad or missing value, is
    refused in one line naming the field (`coefficients.const`, `fit.r2`)."""
    p = Path(path)
    try:
        data = json.loads(read_text(p, "--profile"))  # unreadable or binary: one line
    except json.JSONDecodeError as exc:
        raise InputError("--profile", f"{p} is not JSON ({exc.msg})", None) from exc
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise InputError("--profile", f"{p} is not a servetune simulator profile", None)
    try:
        prof = Profile.model_validate(data)
    except ValidationError as exc:
        bad = from_validation_error(exc)  # field: the value's path, problem: what is wrong
        raise InputError("--profile", f"{p}: {bad.field}: {bad.problem}", FIX) from None
    if "const" not in prof.coefficients:  # every step costs it: 0 unseen is no profile
        raise InputError("--profile", f"{p}: coefficients.const is missing", FIX)
    return prof


def save_profile(profile: Profile, path: str | Path, field: str = "--output") -> None:
    with replaced(path, field) as tmp:
        tmp.write_text(profile.model_dump_json(indent=2) + "\n")


def load_results(paths: Sequence[str | Path], field: str = "calibrate") -> list[RunResult]:
    """Bench result files (RunResult JSON) for calibration; a bad one names `field`, the
    option that gave it (calibrate's arguments, validate's --runs)."""
    return [load_result(path, field) for path in paths]
