"""The tuner (`servetune tune`): a loop over EngineConfigs that calls the simulator or a
real engine through `bench`, finds each config's capacity under the SLO, and records every
point in the store. See docs/tune.md."""
