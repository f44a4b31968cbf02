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


def parse_allow_list(entries: list[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """Split allow-list entries into host names and networks (a bare IP is a /32 or /128 network)."""
    names, networks = set(), []
    for entry in entries:
        text = entry.strip().lower().strip("[]")
        if not text:
            raise ValueError("empty entry in crawl.allowed_private_hosts")
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            pass
        if "/" in text or " " in text:
            raise ValueError(f"{entry!r} is neither a host name, an IP address nor a CIDR network")
        names.add(text.rstrip("."))
    return frozenset(names), tuple(networks)


def address_category(ip: IPAddress) -> str | None:
    """None for a public unicast address, else why it is not one (loopback, private, ...)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
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

    def __post_init__(self) -> None:
        self.allowed_names, self.allowed_networks = parse_allow_list(self.allowed)

    def refusal(self, host: str, address: str) -> str | None:
        """Why connecting to ``address`` (resolved from ``host``) is refused, or None when it is allowed."""
        host = host.lower().strip("[]").rstrip(".")
        if host in self.allowed_names:
            return None
        ip = ipaddress.ip_address(address.strip("[]"))
        category = address_category(ip)
        if category is None:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip.version == net.version and ip in net for net in self.allowed_networks):
            return None
        return category
