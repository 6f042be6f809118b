"""`servetune quality`: does a candidate build of a model (a lower quant, another dtype)
answer like its baseline? Perplexity from prompt logprobs, greedy-continuation token
agreement and exact match on a small task set, each with its noise bound, then seed 003
§2's acceptance rule with the store's throughput, cost and P99."""

from servetune.lazy import lazy_exports as _lazy_exports

_WHERE = {
    "Corpus": "corpus",
    "load_corpus": "corpus",
    "Endpoint": "endpoint",
    "connect": "endpoint",
    "random_weights": "endpoint",
    "Settings": "run",
    "QualityResult": "run",
    "Scores": "run",
    "compare": "run",
    "Perf": "verdict",
    "judge": "verdict",
    "perf": "stored",
    "requantized": "requantize",
}
__all__ = list(_WHERE)
__getattr__ = _lazy_exports(__name__, _WHERE)
