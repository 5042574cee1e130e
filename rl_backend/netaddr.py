"""Whether an address is this machine's own loopback: where the gateway may listen without an admin token, what
counts as a free local upstream, and which gateway URL a cluster's pods could never reach."""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=256)
def is_loopback_url(url: str) -> bool:
    return is_loopback_host(urlsplit(url).hostname or "")


def is_own_address(host: str) -> bool:
    """Whether `host` (an IP literal) is an address of this machine: one a socket can bind. A NATed or forwarded
    address (a VM's public IP) is not."""
    import socket

    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
        return True
    except OSError:
        return False
