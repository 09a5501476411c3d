# Confusable characters (fullwidth digits, ideographic full stops) are what this tests.
# ruff: noqa: RUF001
"""SSRF guard: blocked ranges, IPv4 inside IPv6, resolution through an injected resolver,
and the one reading of where a URL leads (``destination``), checked against what the HTTP
clients themselves (yarl for aiohttp, httpx) read from each spelling."""

from __future__ import annotations

import ipaddress
import random
import re
import socket

import httpx
import pytest
import yarl

from sessionhook.relay.delivery.resolve import (
    ResolutionError,
    check_url,
    resolve_host,
    vet_host,
)
from sessionhook.relay.domain.addresses import (
    BlockedAddressError,
    UnusableUrlError,
    destination,
    ip_literal,
    is_blocked_ip,
    literal_refusal,
)

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("224.0.0.251", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.10", "reserved"),
        ("2001:db8::1", "reserved"),
        ("198.18.0.1", "reserved"),
        ("::127.0.0.1", "reserved"),
        # IPv4 carried in IPv6 is judged by the IPv4 it carries.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("64:ff9b::a9fe:a9fe", "cloud metadata"),
        ("2002:c0a8:0101::1", "private"),
    ],
)
def test_blocked_addresses(ip: str, reason: str) -> None:
    got = is_blocked_ip(ip)
    assert got is not None
    assert reason in got


@pytest.mark.parametrize(
    "ip",
    [
        "8.8.8.8",
        "1.1.1.1",
        "100.63.255.255",
        "100.128.0.1",
        "172.32.0.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:0808:0808::1",
    ],
)
def test_public_addresses_pass(ip: str) -> None:
    assert is_blocked_ip(ip) is None


def test_address_objects_and_garbage() -> None:
    assert is_blocked_ip(ipaddress.ip_address("10.0.0.1")) == "private address"
    with pytest.raises(ValueError):
        is_blocked_ip("example.com")


class FakeResolver:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise ResolutionError(f"cannot resolve {host}")
        return self.answers[host]


async def test_public_name_passes_and_port_is_passed_on() -> None:
    resolver = FakeResolver({"hooks.example.com": ["93.184.216.34", "2606:2800:220:1::1"]})
    await check_url("https://hooks.example.com/x", allow_private=False, resolve=resolver)
    await check_url("http://hooks.example.com:8443/x", allow_private=False, resolve=resolver)
    assert resolver.asked == [("hooks.example.com", 443), ("hooks.example.com", 8443)]


async def test_name_resolving_to_a_private_address_is_refused() -> None:
    resolver = FakeResolver({"internal.example.com": ["93.184.216.34", "10.0.0.5"]})
    with pytest.raises(BlockedAddressError) as info:
        await check_url("https://internal.example.com/", allow_private=False, resolve=resolver)
    assert info.value.reason == "internal.example.com resolves to 10.0.0.5, a private address"


async def test_metadata_via_mapped_ipv6_answer() -> None:
    resolver = FakeResolver({"sneaky.example.com": ["::ffff:169.254.169.254"]})
    with pytest.raises(BlockedAddressError, match="cloud metadata"):
        await check_url("http://sneaky.example.com/", allow_private=False, resolve=resolver)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9000/hook", "127.0.0.1 is a loopback address"),
        ("http://[::1]/hook", "::1 is a loopback address"),
        ("http://[::ffff:7f00:1]/hook", "loopback address"),
        ("http://169.254.169.254/latest/meta-data", "cloud metadata address"),
        ("http://localhost:8080/", "localhost is a loopback name"),
        ("http://api.localhost/", "loopback name"),
    ],
)
async def test_literals_and_localhost_need_no_dns(url: str, reason: str) -> None:
    resolver = FakeResolver({})
    with pytest.raises(BlockedAddressError, match=re.escape(reason)):
        await check_url(url, allow_private=False, resolve=resolver)
    assert resolver.asked == []


async def test_allow_private_skips_address_checks_but_still_resolves_once() -> None:
    resolver = FakeResolver({"internal": ["10.0.0.5", "127.0.0.1"]})
    assert await check_url("http://127.0.0.1:9000/", allow_private=True, resolve=resolver) == [
        "127.0.0.1"
    ]
    assert await check_url("http://internal/", allow_private=True, resolve=resolver) == [
        "10.0.0.5",
        "127.0.0.1",
    ]
    assert resolver.asked == [("internal", 80)]


