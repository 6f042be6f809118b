"""`servetune bench`: the load generator (client, pacing, workers, results)."""
