"""Wire protocol v1: the contract between agents, relays and viewers (docs/protocol.md)."""

from tuimon_core.protocol.codec import (
    MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
    decode,
    decode_map,
    encode,
    encode_map,
    unpack,
)
from tuimon_core.protocol.errors import ProtocolError
from tuimon_core.protocol.messages import (
    PROTOCOL_VERSION,
    Batch,
    Event,
    GpuInfo,
    Hello,
    Message,
    Sample,
    Subscribe,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "Batch",
    "Event",
    "GpuInfo",
    "Hello",
    "Message",
    "ProtocolError",
    "Sample",
    "Subscribe",
    "decode",
    "decode_map",
    "encode",
    "encode_map",
    "unpack",
]
