"""Which IP addresses a media fetch may connect to.

Fetching a client-supplied URL from inside the server is a server-side request forgery risk: the
URL could name the server's own loopback services, the private network behind it, or a cloud
metadata endpoint. `refusal(ip, policy)` is the one decision: it returns None for an address the
fetcher may connect to, or a short reason ("loopback", "private", ...) for one it must not.

Addresses that embed an IPv4 address are judged by the embedded address as well: IPv4-mapped
(``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), 6to4 (``2002:aabb:ccdd::/48``) and NAT64
(``64:ff9b::a.b.c.d``); Teredo and the local-use NAT64 prefix are refused outright, because the
IPv4 address behind them cannot be judged.

`FetchPolicy.allow_private` opens the categories a local deployment needs (loopback, private,
unique-local, link-local, shared/CGNAT); `allow_networks` opens exactly the listed networks.
Cloud metadata addresses, multicast, unspecified, broadcast and reserved addresses are never
opened by `allow_private`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

# Categories that FetchPolicy.allow_private opens.
PRIVATE_CATEGORIES = frozenset({"loopback", "private", "unique-local", "link-local", "shared"})

# Well-known instance metadata endpoints (AWS/GCP/Azure 169.254.169.254, AWS IPv6, Alibaba,
# Oracle): refused even when private addresses are allowed.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)


def _nets(*specs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), why) for net, why in specs)


# Order matters only for the reason reported; every listed network is refused.
_V4 = _nets(
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared"),  # carrier-grade NAT
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved"),  # IETF protocol assignments
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "reserved"),  # 6to4 relay anycast
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),  # includes 255.255.255.255 broadcast
)

_V6 = _nets(
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "nat64-local"),
    ("100::/64", "reserved"),  # discard-only
    ("2001::/32", "teredo"),
    ("2001::/23", "reserved"),  # IETF protocol assignments
    ("2001:db8::/32", "documentation"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "link-local"),  # deprecated site-local
    ("ff00::/8", "multicast"),
)

_V4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_V4_COMPAT = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


@dataclass(frozen=True)
class FetchPolicy:
    """Which otherwise-refused addresses a fetcher may reach.

    allow_private: open loopback, private (RFC 1918), unique-local, link-local and shared (CGNAT)
    addresses, for a server that fetches from its own network. Off by default.
    allow_networks: networks opened exactly, whatever their category (for example one loopback
    address in a test, or one internal image host).
    """

    allow_private: bool = False
    allow_networks: tuple[IPNetwork, ...] = ()


def embedded_v4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 transition address carries, or None."""
    if ip in _V4_MAPPED:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIXTOFOUR:
        return ip.sixtofour
    if ip in _V4_COMPAT and int(ip) > 1:  # :: and ::1 are themselves, not embeddings
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def category(ip: IPAddress) -> str | None:
    """The special-purpose category of `ip` ("loopback", "private", ...), None for public."""
    if ip in _METADATA:
        return "metadata"
    if isinstance(ip, IPv6Address):
        if ip.scope_id:
            return "link-local"
        inner = embedded_v4(ip)
        if inner is not None:
            return category(inner)
        for net, why in _V6:
            if ip in net:
                return why
        if ip not in _GLOBAL_UNICAST_V6:
            return "reserved"
        return None
    for net, why in _V4:
        if ip in net:
            return why
    return None


def refusal(ip: IPAddress, policy: FetchPolicy) -> str | None:
    """None when a fetch may connect to `ip` under `policy`, else the reason it may not."""
    why = category(ip)
    if why is None:
        return None
    # An IPv4 address embedded in IPv6 is matched by both spellings in allow_networks.
    inner = embedded_v4(ip) if isinstance(ip, IPv6Address) else None
    for net in policy.allow_networks:
        if ip in net or (inner is not None and inner in net):
            return None
    if policy.allow_private and why in PRIVATE_CATEGORIES:
        return None
    return why


def describe(ip: IPAddress) -> str:
    """`ip` as text, with the IPv4 address it embeds when it is a transition address."""
    inner = embedded_v4(ip) if isinstance(ip, IPv6Address) else None
    return str(ip) if inner is None else f"{ip} (IPv4 {inner})"


def parse_ip(text: str) -> IPAddress | None:
    """`text` as an IP address literal (brackets and an IPv6 zone allowed), else None."""
    text = text.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
