"""What a product or an attention hands the operation after it, as a value it returns in place of its output array.

A kernel that writes an output can also code it as the next product's input (int8 codes, scales and sums: the x8
layout q8_input writes), which saves that product's coding launch. The CuPy backend's methods then return Coded, and
the forward pass hands that value on as it hands any output on (layers.py: the operation NextInput named, or the o
product for attention); the consumer takes the codes where they are for its own input, and `plain` gives the array
anywhere else. A rows product whose one-row form would have coded its consumer's norm late returns CodeLate, so the
consumer codes the rows the same way (rows.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import NextInput


@dataclass(eq=False)
class Coded:
    """An output `out` and its consumer's input coded by the kernel that wrote it (x8): for attention's output the
    o product's input (then None); for a product, what `then` asked (NextInput: act(gate) * up, or the residual add
    and norm without the RMS factor, with x_new = residual + out and the group sums of squares ss the consumer
    applies it from). A one-token product's x8 is a row (x8_row_bytes), several rows' are in quads (x8_quads)."""

    out: Any
    x8: Any
    then: NextInput | None = None
    x_new: Any = None
    ss: Any = None


@dataclass(frozen=True, eq=False)
class CodeLate:
    """A rows product's output whose consumer's norm is coded without its RMS factor (q8_input's X_NORM_LATE, the
    factor applied by the consumer's gemvn), as the product's epilogue codes it for one row alone: a row's numbers
    in a step are its numbers alone (rows.py)."""

    out: Any


def plain(value: Any) -> Any:
    """The output array of what an operation returned (Coded, CodeLate or the array itself)."""
    return value.out if isinstance(value, (Coded, CodeLate)) else value
