"""SGLang's KV side and admission rule: a RadixAttention token pool and the new-token-ratio
reservation that decides who may start.

Facts from sgl-project/sglang (python/sglang/srt/managers/schedule_policy.py at 00550cd11b35,
schedule_batch.py at 000eaffacf04, environ.py; the adapter targets 0.5.23):

- RadixAttention keeps every computed prompt in a radix tree over token ids, page by page
  (`--page-size`, 1 by default), so a shared prefix is reused to the token; unreferenced
  leaves are evicted least recently used first. vLLM's prefix cache reuses whole 16-token
  blocks only: a 100-token shared prefix is 100 tokens here, 96 there. Modelled with the
  paged pool of `sim.kvcache` at one page = `page_size` tokens (a page's hash stands for
  its tree node; freed tails are evicted before their prefixes, as leaves go first).
- Admission (PrefillAdder): a waiting request starts only if its uncached prompt plus its
  max_new_tokens (clipped at 4096) plus one page is below what is free or evictable after
  reserving, for each running request, (max_new_tokens - generated) x new_token_ratio, and
  what this batch already took. The ratio starts at 0.7 x --schedule-conservativeness,
  falls by (init - 0.14 x init) / 600 every decode step to 0.14 x init, and goes back to
  init when the engine is idle.
- Retraction: before a decode step that the pool cannot supply one page per running
  request, SGLang retracts decoding requests - fewest generated tokens first, the longest
  prompt among equals - at least one and until the rest fit; their decode KV is freed (the
  prompt stays in the tree, evictable), they rejoin the end of the waiting queue, and the
  ratio becomes (tokens generated + 20 x requests left) / (their max_new_tokens + 1),
  at most 1.
- `--schedule-policy` fcfs (the default) keeps arrival order; lpm sorts the queue by the
  longest cached prefix, falls back to fcfs above 128 waiting requests, and defers a
  request whose prefix another waiting request shares (>= 32 tokens) while its own cached
  match is <= 32 tokens, so one of them computes the prefix first.
- With the radix cache disabled and ignore_eos requests (the benchmark's), SGLang reserves
  every request's remaining tokens in full (`add_one_req_ignore_eos`): ratio 1, never a
  retraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servetune.engines.config import EngineConfig
from servetune.engines.extra import extra_flag, extra_given, extra_number
from servetune.errors import InputError
from servetune.plan.planner import Evaluation
from servetune.plan.sglang_pool import MAX_PREFILL_TOKENS, page_tokens
from servetune.sim.policies import PagedPolicy
from servetune.sim.request import SimRequest

if TYPE_CHECKING:
    from servetune.sim.scheduler import SchedConfig

# environ.py: SGLANG_INIT_NEW_TOKEN_RATIO, _MIN_NEW_TOKEN_RATIO_FACTOR,
# _NEW_TOKEN_RATIO_DECAY_STEPS, _RETRACT_DECODE_STEPS, _CLIP_MAX_NEW_TOKENS_ESTIMATION.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
# schedule_policy.py: lpm turns into fcfs above this queue length; the in-batch prefix
# thresholds (IN_BATCH_PREFIX_CACHING_CHECK / _DEPRIORITIZE_THRESHOLD).
LPM_MAX_QUEUE = 128
IN_BATCH_PREFIX_TOKENS = 32


@dataclass(frozen=True)
class RadixConfig:
    """SGLang's scheduler knobs, resolved (`sim.engine.setup` builds it)."""

    chunked_prefill_size: int  # 0: chunked prefill off (--chunked-prefill-size -1)
    max_prefill_tokens: int  # --max-prefill-tokens: prompt tokens one prefill batch takes
    schedule_policy: str = "fcfs"  # fcfs | lpm | priority (--enable-priority-scheduling)
    conservativeness: float = 1.0  # --schedule-conservativeness
    ignore_eos_exact: bool = False  # radix cache off: full reservation, no retraction

    @property
    def init_ratio(self) -> float:
        if self.ignore_eos_exact:
            return 1.0
        return min(INIT_NEW_TOKEN_RATIO * self.conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        if self.ignore_eos_exact:
            return 1.0
        return min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)

    @property
    def decay_per_step(self) -> float:
        return (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS


def reserved_new_tokens(r: SimRequest, generated: int) -> int:
    """What SGLang expects a request may still write: max_new_tokens - generated, clipped."""
    return min(max(r.output_tokens - generated, 0), CLIP_MAX_NEW_TOKENS)


def ratio_after_retract(generated: list[int], max_new: list[int]) -> float:
    """The new_token_ratio after a retraction, from the requests that stay."""
    total = sum(generated) + RETRACT_DECODE_STEPS * len(generated)
    return min(1.0, total / (sum(max_new) + 1))


class RadixPolicy(PagedPolicy):
    """SGLang's token pool: `PagedPolicy` at page_size tokens a page, with the answers the
    SGLang step loop (`sim.sglang_sched`) asks besides: a request's cached prefix now (lpm),
    what a retraction frees, and how many decode steps may run before the admission rule
    could change its mind (`horizon`)."""

    __slots__ = ("horizon",)

    def __init__(self, pool_pages: int, page_size: int, chunked: bool, radix: bool) -> None:
        super().__init__(pool_pages, page_size, chunked, radix)
        # Decode steps the next stretch may run before a blocked admission is looked at
        # again (`sim.sglang_sched`); None: no limit.
        self.horizon: int | None = None

    def decode_steps_supplied(self, step: int, n: int) -> int:
        n = super().decode_steps_supplied(step, n)
        return n if self.horizon is None else max(1, min(n, self.horizon))

    def cached_prefix(self, r: SimRequest) -> int:
        """Prompt tokens a fresh admission of r would find in the tree now: its group's
        shared pages (or, retracted, its own) while they are cached, never the last prompt
        token. The tree holds a node only with its ancestors, so the cached pages are a
        prefix: found by bisection."""
        if not self.caching:
            return 0
        bs = self.block_size
        limit = (r.prefill_target - 1) // bs
        if not r.preemptions:
            limit = min(limit, r.shared_tokens // bs if r.prefix_group >= 0 else 0)
        kv = self.kv
        lo, hi = 0, limit  # pages 0..lo-1 cached; find the first missing one
        while lo < hi:
            mid = (lo + hi) // 2
            if kv.contains(r.block_hash(mid, bs)):
                lo = mid + 1
            else:
                hi = mid
        return lo * bs

    def release_preempted(self, r: SimRequest, kv_tokens: int) -> None:
        """A retracted request frees its KV: its prompt's pages stay in the tree
        (evictable), the tokens it generated are freed (schedule_batch `release_req`)."""
        super().release_preempted(r, min(kv_tokens, r.prompt_tokens))


# SGLang flags with no canonical knob that the model reads from `extra_args` (passed to the
# real engine as they are), and the ones it refuses because it does not model them.
MODELLED_POLICIES = ("fcfs", "lpm")
UNMODELLED_FLAGS = ("--enable-mixed-chunk", "--speculative-algorithm", "--enable-dp-attention")


def radix_sched_config(cfg: EngineConfig, ev: Evaluation) -> SchedConfig:
    """The scheduler's knobs for SGLang from the plan's evaluation: the pool (in pages) and
    max_running_requests as `plan.sglang_pool` sized them, the chunk and prefill budgets."""
    from servetune.sim.scheduler import SchedConfig

    if not ev.fits or ev.kv_blocks <= 0:
        raise InputError("config", f"the engine would not start: {ev.verdict}", None)
    b, page = ev.budget, page_tokens(cfg)
    pages = ev.kv_blocks
    if cfg.kv_cache_tokens is not None:  # --max-total-tokens
        pages = min(pages, max(cfg.kv_cache_tokens // page, 1))
    args = cfg.extra_args
    for flag in UNMODELLED_FLAGS:
        if extra_given(args, flag):
            raise InputError("extra_args", f"{flag} is not modelled", "simulate without it")
    policy = extra_flag(args, "--schedule-policy") or cfg.scheduling_policy
    if policy not in (*MODELLED_POLICIES, "priority"):
        raise InputError(
            "extra_args", f"--schedule-policy {policy} is not modelled", "use fcfs or lpm"
        )
    # the budget's batched tokens: the chunk size, or --max-prefill-tokens when chunking is off
    chunk = b.max_num_batched_tokens if cfg.enable_chunked_prefill else 0
    prefill = MAX_PREFILL_TOKENS if chunk else b.max_num_batched_tokens
    radix = RadixConfig(
        chunked_prefill_size=chunk,
        max_prefill_tokens=int(extra_number(args, "--max-prefill-tokens", prefill)),
        schedule_policy=policy,
        conservativeness=extra_number(args, "--schedule-conservativeness", 1.0),
        ignore_eos_exact=not cfg.enable_prefix_caching,
    )
    return SchedConfig(
        mode="radix",
        max_num_seqs=b.max_num_seqs,
        max_num_batched_tokens=chunk or prefill,
        max_model_len=ev.max_model_len,
        block_size=page,
        kv_blocks=pages,
        chunked_prefill=chunk > 0,
        prefix_caching=cfg.enable_prefix_caching,
        radix=radix,
    )


def radix_note(sc: SchedConfig) -> str:
    """One line on SGLang's pool and limits, for the CLI."""
    r = sc.radix
    chunk = f"chunked prefill {r.chunked_prefill_size}" if r.chunked_prefill_size else "no chunking"
    return (
        f"KV pool {sc.kv_blocks * sc.block_size:,} tokens (RadixAttention, page "
        f"{sc.block_size}); max_running_requests {sc.max_num_seqs}, {chunk}, "
        f"schedule policy {r.schedule_policy}, new_token_ratio {r.init_ratio:g} -> "
        f"{r.min_ratio:.3g}"
    )
