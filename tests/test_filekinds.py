"""The key names `filekinds` tells input files apart by are the models' own."""

from __future__ import annotations

import pytest

from servetune.errors import InputError
from servetune.filekinds import KINDS, check_kind
from servetune.slo import SLO
from servetune.tune.preset import Preset
from servetune.workload.spec import SHORTHAND_KEYS, WorkloadSpec


def test_the_kinds_keys_are_the_models_fields() -> None:
    assert KINDS["workload"][1] == set(WorkloadSpec.model_fields) | set(SHORTHAND_KEYS)
    assert KINDS["SLO"][1] == set(SLO.model_fields)
    assert KINDS["tune preset"][1] == set(Preset.model_fields)


def test_a_typo_is_left_to_the_caller_and_a_foreign_file_is_named() -> None:
    check_kind({"count": 5, "arival": {}}, "workload", "workload")  # a typo: no verdict here
    check_kind({"count": 5}, "workload", "workload")  # its own keys
    with pytest.raises(InputError) as exc:
        check_kind({"engine": "vllm"}, "workload", "workload")
    assert exc.value.problem.startswith("this reads as a tune preset file or a search space")
    assert exc.value.fix == "give it with --preset or --space"
