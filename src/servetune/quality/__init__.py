"""`servetune quality`: does a candidate build of a model (a lower quant, another dtype)
answer like its baseline? Perplexity from prompt logprobs, greedy-continuation token
agreement and exact match on a small task set, each with its noise bound, then seed 003
§2's acceptance rule with the store's throughput, cost and P99."""
