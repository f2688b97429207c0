"""Which addresses a media fetch may reach: every special-purpose range, every IPv6 spelling of a
private IPv4 address, and what the explicit allow options open (and never open)."""

from __future__ import annotations

import ipaddress

import pytest

from ninfer.media.addresses import FetchPolicy, category, refusal

REFUSED = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "172.31.255.254": "private",
    "192.168.1.1": "private",
    "169.254.1.1": "link-local",
    "169.254.169.254": "metadata",
    "fd00:ec2::254": "metadata",
    "100.100.100.200": "metadata",
    "100.64.0.1": "shared",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "224.0.0.1": "multicast",
    "255.255.255.255": "reserved",
    "240.0.0.1": "reserved",
    "198.18.0.1": "benchmarking",
    "192.0.2.10": "documentation",
    "fd00::1": "unique-local",
    "fc00::5": "unique-local",
    "fe80::1": "link-local",
    "ff02::1": "multicast",
    "2001:db8::1": "documentation",
    # IPv4 embedded in IPv6: judged by the embedded address
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "metadata",
    "::10.0.0.1": "private",
    "64:ff9b::192.168.0.1": "private",
    "2002:c0a8:0101::1": "private",  # 6to4 of 192.168.1.1
    "2002:7f00:0001::": "loopback",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "teredo",
    "64:ff9b:1::1": "nat64-local",
    "4000::1": "reserved",  # outside global unicast 2000::/3
}

PUBLIC = [
    "93.184.216.34",
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::8.8.8.8",
    "2002:0808:0808::1",
]


@pytest.mark.parametrize("text,why", sorted(REFUSED.items()))
def test_special_addresses_are_refused(text: str, why: str) -> None:
    ip = ipaddress.ip_address(text)
    assert category(ip) == why
    assert refusal(ip, FetchPolicy()) == why


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_are_allowed(text: str) -> None:
    assert refusal(ipaddress.ip_address(text), FetchPolicy()) is None


def test_scoped_ipv6_is_link_local() -> None:
    assert refusal(ipaddress.ip_address("fe80::1%eth0"), FetchPolicy()) == "link-local"


def test_allow_private_opens_local_networks_only() -> None:
    policy = FetchPolicy(allow_private=True)
    for text in ("127.0.0.1", "::1", "10.0.0.1", "192.168.0.1", "fd00::1", "::ffff:10.0.0.1"):
        assert refusal(ipaddress.ip_address(text), policy) is None, text
    for text, why in [
        ("169.254.169.254", "metadata"),
        ("::ffff:169.254.169.254", "metadata"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
    ]:
        assert refusal(ipaddress.ip_address(text), policy) == why


def test_allow_networks_opens_exactly_the_listed_networks() -> None:
    policy = FetchPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    assert refusal(ipaddress.ip_address("127.0.0.1"), policy) is None
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1"), policy) is None
    assert refusal(ipaddress.ip_address("127.0.0.2"), policy) == "loopback"
    assert refusal(ipaddress.ip_address("10.0.0.1"), policy) == "private"
