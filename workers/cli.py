"""`genie`: run the engine in this process — generate, chat, tokenize, perplexity — and manage the models
directory (pull, list, rm: `genie_common/model_commands.py`)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from genie_common import model_commands
from genie_common.engine_options import EngineOptions
from genie_common.errors import GenieError, RequestError
from genie_common.registry import DEFAULT_MODEL, MODELS

from . import __version__
from .engine.backends import BACKEND_CHOICES
from .engine.engine import Completion, Delta, Engine
from .engine.memory_plan import parse_ctx
from .engine.perplexity import perplexity
from .engine.sampling import SamplingParams
from .engine.text_filters import ThinkFilter

D = SamplingParams()


def _add_engine_options(p: argparse.ArgumentParser, ctx_default: int = EngineOptions.ctx) -> None:
    p.add_argument(
        "-m",
        "--model",
        default=DEFAULT_MODEL,
        help=f"a pulled model (genie list), an installed one ({', '.join(MODELS)}) or a GGUF path "
        "(default: %(default)s)",
    )
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="compute backend (default: %(default)s)")
    p.add_argument(
        "--ctx",
        type=parse_ctx,
        default=ctx_default,
        help="context length in tokens, or auto: the model's training context if the memory budget holds it, "
        f"else the largest that fits (default: {ctx_default or 'auto'})",
    )
    p.add_argument("--fp16-kv", action="store_true", help="FP16 KV cache instead of INT8 (default: INT8)")
    p.add_argument(
        "--mem-budget-mb",
        type=int,
        default=0,
        help="memory the model, its KV cache and a step may take; the plan is printed at load "
        "(default: what is free now, less a tenth)",
    )


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n", "--max-tokens", type=int, default=D.max_tokens, help="tokens to generate at most (default: %(default)s)"
    )
    p.add_argument("--temperature", type=float, default=D.temperature, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=D.top_k, help="0 = off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=D.top_p, help="1 = off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=D.min_p, help="0 = off (default: %(default)s)")
    p.add_argument("--repeat-penalty", type=float, default=D.repeat_penalty, help="1 = off (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="same seed, same tokens (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string; repeatable (default: none)")
    p.add_argument("--think", action="store_true", help="keep the model's reasoning block (default: off)")


def _add_conv_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--conv-id",
        default=None,
        help="persist this conversation's KV in the KV cache directory (the daemon's, see genie-daemon): a prompt "
        "that begins like a saved one prefills only the rest (default: no persistence)",
    )


class _ConvCache:
    """`--conv-id`: the daemon's KV cache directory used in this process, beside a running daemon or not."""

    def __init__(self, engine: Engine, conv_id: str) -> None:
        from genie_common.config import load_config
        from genie_kvstore.policy import ReusePolicy
        from genie_kvstore.store import KVStore, StoreConfig, check_conv_id
        from genie_workers.kv_engine import engine_layout

        try:
            self.conv_id = check_conv_id(conv_id)
            c = load_config()
        except ValueError as e:
            raise RequestError(str(e)) from None
        config = StoreConfig(Path(c.kv_cache_dir), c.kv_cache_max_mb << 20, c.kv_cache_stale_tmp_s)
        self.engine = engine
        self.store = KVStore(config, engine.model.fingerprint, engine_layout(engine))
        self.policy = ReusePolicy()

    def before(self, ids: list[int]) -> None:
        from genie_workers.kv_engine import hydrate

        hydrate(self.engine, self.store, ids, self.conv_id, policy=self.policy)

    def after(self, completion: Completion) -> None:
        from genie_workers.kv_engine import save

        n_prefilled = completion.prompt_tokens - completion.cached_tokens
        self.policy.observe_prefill(n_prefilled, completion.timings["prefill_ms"] / 1000)
        save(self.engine, self.store, self.conv_id, policy=self.policy)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genie",
        description="genie: on-device LLM inference.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"genie {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate from a prompt and print timings")
    _add_engine_options(run)
    run.add_argument("-p", "--prompt", required=True, help="the prompt text")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument(
        "--raw",
        dest="chat",
        action="store_false",
        default=None,
        help="prompt is plain text (default when the model has no chat template)",
    )
    mode.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        help="prompt is a user message in the model's chat format (default with a chat template)",
    )
    _add_sampling_options(run)
    _add_conv_option(run)
    run.add_argument(
        "--json", action="store_true", help="print one JSON object instead of streaming (default: stream text)"
    )

    chat = sub.add_parser("chat", help="interactive multi-turn chat; Ctrl-C stops the current answer")
    _add_engine_options(chat)
    chat.add_argument("-s", "--system", default=None, help="system prompt (default: none)")
    _add_sampling_options(chat)
    _add_conv_option(chat)

    tok = sub.add_parser("tokenize", help="print token ids (no BOS)")
    tok.add_argument(
        "-m", "--model", default=DEFAULT_MODEL, help="pulled or installed model, or GGUF path (default: %(default)s)"
    )
    tok.add_argument("--special", action="store_true", help="parse special tokens written in the text (default: off)")
    tok.add_argument("--json", action="store_true", help='print {"ids": [...]} (default: ids separated by spaces)')
    tok.add_argument("text", help="text to tokenize")

    ppl = sub.add_parser("perplexity", help="perplexity of a text file")
    _add_engine_options(ppl, ctx_default=512)
    ppl.add_argument("--text-file", required=True, help="UTF-8 text file")
    ppl.add_argument("--json", action="store_true", help='print {"ppl", "n_scored", "nll": [...]} (default: one line)')
    model_commands.add_parsers(sub)
    return parser


