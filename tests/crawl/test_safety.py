"""The private-address refusal, checked against an independent table of IANA special-purpose ranges."""

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.settings import Settings

from pipeline.core.config import ConfigError
from pipeline.crawl.middlewares import (
    REFUSED_HOSTS,
    AddressRefused,
    BackoffRetryMiddleware,
    GuardedResolver,
    retry_after_seconds,
)
from pipeline.crawl.safety import AddressPolicy, parse_allow_list
from tests.conftest import make_config

# Written from the IANA IPv4/IPv6 special-purpose registries (not from Python's ipaddress tables).
NOT_PUBLIC_V4 = [
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "224.0.0.0/4", "240.0.0.0/4",
]  # fmt: skip
# Ranges whose status differs between registry revisions and Python versions: no claim either way.
UNSETTLED = [
    "192.0.0.0/24",
    "192.88.99.0/24",
    "2001::/23",
    "2002::/16",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "3fff::/20",
]
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
NOT_PUBLIC_V6_INSIDE_GLOBAL_UNICAST = ["2001:db8::/32"]


def reference_is_public(address: str) -> bool | None:
    ip = ipaddress.ip_address(address)
    if any(
        ip in ipaddress.ip_network(net)
        for net in UNSETTLED
        if ipaddress.ip_network(net).version == ip.version
    ):
        return None
    if ip.version == 6:
        if int(ip) >> 32 == 0xFFFF:  # ::ffff:a.b.c.d names an IPv4 host
            return reference_is_public(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
        inside = ip in GLOBAL_UNICAST_V6 and not any(
            ip in ipaddress.ip_network(n) for n in NOT_PUBLIC_V6_INSIDE_GLOBAL_UNICAST
        )
        return inside
    return not any(ip in ipaddress.ip_network(net) for net in NOT_PUBLIC_V4)


v4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
v6 = st.integers(0, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))
special = st.sampled_from(
    [
        str(next(ipaddress.ip_network(n).hosts(), ipaddress.ip_network(n).network_address))
        for n in NOT_PUBLIC_V4
    ]
    + [
        "::",
        "::1",
        "fe80::1",
        "fc00::5",
        "fd12::1",
        "ff02::1",
        "fec0::1",
        "::ffff:127.0.0.1",
        "::ffff:10.1.1.1",
    ]
    + ["::ffff:8.8.8.8", "2001:db8::1", "2606:4700::1111", "8.8.8.8", "1.1.1.1", "169.254.169.254"]
)


@settings(deadline=None, max_examples=400)
@given(st.one_of(v4, v6, special))
def test_refusal_matches_the_registry(address):
    expected = reference_is_public(address)
    if expected is None:
        return
    refused = AddressPolicy([]).refusal("some.host", address) is not None
    assert refused == (not expected), address


def test_allow_list_by_name_address_and_network():
    policy = AddressPolicy(
        ["localhost", "127.0.0.1", "10.0.0.0/8", "[::1]", "Crawl-Target.Example."], allow_wide=True
    )
    assert policy.refusal("localhost", "127.0.0.5") is None, "a name exempts whatever it resolves to"
    assert policy.refusal("crawl-target.example", "192.168.1.1") is None
    assert policy.refusal("other", "127.0.0.1") is None
    assert policy.refusal("other", "::ffff:127.0.0.1") is None, "an IPv4-mapped address is its IPv4 address"
    assert policy.refusal("other", "10.200.3.4") is None
    assert policy.refusal("other", "::1") is None
    assert policy.refusal("other", "127.0.0.2") == "loopback"
    assert policy.refusal("other", "169.254.169.254") == "link_local"
    assert policy.refusal("other", "172.16.0.1") == "private"
    assert policy.refusal("other", "8.8.8.8") is None


@pytest.mark.parametrize("entry", ["", "10.0.0.0/33", "not a host", "a/b"])
def test_bad_allow_list_entries_fail_at_config_time(entry, tmp_path):
    with pytest.raises(ValueError):
        parse_allow_list([entry])
    with pytest.raises(ConfigError, match=r"crawl\.allowed_private_hosts"):
        make_config(tmp_path, f"crawl.allowed_private_hosts=['{entry}']")


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::", "link_local"),  # 6to4 of 169.254.169.254
        ("2002:c0a8:101::1", "private"),  # 6to4 of 192.168.1.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link_local"),
        ("64:ff9b:1::a00:1", "private"),  # local-use NAT64 of 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1 (obfuscated)
    ],
)
def test_ipv6_addresses_that_carry_a_private_ipv4_are_refused_as_it(address, category):
    assert AddressPolicy([]).refusal("some.host", address) == category


def test_ipv6_transition_addresses_of_public_ipv4_pass():
    assert AddressPolicy([]).refusal("h", "64:ff9b::808:808") is None  # NAT64 of 8.8.8.8
    assert AddressPolicy([]).refusal("h", "2002:808:808::1") is None  # 6to4 of 8.8.8.8


@pytest.mark.parametrize("entry", ["0.0.0.0/0", "10.0.0.0/8", "169.254.0.0/16", "::/0", "fc00::/7"])
def test_a_wide_allow_list_entry_needs_the_explicit_setting(entry, tmp_path):
    with pytest.raises(ConfigError, match=r"allow_wide_private_networks"):
        make_config(tmp_path, f"crawl.allowed_private_hosts=['{entry}']")
    config = make_config(
        tmp_path, f"crawl.allowed_private_hosts=['{entry}']", "crawl.allow_wide_private_networks=true"
    )
    assert config.crawl.allowed_private_hosts == [entry]
    make_config(tmp_path, "crawl.allowed_private_hosts=['10.1.2.0/24', 'fd00:1:2:3::/64', '127.0.0.1']")


