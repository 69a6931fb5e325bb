"""The model: Llama-family layers, weights loading, tokenizer and the CPU kernels."""
