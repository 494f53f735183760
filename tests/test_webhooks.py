"""Callback URLs as the API reads them: one parse (httpx's), ASCII hosts only, the allowed ports, and addresses
judged by the IPv4 address they carry. The deliveries themselves are tested against a running API
(tests/test_attacks.py)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from paperlane.errors import UsageError
from paperlane.producer.webhooks import parse_callback, public, resolve
from paperlane.settings import ApiSettings

API = ApiSettings()


@pytest.mark.parametrize(("url", "why"), [
    ("http://a.example:99999/", "port must be one of 80, 443"),
    ("http://[::1", "not a valid URL"),
    ("http://a.example/\x00x", "without spaces or control characters"),
    ("http://a.example/\r\nHost: evil", "without spaces or control characters"),
    ("http://stra\u00dfe.example/", "ASCII characters"),  # checked as one IDNA flavour, connected as another
    ("http://a.example:8080/", "port must be one of 80, 443"),
    ("https://user:pw@a.example/", "user name or password"),
    ("ftp://a.example/", "must be an http(s) URL"),
    ("http:///path", "must be an http(s) URL"),
    ("http://2130706433/", "DNS name or an IP address"),  # 127.0.0.1 to inet_aton
    ("http://0x7f.1/", "DNS name or an IP address"),
    ("http://%6cocalhost/", "DNS name or an IP address"),
    ("http://" + "a" * 2000 + ".example/", "at most 2,000"),
])
def test_a_malformed_callback_is_a_usage_error_saying_why(url: str, why: str) -> None:
    with pytest.raises(UsageError, match=re.escape(why)):
        parse_callback(url, API)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255",
    "::1", "::", "fe80::1", "fc00::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254",  # IPv4-mapped
    "::10.0.0.1",  # IPv4-compatible
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe",  # NAT64 of 127.0.0.1 and of the metadata service
    "64:ff9b:1::8.8.8.8",  # local-use NAT64: where the IPv4 address sits is the operator's choice
    "2002:7f00:1::", "2002:a9fe:a9fe::1",  # 6to4 of 127.0.0.1 and 169.254.169.254
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
])
def test_private_addresses_are_private_in_any_disguise(address: str) -> None:
    assert not public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808",
                                     "2002:808:808::1"])
def test_public_addresses_are_public(address: str) -> None:
    assert public(ipaddress.ip_address(address))


def test_a_name_resolves_through_webhook_hosts_and_is_checked_like_any() -> None:
    pinned = API.model_copy(update={"webhook_hosts": {"hooks.example": "127.0.0.1"}})
    callback = parse_callback("http://hooks.example/hook", pinned)
    with pytest.raises(UsageError, match="private or local address"):
        resolve(callback, pinned)
    allowed = pinned.model_copy(update={"webhook_private": True})
    assert resolve(callback, allowed) == [ipaddress.ip_address("127.0.0.1")]
    assert parse_callback("http://hooks.example./x", allowed).netloc == "hooks.example."
    with pytest.raises(UsageError, match="private or local address"):
        resolve(parse_callback("http://[64:ff9b::7f00:1]/", pinned), pinned)
    with pytest.raises(ValueError, match="webhook_hosts"):
        ApiSettings(webhook_hosts={"Hooks.Example": "127.0.0.1"})
    with pytest.raises(ValueError):
        ApiSettings(webhook_hosts={"hooks.example": "not an address"})