def test_config_rejects_seeds_and_pins_it_cannot_use(tmp_path):
    with pytest.raises(ConfigError, match=r"crawl\.seeds.*ftp://example\.com/.*unsupported_scheme"):
        make_config(tmp_path, "crawl.seeds=[ftp://example.com/]")
    with pytest.raises(ConfigError, match=r"crawl\.host_addresses"):
        make_config(tmp_path, "crawl.host_addresses={www.example.com: not-an-ip}")
    with pytest.raises(ConfigError, match=r"crawl\.allowed_content_types"):
        make_config(tmp_path, "crawl.allowed_content_types=[html]")


def _resolve(resolver, name):
    outcome = []
    resolver.getHostByName(name).addBoth(outcome.append)
    (result,) = outcome
    return result


def test_resolver_refuses_at_connection_time():
    """The connect-time guard: a pinned (or re-resolved) private address fails the lookup itself."""
    pinned = {
        "www.example.com": "93.184.216.34",
        "internal.example.com": "10.0.0.7",
        "ok.example.com": "127.0.0.1",
    }
    resolver = GuardedResolver(
        object(), cache_size=0, timeout=1.0, policy=AddressPolicy(["127.0.0.1"]), pinned=pinned
    )
    assert _resolve(resolver, "www.example.com") == "93.184.216.34"
    assert _resolve(resolver, "OK.example.com") == "127.0.0.1"
    failure = _resolve(resolver, "internal.example.com")
    assert failure.check(AddressRefused)
    assert "10.0.0.7" in REFUSED_HOSTS["internal.example.com"]


def test_retry_after_header_forms():
    assert retry_after_seconds(b"7") == 7.0
    assert retry_after_seconds(b"Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert retry_after_seconds(b"Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after_seconds(b"soon") is None
    assert retry_after_seconds(None) is None


def test_backoff_doubles_honours_retry_after_and_is_capped():
    middleware = BackoffRetryMiddleware(
        Settings(
            {"CRAWL_RETRY_BACKOFF": 0.5, "CRAWL_RETRY_BACKOFF_MAX": 10.0, "CRAWL_SEED": 3, "RETRY_TIMES": 5}
        )
    )
    delays = [middleware.backoff(n) for n in (1, 2, 3, 4)]
    for n, delay in enumerate(delays, 1):
        assert 0.5 * 2 ** (n - 1) <= delay <= 0.5 * 2 ** (n - 1) * 1.25
    assert middleware.backoff(1, retry_after=4.0) >= 4.0
    assert middleware.backoff(1, retry_after=3600.0) == 10.0
    assert middleware.backoff(10) == 10.0


def test_a_failed_lookup_fails_closed_before_the_downloader(monkeypatch):
    """A host whose address could not be checked is refused, not handed to the downloader."""
    import scrapy
    from twisted.internet import defer, reactor
    from twisted.internet.error import DNSLookupError

    from pipeline.crawl.middlewares import AddressGuardMiddleware, CrawlRefusal

    class FailingResolver:
        def getHostByName(self, name, timeout=()):
            return defer.fail(DNSLookupError(name))

    monkeypatch.setattr(reactor, "resolver", FailingResolver(), raising=False)
    guard = AddressGuardMiddleware(crawler=None)
    coroutine = guard.process_request(scrapy.Request("http://no-such-host.example/"))
    with pytest.raises(CrawlRefusal) as refusal:
        coroutine.send(None)
    assert refusal.value.reason == "dns_error"


def test_allow_list_entries_take_an_optional_port():
    """The allow-list had no ports: a link or redirect to another port of an allow-listed host was fetched
    (an internal service on that host received requests)."""
    policy = AddressPolicy(["127.0.0.1:8080", "[::1]:9000", "intranet.example:8443", "10.0.0.5"])
    assert policy.refusal("127.0.0.1", "127.0.0.1", 8080) is None
    assert policy.refusal("127.0.0.1", "127.0.0.1", 6379) == "loopback (port 6379 is not allow-listed)"
    assert policy.refusal("127.0.0.1", "127.0.0.1") is None  # the resolver sees no port: the request did
    assert policy.refusal("::1", "::1", 9000) is None and policy.refusal("::1", "::1", 22) is not None
    assert policy.refusal("intranet.example", "10.1.1.1", 8443) is None
    assert policy.refusal("intranet.example", "10.1.1.1", 80) == "private (port 80 is not allow-listed)"
    assert policy.refusal("other", "10.0.0.5", 12345) is None  # no port: every port
    assert policy.refusal("public.example", "8.8.8.8", 6379) is None  # public addresses need no entry
    names, _ = parse_allow_list(["h:1", "h:2", "x", "x:3"])
    assert names == {"h": frozenset({1, 2}), "x": None}


@pytest.mark.parametrize("entry", ["h:0", "h:70000", "h:http", "10.0.0.0/24:80", "[::1]x"])
def test_bad_ports_in_the_allow_list_fail_at_config_time(entry, tmp_path):
    with pytest.raises(ConfigError, match=r"crawl\.allowed_private_hosts"):
        make_config(tmp_path, f"crawl.allowed_private_hosts=['{entry}']")


def test_the_sample_site_allow_lists_its_own_port_only(tmp_path):
    from pipeline.crawl.stage import spider_settings

    config = make_config(tmp_path, "crawl.allowed_private_hosts=[intranet.example]")
    settings = spider_settings(config, sample_site="127.0.0.1:41234")
    assert settings["CRAWL_ALLOWED_PRIVATE_HOSTS"] == ["intranet.example", "127.0.0.1:41234"]
