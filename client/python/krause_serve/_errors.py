"""One exception for every failed call, with what the server's google.rpc details say."""
from __future__ import annotations

from typing import Dict, Optional

import grpc

from krause_serve._gen.google.rpc import error_details_pb2, status_pb2

# The codes a call is worth repeating on (another replica, or later): the replica went away or
# refused for now (a full queue, loading, draining).
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


class KrauseError(Exception):
    """A call that failed.

    Attributes:
        code: the gRPC status code.
        message: the server's message (it names the field and the limit).
        reason: google.rpc.ErrorInfo's reason ("QUEUE_FULL", "DRAINING", "LOADING", ...) or "".
        metadata: ErrorInfo's metadata (e.g. {"model": ...}).
        retry_delay: google.rpc.RetryInfo's delay in seconds, or None when the server gave none.
        field: google.rpc.BadRequest's first field ("images[3]", "guidance", ...) or "".
        peer: the replica that answered, when known.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, reason: str = "",
                 metadata: Optional[Dict[str, str]] = None, retry_delay: Optional[float] = None,
                 field: str = "", peer: str = ""):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.retry_delay = retry_delay
        self.field = field
        self.peer = peer

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed later or on another replica."""
        return self.code in RETRYABLE


def _string_map(field) -> Dict[str, str]:
    """ErrorInfo.metadata as a dict: a map<string, string>, or the repeated key-value entries the
    map is on the wire (proto/google/rpc/error_details.proto spells it so)."""
    out = {}
    for item in field:
        if hasattr(item, "key"):
            out[item.key] = item.value
        else:
            out[item] = field[item]
    return out


def from_rpc_error(error: grpc.RpcError) -> KrauseError:
    """The KrauseError of a failed gRPC call (sync or asyncio), its details decoded."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    message = error.details() if callable(getattr(error, "details", None)) else str(error)
    trailers = error.trailing_metadata() if callable(getattr(error, "trailing_metadata", None)) else None
    kwargs = {}
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # not a google.rpc.Status: no details
            break
        for any_ in status.details:
            info, retry, bad = (error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo(),
                                error_details_pb2.BadRequest())
            if any_.Unpack(info):
                kwargs["reason"] = info.reason
                kwargs["metadata"] = _string_map(info.metadata)
            elif any_.Unpack(retry):
                kwargs["retry_delay"] = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
            elif any_.Unpack(bad) and bad.field_violations:
                kwargs["field"] = bad.field_violations[0].field
    peer = ""
    return KrauseError(code or grpc.StatusCode.UNKNOWN, message or "", peer=peer, **kwargs)
