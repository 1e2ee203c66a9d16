"""An engine's KV against a KVStore in the same process: what `genie run --conv-id` does beside (or
without) a daemon. The worker process does the same through the KV-store process's socket."""

from __future__ import annotations

from workers.engine.engine import Engine, common_prefix_len

from .format import KVLayout
from .store import KVStore, Saved


def engine_layout(engine: Engine) -> KVLayout:
    """The layout of the engine's cache: its pools and the window of the layer that writes each."""
    cfg = engine.model.config
    return KVLayout.of(engine.kv.config, tuple(cfg.layers[i].sliding_window for i in cfg.kv_layers))


def hydrate(engine: Engine, store: KVStore, prompt_ids: list[int], conv_id: str = "", slot: int = 0) -> int:
    """Loads the longest saved prefix of the prompt into `slot` when it beats what the slot already holds;
    returns the tokens loaded (0: nothing better on disk)."""
    held = common_prefix_len(engine.kv.resident[slot], prompt_ids)
    if held >= len(prompt_ids) - 1:
        return 0
    snapshot = store.hydrate(prompt_ids, conv_id, longer_than=held)
    if snapshot is None:
        return 0
    engine.import_kv(snapshot, slot)
    return snapshot.n_tokens


def save(engine: Engine, store: KVStore, conv_id: str = "", slot: int = 0) -> Saved | None:
    """Saves what `slot` holds (prompt + generated tokens), when it is long enough to be worth hydrating."""
    if len(engine.kv.resident[slot]) < store.config.min_hydrate_tokens:
        return None
    return store.save(engine.export_kv(slot), conv_id)
