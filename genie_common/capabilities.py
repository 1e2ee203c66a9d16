"""What a model can do besides completing text, as Ollama's /api/show lists it: "tools" when its chat
template renders tool definitions, "thinking" when it writes a reasoning block genie reads apart.

Read from the template alone (with the families' markup, families.py), so the daemon says it of any model
from its GGUF header, loaded or not. Tools: the template reads the `tools` variable, as Hugging Face's
templates take the definitions (Jinja's own analysis, so a template that merely mentions the word has
none); a template that cannot render tools has the model answer without seeing them. Thinking: the
template writes a reasoning opener of one of the families (Qwen's `<think>`, Gemma 4's
`<|channel>thought`), which is where the output parser, reading every family's markup in any reply,
finds the reasoning; a template that writes none gives the parser nothing to take apart. A file without a
template gets the worker's built-in turn format, which renders neither.
"""

from __future__ import annotations

from functools import lru_cache

from jinja2 import Environment, TemplateSyntaxError, meta

from .families import markups

COMPLETION, TOOLS, THINKING = "completion", "tools", "thinking"

# parses as the worker's sandbox does (workers/engine/chat_template.py), without rendering anything
_ENV = Environment(extensions=["jinja2.ext.loopcontrols"])


def capabilities_of(chat_template: str) -> tuple[str, ...]:
    """("completion", ["tools",] ["thinking"]) for a model whose GGUF carries `chat_template` ("" for none)."""
    caps = [COMPLETION]
    if TOOLS in _variables(chat_template):
        caps.append(TOOLS)
    if any(m.think_open in chat_template for m in markups()):
        caps.append(THINKING)
    return tuple(caps)


@lru_cache(maxsize=16)
def _variables(template: str) -> frozenset[str]:
    """The variables a template reads from its caller; none for one that does not parse (the worker
    refuses to render it)."""
    try:
        return frozenset(meta.find_undeclared_variables(_ENV.parse(template)))
    except TemplateSyntaxError:
        return frozenset()
