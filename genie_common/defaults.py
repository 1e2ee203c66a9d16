"""Defaults that more than one process's configuration starts from, stated once: the daemon's options
(config.py) and the in-process engine's (engine_options.py, `genie run`)."""

MODEL = "gemma3-270m"  # the model served when none is named (an installed package: genie_common/registry.py)
PREFILL_CHUNK = 256  # prompt tokens a forward pass; a cancel is seen between chunks
MAX_TOKENS = 1024  # an answer's token cap when a request sets none (a voice answer is far shorter)
