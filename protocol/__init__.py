"""genie's wire protocol: typed messages and their msgpack framing. Depends on nothing else in genie."""

PROTOCOL_VERSION = 2
