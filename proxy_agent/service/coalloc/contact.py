"""Where the runtime can be reached: the host name and addresses jobs are given, found
without asking the network anything it does not answer at once."""

from __future__ import annotations

import logging
import socket
import struct
from typing import List, Optional

import trio


# the server's own log: where contact problems were always told
log = logging.getLogger("proxy_agent.service.coalloc.server")


def _loopback_only(name: str) -> bool:
    """Whether ``name`` resolves to loopback addresses only (or not at all)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return True
    return all(info[4][0].startswith("127.") or info[4][0] == "::1" for info in infos)


def _routed_address() -> Optional[str]:
    """The IPv4 address of the interface the default route leaves by.  Connecting a UDP
    socket only chooses the route: nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # a documentation address
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith(("127.", "0.")) else address


def _interface_addresses() -> List[str]:
    """This host's IPv4 interface addresses other than loopback (Linux), in interface order."""
    try:
        import fcntl
        interfaces = socket.if_nameindex()
    except (ImportError, OSError, AttributeError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in interfaces:
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def reachable_host() -> str:
    """The name or address other hosts reach this one by: the first of this host's names
    that resolves to something other than loopback, else the address of the interface the
    default route leaves by, else the first interface address other than loopback.  (A host
    whose own name resolves to 127.0.0.1, as many do, would otherwise send its compute
    nodes to themselves.)  Only a host with no other address at all gets its plain name."""
    names = [socket.getfqdn(), socket.gethostname()]
    for name in dict.fromkeys(n for n in names if n and n != "localhost"):
        if not _loopback_only(name):
            return name
    routed = _routed_address()
    if routed is not None:
        return routed
    addresses = _interface_addresses()
    if addresses:
        return addresses[0]
    log.warning("this host has no address other than loopback: other hosts cannot reach the runtime")
    return socket.gethostname() or "localhost"


async def auto_addresses(name: str) -> List[str]:
    """The addresses of this host that ``name`` resolves to: where compute nodes told to
    connect to ``name`` arrive (those this host can listen on)."""
    try:
        found = await trio.socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses: List[str] = []
    for family, _type, _proto, _name, address in found:
        host = address[0]
        if host in addresses:
            continue
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.bind((host, 0))
        except OSError:
            continue  # not an address of this host
        finally:
            probe.close()
        addresses.append(host)
    return addresses