async def test_vet_host_returns_the_vetted_addresses_in_resolver_order() -> None:
    resolver = FakeResolver({"hooks.example.com": ["2606:2800:220:1::1", "93.184.216.34"]})
    vetted = await vet_host("hooks.example.com", 443, allow_private=False, resolve=resolver)
    assert vetted == ["2606:2800:220:1::1", "93.184.216.34"]
    assert await vet_host("93.184.216.34", 80, allow_private=False) == ["93.184.216.34"]
    assert await vet_host("[2606:2800:220:1::1]", 80, allow_private=False) == ["2606:2800:220:1::1"]


async def test_the_address_policy_is_injectable() -> None:
    """What tests use to treat one loopback address as public and another as private."""

    def policy(address: str) -> str | None:
        return None if address == "127.0.0.2" else "private address (test policy)"

    resolver = FakeResolver({"two.test": ["127.0.0.2"], "one.test": ["127.0.0.2", "127.0.0.1"]})
    assert await vet_host("two.test", 80, allow_private=False, resolve=resolver, policy=policy) == [
        "127.0.0.2"
    ]
    with pytest.raises(BlockedAddressError, match=r"one\.test resolves to 127\.0\.0\.1"):
        await vet_host("one.test", 80, allow_private=False, resolve=resolver, policy=policy)
    assert literal_refusal("http://127.0.0.2/", policy=policy) is None
    assert literal_refusal("http://127.0.0.2/") == "127.0.0.2 is a loopback address"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9000/hook", "127.0.0.1 is a loopback address"),
        ("http://[::1]/hook", "::1 is a loopback address"),
        ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
        ("http://127.1/hook", "127.1 (127.0.0.1) is a loopback address"),  # legacy IPv4 forms
        ("http://0x7f.0.0.1/hook", "0x7f.0.0.1 (127.0.0.1) is a loopback address"),
        ("http://2130706433/hook", "2130706433 (127.0.0.1) is a loopback address"),
        ("http://0xa9fea9fe/", "0xa9fea9fe (169.254.169.254) is a cloud metadata address"),
        ("http://0.0.0.0/", "0.0.0.0 is a unspecified address"),
        ("http://LOCALHOST:8080/", "localhost is a loopback name"),
        ("https://api.localhost./", "api.localhost. is a loopback name"),
        ("ftp://example.com/", "not an http(s) URL: ftp://..."),
        ("http://93.184.216.34/hook", None),
        ("https://hooks.example.com/", None),  # judged when connecting, after resolving
        ("http://internal/", None),
        ("http://deadbeef/", None),  # a name, not hex
        ("http://1e100.net/", None),
    ],
)
def test_literal_refusal_needs_no_dns(url: str, reason: str | None) -> None:
    assert literal_refusal(url) == reason


@pytest.mark.parametrize("url", ["ftp://example.com/", "file:///etc/passwd", "http:///nohost"])
async def test_non_http_urls_are_refused_even_when_private_is_allowed(url: str) -> None:
    with pytest.raises(UnusableUrlError, match=r"not an http|no host"):
        await check_url(url, allow_private=True)


async def test_bad_port() -> None:
    with pytest.raises(UnusableUrlError, match="invalid port"):
        await check_url("http://example.com:99999/", allow_private=False, resolve=FakeResolver({}))


async def test_resolution_failures() -> None:
    with pytest.raises(ResolutionError, match=r"cannot resolve nowhere\.example"):
        await check_url("http://nowhere.example/", allow_private=False, resolve=FakeResolver({}))
    empty = FakeResolver({"empty.example": []})
    with pytest.raises(ResolutionError, match="no address"):
        await check_url("http://empty.example/", allow_private=False, resolve=empty)


async def test_default_resolver_with_real_localhost() -> None:
    addresses = await resolve_host("localhost", 80)
    assert addresses
    assert all(is_blocked_ip(a) == "loopback address" for a in addresses)


def test_legacy_ipv4_literals_read_as_the_c_library_reads_them() -> None:
    """domain/addresses reads ``127.1``, ``0x7f.1``, ``017700000001``... without the socket
    module: every string here must mean what ``inet_aton`` (what resolvers use) says."""
    rng = random.Random(21)
    spellings = [
        lambda v: str(v),
        lambda v: "0" + format(v, "o"),
        lambda v: "0x" + format(v, "x"),
        lambda v: "0X" + format(v, "X"),
    ]
    values = [0, 1, 7, 8, 9, 255, 256, 0xFFFF, 0x10000, 0xFFFFFF, 0x1000000, 0xFFFFFFFF, 1 << 32]
    cases = {"0x", "08", "09.1", "1..2", "1.2.3.4.", ".1", "1.2.3.4.5", "0x1g", "00", "0x0"}
    for _ in range(5000):
        parts = [rng.choice(spellings)(rng.choice(values)) for _ in range(rng.randint(1, 5))]
        cases.add(".".join(parts))
    for _ in range(5000):
        cases.add("".join(rng.choice("0123456789abcdefx.") for _ in range(rng.randint(1, 16))))
    for text in sorted(cases):
        try:
            expected: ipaddress.IPv4Address | None = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            expected = None
        assert ip_literal(text) == expected, text


