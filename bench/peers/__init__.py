"""`python -m bench peers`: kvstack beside llama.cpp, vLLM's CPU build and transformers on
the same model and thread count, the same workloads interleaved (docs/benchmarks.md)."""
