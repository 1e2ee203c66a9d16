"""The model architectures genie runs, by a GGUF's `general.architecture`: what a process that never loads the
engine (the daemon's model list, `genie pull`'s check of a file) tests a model against. The engine's
architecture table (workers/engine/arch) has an entry for each, and tests/test_boundaries.py holds the two
equal."""

ARCHITECTURE_NAMES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "gemma3", "gemma4")
