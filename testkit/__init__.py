"""What tests, benchmarks and the fixture scripts share, importable as a package of its own (never shipped
with genie): tiny GGUF models of every architecture written with gguf.GGUFWriter (tiny_models.py), random
valid quantized blocks (quant_blocks.py), llama.cpp's vocab-only GGUFs (vocab_files.py), and the reference
data of fixtures/ (llama.cpp's and transformers' outputs, made by scripts/make_fixtures/)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
