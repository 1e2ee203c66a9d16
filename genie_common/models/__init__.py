"""Models like Ollama's: a directory of pulled GGUF files (`local.py`), where they come from
(`catalogue.py`, `sources.py`), and fetching them (`pull.py`)."""
