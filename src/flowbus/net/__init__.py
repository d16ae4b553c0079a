"""Networking for brokers: the wire codec (msgpack bodies in length-prefixed frames) that
carries the protocol cores' messages between processes, and the asyncio runtime that
drives a core over TCP (:mod:`flowbus.net.runtime`)."""

from flowbus.net.codec import (
    MAX_DEPTH,
    MAX_FRAME,
    FrameDecoder,
    FrameError,
    decode,
    encode,
    frame,
    registered,
)
from flowbus.net.runtime import Directory, Runtime

__all__ = [
    "MAX_DEPTH",
    "MAX_FRAME",
    "Directory",
    "FrameDecoder",
    "FrameError",
    "Runtime",
    "decode",
    "encode",
    "frame",
    "registered",
]