# --------------------------------------------------------------------------- destination
# The spellings of issue 26 (each once accepted while it led to loopback, the metadata
# address or a private one), and more: what destination() reads, what literal_refusal()
# says, and what the HTTP clients read from the URL destination() rebuilt.

REFUSED_SPELLINGS = [
    ("http://１２７.0.0.1:8080/", "127.0.0.1", "１２７.0.0.1 (127.0.0.1) is a loopback address"),
    ("http://127。0。0。1/", "127.0.0.1", "127。0。0。1 (127.0.0.1) is a loopback address"),
    (
        "http://１２７．０．０．１/",
        "127.0.0.1",
        "１２７．０．０．１ (127.0.0.1) is a loopback address",
    ),
    ("http://127｡0｡0｡1/", "127.0.0.1", "127｡0｡0｡1 (127.0.0.1) is a loopback address"),
    ("http://①②⑦.0.0.1/", "127.0.0.1", "①②⑦.0.0.1 (127.0.0.1) is a loopback address"),
    ("http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/", "localhost", "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ (localhost) is a loopback name"),
    (
        "http://ｌｏｃａｌｈｏｓｔ./",
        "localhost.",
        "ｌｏｃａｌｈｏｓｔ. (localhost.) is a loopback name",
    ),
    (
        "http://１６９.２５４.１６９.２５４/latest/meta-data/",
        "169.254.169.254",
        "１６９.２５４.１６９.２５４ (169.254.169.254) is a cloud metadata address",
    ),
    ("http://１０.0.0.1/", "10.0.0.1", "１０.0.0.1 (10.0.0.1) is a private address"),
    ("http://127.0.0.1.:8080/", "127.0.0.1", "127.0.0.1. (127.0.0.1) is a loopback address"),
    ("http://%31%32%37.0.0.1/", "127.0.0.1", "%31%32%37.0.0.1 (127.0.0.1) is a loopback address"),
    ("http://127.0.0.1%2e/", "127.0.0.1", "127.0.0.1%2e (127.0.0.1) is a loopback address"),
    ("http://%6c%6fcalhost/", "localhost", "%6c%6fcalhost (localhost) is a loopback name"),
    ("http://LocalHost:80/", "localhost", "localhost is a loopback name"),
    ("http://0x7f.1/", "127.0.0.1", "0x7f.1 (127.0.0.1) is a loopback address"),
    ("http://0177.0.0.1/", "127.0.0.1", "0177.0.0.1 (127.0.0.1) is a loopback address"),
    ("http://2130706433/", "127.0.0.1", "2130706433 (127.0.0.1) is a loopback address"),
    ("http://０x7f.1/", "127.0.0.1", "０x7f.1 (127.0.0.1) is a loopback address"),
    (
        "http://[::ffff:127.0.0.1]/",
        "::ffff:7f00:1",
        "[::ffff:127.0.0.1] (::ffff:7f00:1) is a loopback address",
    ),
    ("http://[::ffff:7f00:1]/", "::ffff:7f00:1", "::ffff:7f00:1 is a loopback address"),
    (
        "http://public.example@１２７.0.0.1/",
        "127.0.0.1",
        "１２７.0.0.1 (127.0.0.1) is a loopback address",
    ),
    ("http://a@b@127.0.0.1/", "127.0.0.1", "127.0.0.1 is a loopback address"),
    ("http://hooks.example.com%2F@127.0.0.1/", "127.0.0.1", "127.0.0.1 is a loopback address"),
]


