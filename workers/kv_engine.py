"""An engine's KV against a KVStore in the same process: what `genie run --conv-id` does beside (or
without) a daemon. The worker process does the same through the KV-store process's socket."""

from __future__ import annotations

from genie_kvstore.format import KVLayout
from genie_kvstore.policy import ReusePolicy
from genie_kvstore.store import KVStore, NotSaved, Saved

from .engine.engine import Engine


def engine_layout(engine: Engine) -> KVLayout:
    """The layout of the engine's cache: its pools and the window of the layer that writes each."""
    cfg = engine.model.config
    return KVLayout.of(engine.kv.config, tuple(cfg.layers[i].sliding_window for i in cfg.kv_layers))


def hydrate(
    engine: Engine,
    store: KVStore,
    prompt_ids: list[int],
    conv_id: str = "",
    slot: int = 0,
    policy: ReusePolicy | None = None,
) -> int:
    """Loads the longest saved prefix of the prompt into `slot` when it beats what the slot already holds
    and recomputing it (`policy`); returns the tokens loaded (0: nothing better on disk)."""
    policy = policy or ReusePolicy()
    held = engine.kv.prefix_len(slot, prompt_ids)
    if not policy.worth_looking_up(len(prompt_ids), held, conv_id or None):
        return 0
    snapshot = store.hydrate(prompt_ids, conv_id, longer_than=max(held, policy.shortest(conv_id or None) - 1))
    if snapshot is None:
        return 0
    engine.import_kv(snapshot, slot)
    return snapshot.n_tokens


def save(
    engine: Engine, store: KVStore, conv_id: str = "", slot: int = 0, policy: ReusePolicy | None = None
) -> Saved | NotSaved | None:
    """Saves what `slot` holds (prompt + generated tokens), when hydrating it would beat recomputing it (None:
    not worth it; NotSaved: the store could not, and logged why)."""
    if not (policy or ReusePolicy()).worth_saving(engine.kv.n_held(slot), conv_id or None):
        return None
    return store.save(engine.export_kv(slot), conv_id)
