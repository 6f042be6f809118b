"""Unit constants. GiB (2**30) for memory capacities, GB (1e9) for bandwidth and datasheets."""

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9
TB = 10**12
TFLOP = 10**12
