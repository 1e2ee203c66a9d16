"""The KV store: persistent per-conversation KV cache (format v4, LRU size cap, multi-process safe)."""