@pytest.mark.parametrize(("url", "host", "reason"), REFUSED_SPELLINGS)
def test_every_spelling_of_a_private_host_is_read_as_the_clients_read_it(
    url: str, host: str, reason: str
) -> None:
    target = destination(url)
    assert target.host == host
    assert literal_refusal(url) == reason
    # What the clients read from the rebuilt URL is the host judged.
    assert yarl.URL(target.url).raw_host == host
    assert httpx.URL(target.url).raw_host.decode() == host
    # Where yarl (aiohttp's URLs) reads the original as an address or a plain name, it is
    # ours: the spellings that fooled the old guard are the ones it normalizes.
    raw = yarl.URL(url).raw_host or ""
    try:
        assert ipaddress.ip_address(raw) == target.address
    except ValueError:
        if "%" not in raw and ip_literal(raw.rstrip(".")) is None:
            assert raw == host


@pytest.mark.parametrize(
    ("url", "rebuilt"),
    [
        ("http://bücher.example/hook", "http://xn--bcher-kva.example/hook"),
        ("https://BÜCHER.Example:8443/a?b=1#c", "https://xn--bcher-kva.example:8443/a?b=1#c"),
        ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
        ("http://faß.de/", "http://xn--fa-hia.de/"),
        ("http://☃.net/", "http://xn--n3h.net/"),  # IDNA 2003, as yarl falls back to
        ("http://ex%61mple.com/x%20y", "http://example.com/x%20y"),
        ("HTTPS://Hooks.Example.COM", "https://hooks.example.com"),
        ("http://my_host.internal.example:8080/", "http://my_host.internal.example:8080/"),
        ("http://example.com:８０/", "http://example.com:80/"),
        ("http://0x5db8d822/", "http://93.184.216.34/"),
        ("http://user:p%40ss@hooks.example.com/", "http://user:p%40ss@hooks.example.com/"),
        ("http://üser@hooks.example.com/", "http://%C3%BCser@hooks.example.com/"),
        ("http://@hooks.example.com/", "http://hooks.example.com/"),
        ("http://e\u00advil.example/", "http://evil.example/"),  # UTS-46 drops a soft hyphen
        ("http://[2606:2800:0220:0001::1]/", "http://[2606:2800:220:1::1]/"),
        ("http://hooks.example.com./", "http://hooks.example.com./"),
        # An A-label that is no valid IDNA is a name: DNS, then vet_host, judge what it is.
        ("http://xn--localhost-/", "http://xn--localhost-/"),
    ],
)
def test_public_and_international_names_keep_working(url: str, rebuilt: str) -> None:
    target = destination(url)
    assert target.url == rebuilt
    assert literal_refusal(url) is None
    assert yarl.URL(target.url).raw_host == target.host
    assert httpx.URL(target.url).raw_host.decode() == target.host


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://a..b/", "the host a..b is no host name or IP address"),
        ("http://.example/", "the host .example is no host name or IP address"),
        ("http://127.0.0.1%00.evil/", "the host 127.0.0.1%00.evil is no host name or IP address"),
        ("http://%ff.example/", "the host %ff.example decodes to no UTF-8 text"),
        ("http://x\uff0fy.example/", "the host x／y.example is no host name or IP address"),
        ("http://\u202eevil.com/", "the host \\u202eevil.com is no valid international name"),
        ("http://example.123/", "the host example.123 ends like an IPv4 address but is none"),
        ("http://256.0.0.1/", "the host 256.0.0.1 ends like an IPv4 address but is none"),
        ("http://1.2.3.4.5/", "the host 1.2.3.4.5 ends like an IPv4 address but is none"),
        (
            "http://[fe80::1%25eth0]/",
            "the host [fe80::1%25eth0] is no IPv6 address (without a zone)",
        ),
        ("http://[127.0.0.1]/", "the host [127.0.0.1] is no IPv6 address (without a zone)"),
        ("http://[::1]x/", "the URL's host part [::1]x is no [IPv6]:port"),
        ("http://evil.example\\@127.0.0.1/", "a backslash in the URL's host part"),
        ("http://127.0.0.1\t/", "the URL holds a space or a control character"),
        ("http://127.0.0.1:80:80/", "invalid port in the URL of 127.0.0.1"),
        ("http://hooks.example.com:0/", "invalid port in the URL of hooks.example.com"),
        ("http://hooks.example.com:99999/", "invalid port in the URL of hooks.example.com"),
        ("http:///nohost", "the URL has no host"),
        ("gopher://127.0.0.1/", "not an http(s) URL: gopher://..."),
    ],
)
def test_a_host_that_is_not_plain_once_normalized_is_refused(url: str, reason: str) -> None:
    with pytest.raises(UnusableUrlError) as refused:
        destination(url)
    assert refused.value.reason == reason
    assert "\n" not in reason
    assert literal_refusal(url) == reason  # the dispatcher's guard refuses it too