def _engine(args: argparse.Namespace) -> Engine:
    try:  # one prompt at a time: one KV slot (the daemon's default is the backend's)
        options = EngineOptions(
            model=args.model,
            backend=args.backend,
            ctx=args.ctx,
            mem_budget_mb=args.mem_budget_mb,
            fp16_kv=args.fp16_kv,
            parallel=1,
        )
    except ValueError as e:
        raise RequestError(str(e)) from None
    engine = Engine(options)
    print(f"genie: {engine.plan.line()}", file=sys.stderr)
    return engine


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
    )


class _CancelOnSigint:
    """While active, Ctrl-C only sets a flag that the generation loop reads as cancel."""

    def __init__(self) -> None:
        self.cancelled = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.cancelled = True

    def __enter__(self) -> Callable[[], bool]:
        self._old = signal.signal(signal.SIGINT, self._handler)
        return lambda: self.cancelled

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._old)


def _stream(engine: Engine, ids: list[int], params: SamplingParams, think: bool, echo: bool) -> Completion:
    hide = None if think else ThinkFilter()
    with _CancelOnSigint() as cancel:
        for ev in engine.generate(ids, params, cancel=cancel):
            if isinstance(ev, Delta):
                if echo:
                    sys.stdout.write(hide.feed(ev.text) if hide else ev.text)
                    sys.stdout.flush()
            else:
                if echo and hide:
                    sys.stdout.write(hide.flush())
                if not think:
                    f = ThinkFilter()
                    ev.text = f.feed(ev.text) + f.flush()
                return ev
    raise AssertionError("generate ended without a Completion")


def _timings_line(engine: Engine, c: Completion) -> str:
    t = c.timings
    return (
        f"load {engine.model.load_ms:.0f} ms | prompt {c.prompt_tokens} tok, cached {c.cached_tokens} | "
        f"prefill {t['prefill_tok_s']:.1f} tok/s | TTFT {t['ttft_ms']:.0f} ms | "
        f"decode {t['decode_tok_s']:.1f} tok/s ({c.completion_tokens} tok) | finish {c.finish_reason}"
    )


def cmd_run(args: argparse.Namespace) -> int:
    params = _sampling(args)  # a bad option is refused before the model loads
    engine = _engine(args)
    use_chat = args.chat if args.chat is not None else engine.model.chat_template is not None
    if use_chat:
        ids = engine.chat_prompt([{"role": "user", "content": args.prompt}], think=args.think)
    else:
        ids = engine.text_prompt(args.prompt)
    conv = _ConvCache(engine, args.conv_id) if args.conv_id else None
    if conv:
        conv.before(ids)
    c = _stream(engine, ids, params, args.think, echo=not args.json)
    if conv:
        conv.after(c)
    if args.json:
        out: dict[str, Any] = {
            "text": c.text,
            "tokens": c.token_ids,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "finish_reason": c.finish_reason,
            "timings": {
                "load_ms": round(engine.model.load_ms, 1),
                "ttft_ms": round(c.timings["ttft_ms"], 1),
                "prefill_tok_s": round(c.timings["prefill_tok_s"], 1),
                "decode_tok_s": round(c.timings["decode_tok_s"], 1),
            },
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(_timings_line(engine, c), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling(args)  # a bad option is refused before the model loads
    engine = _engine(args)
    conv = _ConvCache(engine, args.conv_id) if args.conv_id else None
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    print(
        f"genie chat — {engine.model.name}. Ctrl-C stops an answer; Ctrl-D or Ctrl-C at the prompt quits.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            fitted = engine.fit_chat(messages, params.max_tokens, think=args.think)
            if fitted.dropped:
                print(f"genie: the {fitted.dropped} oldest messages no longer fit the context", file=sys.stderr)
            ids = fitted.ids
            if conv:
                conv.before(ids)
            c = _stream(engine, ids, params, args.think, echo=True)
            if conv:
                conv.after(c)
        except GenieError as e:
            messages.pop()
            print(f"\ngenie: error: {e}", file=sys.stderr)
            continue
        print()
        print(_timings_line(engine, c), file=sys.stderr)
        messages.append({"role": "assistant", "content": c.text})


def cmd_tokenize(args: argparse.Namespace) -> int:
    from genie_common.gguf_file import GGUFFile
    from genie_common.registry import resolve_model

    from .engine.tokenizer import Tokenizer

    path = resolve_model(args.model)
    with GGUFFile(path) as gf:
        tokenizer = Tokenizer.from_metadata(gf.metadata, str(path))
    ids = tokenizer.encode(args.text, add_bos=False, parse_special=args.special)
    print(json.dumps({"ids": ids}) if args.json else " ".join(map(str, ids)))
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    try:
        with open(args.text_file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise GenieError(f"{args.text_file}: cannot read as UTF-8 text: {e}") from None
    if args.ctx == 1:  # refused before the model loads (perplexity.py checks the upper bound)
        raise RequestError("--ctx must be at least 2: a window scores each token given the ones before it")
    engine = _engine(args)

    def progress(done: int, total: int) -> None:
        if not args.json:
            print(f"\rwindow {done}/{total}", end="", file=sys.stderr, flush=True)

    r = perplexity(engine, text, engine.n_ctx, progress)
    if args.json:
        print(json.dumps({"ppl": r.ppl, "n_scored": r.n_scored, "nll": [round(float(x), 6) for x in r.nll]}))
    else:
        print(file=sys.stderr)
        print(f"perplexity {r.ppl:.4f} over {r.n_scored} tokens (ctx {engine.n_ctx}, {engine.kv_dtype} KV)")
    return 0


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "tokenize": cmd_tokenize,
    "perplexity": cmd_perplexity,
    **model_commands.COMMANDS,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except GenieError as e:
        print(f"genie: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
