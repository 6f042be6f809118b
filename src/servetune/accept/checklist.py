"""The go-live checklist of seed 003 §15 (上线验收清单), one row per item.

Each row has a stable `id`, the seed's own words, and after a run a status with its
evidence: `pass`, `fail`, `n/a` (the item does not apply to this deployment, said why)
or `cannot check here` (with what would make it checkable). The verdict passes only
when no item fails; `cannot check here` is listed but does not fail acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servetune.status import StrEnum


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NA = "n/a"
    UNCHECKED = "cannot check here"
    PENDING = "not run"  # the checklist was saved before this item was reached


@dataclass(frozen=True)
class ItemSpec:
    id: str
    title: str
    seed: str  # the item as seed 003 §15 words it


# Seed 003 §15, in the seed's order (23 items).
ITEMS: tuple[ItemSpec, ...] = (
    ItemSpec(
        "model-pinned",
        "Model version, weights hash and tokenizer pinned",
        "模型版本、权重哈希和Tokenizer版本固定",
    ),
    ItemSpec(
        "stack-pinned",
        "Driver, CUDA, NCCL and engine versions pinned",
        "驱动、CUDA、NCCL和推理引擎版本固定",
    ),
    ItemSpec(
        "quality-regression",
        "BF16/FP16/quantized model passes the quality regression",
        "BF16、FP16或量化模型通过业务质量回归",
    ),
    ItemSpec(
        "input-limit",
        "max_input_tokens set from the real distribution",
        "max_input_tokens按真实分布设置",
    ),
    ItemSpec("output-cap", "max_new_tokens limited by the server", "max_new_tokens由服务端限制"),
    ItemSpec(
        "long-short-pools",
        "Long and short context requests: pooling decided",
        "长短上下文请求已决定是否分池",
    ),
    ItemSpec(
        "memory-headroom",
        "Memory utilisation keeps a peak safety margin",
        "显存利用率保留峰值安全余量",
    ),
    ItemSpec(
        "kv-capacity", "KV cache capacity covers the target concurrency", "KV Cache容量覆盖目标并发"
    ),
    ItemSpec(
        "max-num-seqs-tested", "max_num_seqs backed by real load tests", "max_num_seqs经过真实压测"
    ),
    ItemSpec(
        "max-num-batched-tokens-tested",
        "max_num_batched_tokens weighed on TTFT vs TPOT",
        "max_num_batched_tokens经过TTFT和TPOT权衡",
    ),
    ItemSpec(
        "chunked-prefill-long-prompts",
        "Chunked prefill tested with real long prompts",
        "Chunked Prefill经过真实长Prompt测试",
    ),
    ItemSpec(
        "prefix-cache-monitored", "Prefix cache hit rate monitored", "Prefix Cache命中率有监控"
    ),
    ItemSpec(
        "cuda-graph-shapes",
        "CUDA graphs cover only the frequent shapes",
        "CUDA Graph只覆盖高频shape",
    ),
    ItemSpec(
        "cancel-frees-work", "Client cancellation frees the generation", "客户端取消能释放生成任务"
    ),
    ItemSpec("queue-bound", "The request queue has a hard limit", "请求队列有硬上限"),
    ItemSpec(
        "per-user-limits",
        "RPS, concurrency and tokens limited per user",
        "按用户限制RPS、并发和token",
    ),
    ItemSpec(
        "latency-monitored",
        "TTFT, TPOT, queue time and P99 monitored",
        "监控TTFT、TPOT、排队时间和P99",
    ),
    ItemSpec(
        "hardware-monitored",
        "Memory, utilisation, temperature, power, HW errors monitored",
        "监控显存、利用率、温度、功耗和硬件错误",
    ),
    ItemSpec(
        "autoscaling-signals",
        "Autoscaling does not rest on GPU utilisation alone",
        "自动扩容不只依赖GPU利用率",
    ),
    ItemSpec(
        "warmup-before-traffic",
        "New instances warm up before taking traffic",
        "新实例完成预热后再接流量",
    ),
    ItemSpec(
        "stability-stage",
        "Peak, burst, long/short mix and disconnect tests passed",
        "通过峰值、突发、长短混合和断连压测",
    ),
    ItemSpec(
        "oom-step-back",
        "Shipped config at least one safe step back from the OOM edge",
        "上线配置比OOM边界至少回退一个安全档位",
    ),
    ItemSpec(
        "config-change-linked",
        "Config changes support canary and rollback, linked to data",
        "配置变更支持灰度、回滚并关联性能数据",
    ),
)

ITEM_IDS: tuple[str, ...] = tuple(i.id for i in ITEMS)


@dataclass
class Item:
    """One checked row. `evidence`: measured values and facts, as short lines; `runs`:
    the store's run ids behind them; `fix`: for `cannot check here` what would make it
    checkable, for `fail` what to change."""

    spec: ItemSpec
    status: Status = Status.PENDING
    evidence: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    fix: str | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.spec.id,
            "title": self.spec.title,
            "seed": self.spec.seed,
            "status": str(self.status),
            "evidence": list(self.evidence),
            "runs": list(self.runs),
            "fix": self.fix,
            "values": self.values,
        }


@dataclass
class Finding:
    """What a check returns: the status and evidence of one item."""

    status: Status
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None
    runs: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def with_run(self, run_id: str) -> Finding:
        """The finding, citing the stored run it was measured in."""
        self.runs.append(run_id)
        return self


def passed(*evidence: str, **values: Any) -> Finding:
    return Finding(Status.PASS, list(evidence), values=values)


def failed(fix: str, *evidence: str, **values: Any) -> Finding:
    return Finding(Status.FAIL, list(evidence), fix=fix, values=values)


def not_applicable(*evidence: str) -> Finding:
    return Finding(Status.NA, list(evidence))


def unchecked(fix: str, *evidence: str, **values: Any) -> Finding:
    """`cannot check here`; `fix` says what would make the item checkable."""
    return Finding(Status.UNCHECKED, list(evidence), fix=fix, values=values)


class Checklist:
    """All 23 items, in the seed's order, filled in as checks run."""

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        self.items: dict[str, Item] = {s.id: Item(s) for s in ITEMS}
        self.context: dict[str, Any] = dict(context or {})  # url, engine, study, workload...
        self.notes: list[str] = []

    def record(self, item_id: str, f: Finding, runs: list[str] | None = None) -> Item:
        it = self.items[item_id]
        it.status, it.evidence, it.fix, it.values = f.status, f.evidence, f.fix, f.values
        it.runs = list(dict.fromkeys([*f.runs, *(runs or [])]))
        return it

    def counts(self) -> dict[str, int]:
        out = {str(s): 0 for s in Status}
        for it in self.items.values():
            out[str(it.status)] += 1
        return out

    @property
    def failed_ids(self) -> list[str]:
        return [i for i, it in self.items.items() if it.status == Status.FAIL]

    @property
    def complete(self) -> bool:
        return all(it.status != Status.PENDING for it in self.items.values())

    def verdict(self) -> str:
        """`accepted` when nothing fails and every item ran; else why not, in a line."""
        c = self.counts()
        if self.failed_ids:
            return f"not accepted: {c['fail']} item(s) fail ({', '.join(self.failed_ids)})"
        if not self.complete:
            return f"incomplete: {c[str(Status.PENDING)]} item(s) not run"
        return f"accepted ({c['pass']} pass, {c['n/a']} n/a, {c['cannot check here']} unchecked)"

    @property
    def ok(self) -> bool:
        return not self.failed_ids and self.complete

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict(),
            "accepted": self.ok,
            "counts": self.counts(),
            "context": self.context,
            "notes": self.notes,
            "items": [it.to_json() for it in self.items.values()],
        }
