"""A message's fields are declared once, as attributes with wire(): the wire rules are derived from them
(required = no default), and an attribute declared without wire() is refused when the rules are built."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from genie_protocol.codec import MESSAGE_TYPES
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import Error, Generate, Load, Message
from genie_protocol.schema import Field, wire


def test_rules_follow_the_declarations():
    assert Generate.rules()["request_id"] == Field("id", True)
    assert Generate.rules()["params"] == Field("dict", False)
    assert Error.rules()["code"] == Field("str", True, 64) and not Error.rules()["request_id"].required
    assert Load.rules()["model"] == Field("str", True, 4096)  # the admin call's argument: required on the wire
    with pytest.raises(ProtocolError, match="model"):
        Load.from_body({"request_id": "a"})


def test_every_message_type_has_its_rules():
    for cls in MESSAGE_TYPES.values():
        assert set(cls.rules()) == {f.name for f in fields(cls)}, cls.__name__


def test_an_attribute_without_wire_is_refused():
    @dataclass
    class Odd(Message):
        TYPE = 0xEE
        request_id: str = wire("id")
        extra: int = 0

    with pytest.raises(TypeError, match=r"Odd\.extra is not declared with wire\(\)"):
        Odd.rules()
