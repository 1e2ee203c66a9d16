"""`genie pull`, `genie list` and `genie rm`: the models directory from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .errors import GenieError
from .gguf_file import GGUFFile
from .models.catalogue import CATALOGUE
from .models.local import ModelsDir, default_models_dir, gguf_summary
from .models.progress_bar import ProgressBar
from .models.pull import pull, remove_partial
from .models.sources import parse_source
from .registry import MODELS, is_packaged_installed, packaged_file


def add_parsers(sub: Any) -> None:
    """Adds pull, list and rm to the `genie` subcommands."""
    p = sub.add_parser(
        "pull",
        help="fetch a model into the models directory",
        description=f"Fetch a GGUF model into the models directory ({default_models_dir()}; GENIE_MODELS_DIR "
        "overrides). An interrupted pull resumes where it stopped.",
    )
    p.add_argument(
        "source",
        help=f"a catalogue name ({', '.join(CATALOGUE)}), hf://OWNER/REPO/FILE.gguf (HF_ENDPOINT is honoured) "
        "or an http(s):// URL of a .gguf",
    )
    p.add_argument(
        "--name", default=None, help="the name to use with -m (default: the catalogue name, else the file's stem)"
    )
    ls = sub.add_parser("list", help="list pulled models and the installed PyPI ones")
    ls.add_argument("--json", action="store_true", help='print {"models": [...]} (default: a table)')
    ls.add_argument(
        "--available", action="store_true", help="list the catalogue: what `genie pull NAME` fetches, from where"
    )
    rm = sub.add_parser("rm", help="remove a pulled model")
    rm.add_argument("name", help="the model's name, as genie list shows it")


def cmd_pull(args: argparse.Namespace) -> int:
    src = parse_source(args.source)
    name = args.name or src.name
    what = f": {src.description}," if src.description else ""
    size = f" ({src.size_bytes / 1e9:.2f} GB)" if src.size_bytes else ""
    print(f"pulling {name}{what} from {src.url}{size}", file=sys.stderr, flush=True)
    model = pull(args.source, progress=ProgressBar(sys.stderr, sys.stderr.isatty()), name=args.name)
    size_mb = model.size_bytes / 1e6
    print(f"{model.name}: {size_mb:,.1f} MB, {model.architecture} {model.quant} (genie run -m {model.name})")
    return 0


def _packaged_rows() -> list[dict[str, Any]]:
    """The PyPI models that are installed, in the shape of a pulled model's entry."""
    rows = []
    for name, m in MODELS.items():
        if not is_packaged_installed(name):
            continue
        row: dict[str, Any] = {
            "name": name,
            "path": None,
            "size_bytes": m.size_bytes,
            "sha256": None,
            "source": f"pypi:{m.pip_name.split()[0]}",
            "architecture": "",
            "quant": "",
            "context": 0,
            "has_chat_template": False,
            "added_at": None,
        }
        path = packaged_file(name)
        if path is None:
            row["source"] += " (assembled on first use)"
        else:
            try:
                with GGUFFile(path) as gf:
                    row.update(path=str(path), **gguf_summary(gf))
            except GenieError:
                row["source"] += " (its file is unreadable)"
        rows.append(row)
    return rows


def _catalogue_rows() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": e.description,
            "source": e.hf_source,
            "size_bytes": e.size_bytes,
            "sha256": e.sha256,  # None: Hugging Face's own, checked at pull time
        }
        for name, e in CATALOGUE.items()
    ]


def cmd_list(args: argparse.Namespace) -> int:
    if args.available:
        rows = _catalogue_rows()
        if args.json:
            print(json.dumps({"catalogue": rows}))
            return 0
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            sha = r["sha256"] or "sha256 from Hugging Face at pull time"
            print(f"{r['name'].ljust(width)}  {r['description']}  {r['source']}  {sha}")
        return 0
    pulled = [m.as_dict() for m in ModelsDir().list()]
    names = {m["name"] for m in pulled}
    rows = pulled + [r for r in _packaged_rows() if r["name"] not in names]  # a pulled name shadows -m's PyPI one
    if args.json:
        print(json.dumps({"models": rows}))
        return 0
    header = ("NAME", "SIZE", "QUANT", "ARCH", "CONTEXT", "SOURCE")
    table = [header] + [
        (
            r["name"],
            f"{r['size_bytes'] / 1e6:,.0f} MB",
            r["quant"] or "-",
            r["architecture"] or "-",
            str(r["context"] or "-"),
            r["source"],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    models = ModelsDir()
    removed = models.remove(args.name)
    partial = remove_partial(models, args.name)
    if removed:
        print(f"removed {args.name}")
        return 0
    if partial:
        print(f"removed the unfinished download of {args.name}")
        return 0
    if args.name in MODELS:
        print(f"genie: {args.name} is installed from PyPI, not pulled: pip uninstall it", file=sys.stderr)
    else:
        print(f"genie: no pulled model {args.name!r} in {models.root} (genie list shows them)", file=sys.stderr)
    return 1


COMMANDS = {"pull": cmd_pull, "list": cmd_list, "rm": cmd_rm}
