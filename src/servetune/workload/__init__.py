"""WorkloadSpec and its materialisation into concrete requests."""
