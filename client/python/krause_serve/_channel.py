"""The channel to one server or to several replicas, and the call options every client shares."""
from __future__ import annotations

import socket
from typing import List, Optional, Sequence, Tuple, Union

import grpc

Address = Union[str, Sequence[str]]


def target(address: Address) -> str:
    """gRPC's target: one "host:port" as given; several (replicas) as one ipv4:/ipv6: list of
    their resolved addresses, which round robin spreads calls over and which skips a replica
    whose connection is down; a target with a scheme ("dns:///svc:50051") as given."""
    if isinstance(address, str):
        return address
    addresses = list(address)
    if len(addresses) == 1:
        return addresses[0]
    v4, v6 = [], []
    for a in addresses:
        host, _, port = a.rpartition(":")
        host = host.strip("[]")
        for family, *_, sockaddr in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM):
            ip = sockaddr[0]
            if family == socket.AF_INET6:
                v6.append(f"[{ip}]:{port}")
            else:
                v4.append(f"{ip}:{port}")
            break
    if v4 and v6:
        raise ValueError("replicas must all be IPv4 or all IPv6 addresses")
    return ("ipv4:" + ",".join(v4)) if v4 else ("ipv6:" + ",".join(v6))


def channel_options(address: Address, max_message_bytes: int) -> List[Tuple[str, object]]:
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.keepalive_time_ms", 60000),
               ("grpc.keepalive_permit_without_calls", 1)]
    if not isinstance(address, str) or "," in target(address):
        options.append(("grpc.lb_policy_name", "round_robin"))
    return options


def credentials(tls: bool, root_certificates: Optional[bytes],
                certificate_chain: Optional[bytes], private_key: Optional[bytes]):
    """None for plaintext, else TLS credentials (the system's roots unless given)."""
    if not (tls or root_certificates or certificate_chain):
        return None
    return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)


def metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
