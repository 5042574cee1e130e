"""Where a gateway that serves pods listens: the pod's own addresses and loopback, IPv6 included where the pod has
it; never the wildcard, which would also answer on every other interface the node gives the pod.

The pod's addresses come from $POD_IPS or $POD_IP (the downward API's `status.podIPs` / `status.podIP`), else from
what the pod's host name resolves to (Kubernetes writes the pod's IPs for it into /etc/hosts). Loopback serves
probes and `kubectl port-forward`, which connect inside the pod.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping

POD_IP_ENVS = ("POD_IPS", "POD_IP")


class NoPodAddress(ValueError):
    """Nothing says which addresses this pod has."""


def _usable(text: str) -> str | None:
    try:
        address = ipaddress.ip_address(text.strip().split("%", 1)[0])
    except ValueError:
        return None
    if address.is_unspecified or address.is_link_local or address.is_multicast:
        return None
    return str(address)


def _resolved(hostname: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


def has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def pod_hosts(environ: Mapping[str, str], *, hostname: str | None = None,
              resolve: Callable[[str], list[str]] = _resolved) -> list[str]:
    """The addresses to listen on in a pod: its own, then 127.0.0.1 and ::1 (where there is IPv6). What $POD_IPS or
    $POD_IP say is taken as said; of what the host name resolves to, loopback is left out (a machine that maps its
    name to 127.0.1.1 is no pod). Raises NoPodAddress when nothing names an address of the pod's own."""
    own: list[str] = []
    for name in POD_IP_ENVS:
        if environ.get(name, "").strip():
            own = [a for a in (_usable(part) for part in environ[name].split(",")) if a]
            break
    else:
        resolved = (_usable(r) for r in resolve(hostname or socket.gethostname()))
        own = [a for a in resolved if a and not ipaddress.ip_address(a).is_loopback]
    if not own:
        raise NoPodAddress(
            "cannot tell this pod's address: $POD_IPS and $POD_IP are unset (or hold no IP address) and the host name "
            "resolves to loopback only"
        )
    loopback = ["127.0.0.1", *(["::1"] if has_ipv6_loopback() else [])]
    return list(dict.fromkeys([*own, *loopback]))


def bind_sockets(hosts: list[str], port: int) -> list[socket.socket]:
    """One listening-ready socket per address, all on one port (the first one picks it when `port` is 0)."""
    sockets: list[socket.socket] = []
    try:
        for host in hosts:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
