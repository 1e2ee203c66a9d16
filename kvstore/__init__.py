"""The KV store: persistent per-conversation KV cache (format v3, LRU size cap, multi-process safe)."""
