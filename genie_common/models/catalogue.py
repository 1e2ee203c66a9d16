"""Models `genie pull NAME` knows by name: each pinned to one file of a public Hugging Face repository.

Repository and file names are ones published by their uploaders (unsloth's GGUF conversions, llama.cpp's
naming: `<Model>-Q4_K_M.gguf`). Sizes and sha256 digests are None where they were not measured here: no
number in this table is a guess. A pull still checks what it gets: Hugging Face's resolve answer carries
the file's sha256 (`X-Linked-Etag`) and size, and every file must be a GGUF genie reads whole.
The gemma4-e2b entry's repository was not confirmed by a download from this machine (no network).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogueEntry:
    repo: str  # Hugging Face repository, OWNER/NAME
    filename: str  # the GGUF file inside it
    description: str
    size_bytes: int | None = None  # None: not measured here
    sha256: str | None = None  # None: taken from Hugging Face's answer at pull time

    @property
    def hf_source(self) -> str:
        return f"hf://{self.repo}/{self.filename}"


CATALOGUE: dict[str, CatalogueEntry] = {
    "qwen3-4b": CatalogueEntry("unsloth/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf", "Qwen3 4B instruct, Q4_K_M (~2.5 GB)"),
    "qwen3-0.6b": CatalogueEntry(
        "unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q4_K_M.gguf", "Qwen3 0.6B instruct, Q4_K_M (~0.4 GB)"
    ),
    "gemma4-e2b": CatalogueEntry(
        "unsloth/gemma-4-E2B-it-GGUF", "gemma-4-E2B-it-Q4_K_M.gguf", "Gemma 4 E2B instruct, Q4_K_M (~3 GB)"
    ),
    # the base gemma3-270m is genie's default model, installed from PyPI; this is its instruction-tuned sibling
    "gemma3-270m-it": CatalogueEntry(
        "unsloth/gemma-3-270m-it-GGUF", "gemma-3-270m-it-Q4_K_M.gguf", "Gemma 3 270M instruct, Q4_K_M (~0.25 GB)"
    ),
}
