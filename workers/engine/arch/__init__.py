"""The architecture table: `general.architecture` -> ArchSpec. Adding one = one file + one entry."""

from . import gemma3, gemma4, llama, qwen2, qwen3
from .spec import ArchSpec

ARCHITECTURES: dict[str, ArchSpec] = {
    spec.name: spec for spec in (llama.SPEC, qwen2.SPEC, qwen3.SPEC, gemma3.SPEC, gemma4.SPEC)
}

__all__ = ["ARCHITECTURES", "ArchSpec"]
