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


Ports = frozenset[int] | None  # None: any port


def _split_port(text: str, entry: str) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port``, ``1.2.3.4:port``: (host, port); no port (or a bare IPv6): (text, None)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{entry!r}: expected [IPv6]:port")
        port = rest[1:] or None
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    if port is None:
        return host, None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
    return host, int(port)


def _add_port(ports: Ports, port: int | None) -> Ports:
    """The ports allowed after one more entry: an entry without a port allows every port."""
    return None if port is None or ports is None else ports | {port}


def parse_allow_list(
    entries: list[str], allow_wide: bool = False
) -> tuple[dict[str, Ports], tuple[tuple[IPNetwork, Ports], ...]]:
    """Split allow-list entries into host names and networks (a bare IP is a /32 or /128 network), each with
    the ports it allows: ``host:8080``, ``127.0.0.1:8080`` or ``[::1]:8080`` allow that port only, an entry
    without a port every port (a network takes no port).

    A network wider than WIDEST_ALLOWED_PREFIX is refused unless ``allow_wide``.
    """
    names: dict[str, Ports] = {}
    networks: dict[IPNetwork, Ports] = {}
    for entry in entries:
        text = entry.strip().lower()
        if not text:
            raise ValueError("empty entry in crawl.allowed_private_hosts")
        text, port = _split_port(text, entry)
        text = text.strip("[]")
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
            if port is not None and network.num_addresses > 1:
                raise ValueError(f"{entry!r}: a port goes with a host or an address, not a network")
            networks[network] = _add_port(networks.get(network, frozenset()), port)
            continue
        if "/" in text or " " in text or not text:
            raise ValueError(f"{entry!r} is neither a host name, an IP address nor a CIDR network")
        name = text.rstrip(".")
        names[name] = _add_port(names.get(name, frozenset()), port)
    return names, tuple(networks.items())


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

    def refusal(self, host: str, address: str, port: int | None = None) -> str | None:
        """Why connecting to ``address`` (resolved from ``host``) on ``port`` is refused, or None when it is
        allowed. ``port`` None (the resolver, which sees no port) matches an entry for any port; the
        request-time check passes the URL's port, so an allow-listed host's other ports stay refused."""
        host = host.lower().strip("[]").rstrip(".")
        if host in self.allowed_names and _allows(self.allowed_names[host], port):
            return None
        ip = ipaddress.ip_address(address.strip("[]"))
        category = address_category(ip)
        if category is None:
            return None
        ip = embedded_ipv4(ip) or ip
        matching = [ports for net, ports in self.allowed_networks if ip.version == net.version and ip in net]
        if any(_allows(ports, port) for ports in matching):
            return None
        if matching or host in self.allowed_names:
            return f"{category} (port {port} is not allow-listed)"
        return category


def _allows(ports: Ports, port: int | None) -> bool:
    return ports is None or port is None or port in ports
