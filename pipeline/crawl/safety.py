"""Which addresses the crawler may connect to: public ones, plus what the config allow-lists.

The rule is applied to the address a host name resolves to, not to the name, so ``localhost``, a DNS
name pointing at 10.0.0.5, or a redirect to ``169.254.169.254`` (cloud metadata) are refused alike.
The Scrapy side (pipeline.crawl.middlewares) checks every request before it is sent, redirects
included, and again inside the DNS resolver at connection time.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
REFUSED_REASON = "refused_private_address"


def parse_allow_list(
    entries: list[str], allow_wide: bool = False
) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """Split allow-list entries into host names and networks (a bare IP is a /32 or /128 network).

    A network wider than WIDEST_ALLOWED_PREFIX is refused unless ``allow_wide``.
    """
    names, networks = set(), []
    for entry in entries:
        text = entry.strip().lower().strip("[]")
        if not text:
            raise ValueError("empty entry in crawl.allowed_private_hosts")
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            network = None
        if network is not None:
            widest = WIDEST_ALLOWED_PREFIX[network.version]
            if network.prefixlen < widest and not allow_wide:
                raise ValueError(
                    f"{entry!r} allows {network.num_addresses} addresses; name hosts or networks of at most "
                    f"/{widest}, or set crawl.allow_wide_private_networks=true to allow it on purpose"
                )
            networks.append(network)
            continue
        if "/" in text or " " in text:
            raise ValueError(f"{entry!r} is neither a host name, an IP address nor a CIDR network")
        names.add(text.rstrip("."))
    return frozenset(names), tuple(networks)


NAT64_PREFIXES = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# An allow-list entry may name a host or a small network; anything wider needs
# crawl.allow_wide_private_networks, since 0.0.0.0/0 would also allow 169.254.169.254 (cloud metadata).
WIDEST_ALLOWED_PREFIX = {4: 24, 6: 64}


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and routes to: IPv4-mapped, 6to4, Teredo (client) or NAT64."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip.sixtofour is not None:
        return ip.sixtofour  # 2002:7f00:1::1 reaches 127.0.0.1
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in prefix for prefix in NAT64_PREFIXES):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_category(ip: IPAddress) -> str | None:
    """None for a public unicast address, else why it is not one (loopback, private, ...)."""
    ip = embedded_ipv4(ip) or ip
    for category in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(ip, f"is_{category}"):
            return category
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:  # deprecated fec0::/10, still not public
        return "site_local"
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return "non_global"
    return None


@dataclass
class AddressPolicy:
    allowed: list[str] = field(default_factory=list)
    allow_wide: bool = False

    def __post_init__(self) -> None:
        self.allowed_names, self.allowed_networks = parse_allow_list(self.allowed, self.allow_wide)

    def refusal(self, host: str, address: str) -> str | None:
        """Why connecting to ``address`` (resolved from ``host``) is refused, or None when it is allowed."""
        host = host.lower().strip("[]").rstrip(".")
        if host in self.allowed_names:
            return None
        ip = ipaddress.ip_address(address.strip("[]"))
        category = address_category(ip)
        if category is None:
            return None
        ip = embedded_ipv4(ip) or ip
        if any(ip.version == net.version and ip in net for net in self.allowed_networks):
            return None
        return category
