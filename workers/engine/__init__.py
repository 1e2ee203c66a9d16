"""The inference engine: GGUF loading, tokenizer, architectures, backends, KV cache, sampler."""
