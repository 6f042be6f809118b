"""Engine simulator: scheduler replay (vLLM v1 paged, llama.cpp slots) x step-time model."""
