"""What every genie process may import without importing another process: the GGUF header reader, the model
registry and the models directory (pull, catalogue), the durable-write helper, error types, the KV snapshot
and layout types, the typed configuration and child-process lifetime. It imports no process package
(genie_daemon, workers, kvstore); pyproject.toml's import contracts hold that."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("genie")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"
