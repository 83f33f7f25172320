"""SSRF guard for custom S3 endpoints.

An owner types the endpoint URL and the control plane connects to it, so an unchecked URL
would let a tenant reach the control plane's own network: loopback, the metadata service at
169.254.169.254, private ranges. Here:

- the URL must be https (http only under the test-only TENSORANT_ALLOW_PRIVATE_ENDPOINTS);
- the host is resolved with getaddrinfo, which also turns every numeric spelling
  (2130706433, 0x7f.1, 017700000001, 127.1, ::ffff:127.0.0.1) into a plain address, and
  EVERY address it returns must be public (IPv4-mapped/compatible IPv6, 6to4 and Teredo
  are unwrapped first);
- the connection goes to the checked address (PinnedSender), with the hostname kept for
  SNI, certificate checking and the signed Host header, so DNS cannot answer differently
  between the check and the connect;
- every failure to reach an endpoint gives one message (ENDPOINT_UNREACHABLE), whatever
  the cause (refused, timed out, TLS, blocked), so the probe cannot serve as a port scanner.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

Resolver = Callable[[str, int], list[str]]

ENDPOINT_UNREACHABLE = (
    "cannot reach the endpoint {endpoint}: check the URL (https://host[:port], no path), that it answers S3 "
    "requests and that it is reachable from the control plane over the internet (private, loopback and "
    "link-local addresses are refused)"
)


class EndpointRefused(Exception):
    """The endpoint is not a public https address; the message is the uniform one."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _unwrap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            return ip.ipv4_mapped
        if ip.sixtofour:
            return ip.sixtofour
        if ip.teredo:
            return ip.teredo[1]
        packed = ip.packed
        if packed[:12] == bytes(12) and packed[12:] != bytes(4):  # IPv4-compatible ::a.b.c.d (deprecated)
            return ipaddress.IPv4Address(packed[12:])
    return ip


# Public by the registry, but not a tenant's S3 endpoint: Azure's WireServer (168.63.129.16, the
# host's agent channel, reachable from every Azure VM and the Functions host) and IPv6 site-local
# fec0::/10 (deprecated, still routed inside some private networks).
_REFUSED = (ipaddress.ip_network("168.63.129.16/32"), ipaddress.ip_network("fec0::/10"))


def is_public(address: str) -> bool:
    try:
        ip = _unwrap(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return False
    if any(ip in net for net in _REFUSED if net.version == ip.version):
        return False
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
                or ip.is_unspecified or not ip.is_global)


def split_endpoint(endpoint: str, *, allow_private: bool) -> tuple[str, str, int]:
    """(scheme, host, port) of an endpoint URL that may be used at all."""
    parts = urlsplit(endpoint)
    if parts.scheme != "https" and not (allow_private and parts.scheme == "http"):
        raise EndpointRefused("the endpoint must be an https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise EndpointRefused("the endpoint's port is not a number") from exc
    if not parts.hostname:
        raise EndpointRefused("the endpoint has no host")
    return parts.scheme, parts.hostname, port


def resolve_checked(host: str, port: int, *, allow_private: bool, resolver: Resolver = system_resolver) -> str:
    """The address to connect to: every address the host resolves to must be public."""
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError) as exc:
        raise EndpointRefused("the endpoint's host does not resolve") from exc
    if not addresses:
        raise EndpointRefused("the endpoint's host does not resolve")
    if not allow_private and not all(is_public(a) for a in addresses):
        raise EndpointRefused("the endpoint resolves to a non-public address")
    return addresses[0]


class PinnedSender:
    """A botocore `before-send` handler: sends each request itself, to the checked address.

    botocore lets a before-send handler return the response, which replaces its own send;
    the request is then made with urllib3 to the pinned IP, with the original Host header,
    SNI name and certificate hostname."""

    def __init__(self, *, allow_private: bool, resolver: Resolver = system_resolver,
                 connect_timeout: float = 5, read_timeout: float = 60) -> None:
        self.allow_private = allow_private
        self.resolver = resolver
        self.timeout = (connect_timeout, read_timeout)
        self._pools: dict[tuple[str, str, str, int], Any] = {}

    def _pool(self, scheme: str, host: str, ip: str, port: int) -> Any:
        import urllib3

        key = (scheme, host, ip, port)
        if key not in self._pools:
            timeout = urllib3.Timeout(connect=self.timeout[0], read=self.timeout[1])
            if scheme == "https":
                from botocore.httpsession import get_cert_path

                self._pools[key] = urllib3.HTTPSConnectionPool(
                    ip, port, timeout=timeout, maxsize=4, retries=False, cert_reqs="CERT_REQUIRED",
                    ca_certs=get_cert_path(True), server_hostname=host, assert_hostname=host)
            else:
                self._pools[key] = urllib3.HTTPConnectionPool(ip, port, timeout=timeout, maxsize=4, retries=False)
        return self._pools[key]

    def __call__(self, request: Any, **_: Any) -> Any:
        import urllib3
        from botocore.awsrequest import AWSResponse
        from botocore.exceptions import EndpointConnectionError

        scheme, host, port = split_endpoint(request.url, allow_private=self.allow_private)
        ip = resolve_checked(host, port, allow_private=self.allow_private, resolver=self.resolver)
        parts = urlsplit(request.url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}
        headers["Host"] = parts.netloc
        try:
            raw = self._pool(scheme, host, ip, port).urlopen(
                request.method, target, body=request.body, headers=headers, redirect=False, retries=False,
                preload_content=False, assert_same_host=False, decode_content=False)
        except urllib3.exceptions.HTTPError as exc:
            # One error for every transport failure; botocore retries it like its own.
            raise EndpointConnectionError(endpoint_url=f"{scheme}://{parts.netloc}") from exc
        return AWSResponse(request.url, raw.status, raw.headers, raw)
