"""Calibrated step-time profiles: the coefficients, stored as JSON, checked on load.

A profile holds the calibrated tier's coefficients for one (engine, version, model,
hardware) and how well they fitted; :mod:`servetune.sim.calibrate` fits them from measured
runs. Loading refuses anything that is not a profile, and `Profile.check` a profile
measured on another engine, model or hardware.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from servetune.errors import InputError
from servetune.outfile import replaced
from servetune.results.files import load_result
from servetune.results.schema import RunResult
from servetune.yamlfile import read_text

PROFILE_KIND = "servetune-sim-profile"


class FitQuality(BaseModel):
    samples: int
    runs: list[str] = Field(default_factory=list)
    r2: float
    rel_rmse: float
    confidence: str  # high | medium | low (the rules: sim.confidence)
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
    version: int = 1
    engine: str
    engine_version: str = "unknown"
    model: str
    hardware: str
    tier: str = "calibrated"
    coefficients: dict[str, float]
    stderr: dict[str, float] = Field(default_factory=dict)
    api_overhead_s: float = 0.0
    # Serial front-end time per request before the engine sees it (steptime.StepModel).
    ingress_s: float = 0.0
    ingress_per_token_s: float = 0.0
    # First-time cost of a new step size (steptime.StepModel.new_shape_s).
    new_shape_s: float = 0.0
    new_shape_per_token_s: float = 0.0
    fit: FitQuality | None = None
    created_utc: str = ""

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
        return (
            f"profile {self.key} has LOW confidence ({'; '.join(fit.problems)}): its "
            f"predictions may be far off; fix: {'; '.join(fit.fixes)}"
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
    p = Path(path)
    try:
        data = json.loads(read_text(p, "--profile"))  # unreadable or binary: one line
    except json.JSONDecodeError as exc:
        raise InputError("--profile", f"{p} is not JSON ({exc.msg})", None) from exc
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise InputError("--profile", f"{p} is not a servetune simulator profile", None)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise InputError("--profile", f"{p}: {exc.errors()[0]['msg']}", None) from None


def save_profile(profile: Profile, path: str | Path, field: str = "--output") -> None:
    with replaced(path, field) as tmp:
        tmp.write_text(profile.model_dump_json(indent=2) + "\n")


def load_results(paths: Sequence[str | Path], field: str = "calibrate") -> list[RunResult]:
    """Bench result files (RunResult JSON) for calibration; a bad one names `field`, the
    option that gave it (calibrate's arguments, validate's --runs)."""
    return [load_result(path, field) for path in paths]
