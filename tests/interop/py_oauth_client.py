"""Interop driver: the Python `mcp` 2.3.0 client with its OAuth support (`OAuthClientProvider`)
against `palisade serve` (the demo, dev issuer with auto_approve), by itself: discovery from the
401 challenge -> registration (a Client ID Metadata Document when CIMD_URL is given, else Dynamic
Client Registration) -> authorize -> token -> tools/call; then basket_create (needs shop:basket)
-> 403 insufficient_scope -> the SDK's step-up -> success.

Usage: python py_oauth_client.py http://127.0.0.1:PORT/mcp [CIMD_URL]

The "browser" is the redirect handler: it fetches the authorization URL without following the
redirect (with auto_approve the issuer answers 302 to the redirect URI with code, state and iss),
and the callback handler hands those to the SDK like a callback page would. The first
authorization grants shop:read only (as a person unticking shop:basket on the page would: the
resource's 401 challenge names every scope, so the SDK first asks for all of them); later ones go
as sent. Each access token is decoded (not verified: the resource server does that) to check the
audience and the scopes the issuer put in it.
"""

from __future__ import annotations

import base64
import json
import sys
import traceback
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import anyio
import httpx2
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

PROTOCOL = "2026-07-28"
REDIRECT = "http://127.0.0.1:1/callback"
TIMEOUT_S = 20

failures = 0
mode = "dcr"


def report(ok: bool, name: str, detail: str = "") -> None:
    global failures
    if not ok:
        failures += 1
    line = f"{'ok' if ok else 'FAIL'} - py oauth ({mode}): {name}"
    print(f"{line}: {detail}" if detail else line, flush=True)


def describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    return f"{type(e).__name__}: {e}"


def claims(jwt: str) -> dict[str, Any]:
    """The payload of a compact JWS, unverified."""
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


class Storage:
    """In-memory token storage; keeps every access token it is given."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.issued: list[str] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.issued.append(tokens.access_token)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Browser:
    """The redirect and callback handlers: one authorization URL in, its redirect's parameters out."""

    def __init__(self) -> None:
        self.authorizations: list[dict[str, str]] = []  # the query of each URL the SDK sent
        self.callbacks: list[dict[str, str]] = []  # the query of each redirect back
        self._http = httpx2.AsyncClient(follow_redirects=False, timeout=TIMEOUT_S)

    async def redirect(self, authorization_url: str) -> None:
        parts = urlsplit(authorization_url)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.authorizations.append(dict(query))
        if len(self.authorizations) == 1:
            query["scope"] = "shop:read"
        response = await self._http.get(urlunsplit(parts._replace(query=urlencode(query))))
        location = response.headers.get("location")
        if response.status_code != 302 or not location:
            raise RuntimeError(f"authorization answered {response.status_code}: {response.text[:200]}")
        if not location.startswith(REDIRECT + "?"):
            raise RuntimeError(f"authorization redirected to {location[:120]}, not the redirect URI")
        self.callbacks.append({k: v[0] for k, v in parse_qs(urlsplit(location).query).items()})

    async def callback(self) -> AuthorizationCodeResult:
        params = self.callbacks[-1]
        if "error" in params:
            raise RuntimeError(f"authorization refused: {params}")
        return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))

    async def aclose(self) -> None:
        await self._http.aclose()


async def run(url: str, cimd_url: str | None) -> None:
    storage = Storage()
    browser = Browser()
    refusals: list[tuple[int, str]] = []  # (status, WWW-Authenticate) of each 401/403 from /mcp

    async def on_response(response: httpx2.Response) -> None:
        if response.status_code in (401, 403) and str(response.request.url) == url:
            refusals.append((response.status_code, response.headers.get("www-authenticate", "")))

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="palisade-interop-py",
            redirect_uris=[REDIRECT],
            token_endpoint_auth_method="none",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=storage,
        redirect_handler=browser.redirect,
        callback_handler=browser.callback,
        client_metadata_url=cimd_url,
    )
    http = httpx2.AsyncClient(auth=provider, timeout=TIMEOUT_S, event_hooks={"response": [on_response]})
    try:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=PROTOCOL, read_timeout_seconds=TIMEOUT_S) as client:
            report(client.protocol_version == PROTOCOL, "connect (mode pinned)", f"negotiated {client.protocol_version}")
            with anyio.fail_after(TIMEOUT_S):
                product = await client.call_tool("product_get", {"sku": "TEA-001"})
            first = browser.authorizations[0] if browser.authorizations else None
            report(first is not None, "authorized through the dev issuer")
            if first is not None:
                report(first.get("code_challenge_method") == "S256", "PKCE S256")
                report(first.get("resource") == url, "resource is the server", str(first.get("resource")))
                client_id = first.get("client_id", "")
                ok = client_id == cimd_url if cimd_url else client_id.startswith("dcr-")
                report(ok, "registration", client_id)
            issuer = str(provider.context.oauth_metadata.issuer) if provider.context.oauth_metadata else None
            cb = browser.callbacks[0] if browser.callbacks else {}
            report(bool(issuer) and cb.get("iss") == issuer and bool(cb.get("state")), "callback carries state and iss", str(cb.get("iss")))
            token = claims(storage.issued[0]) if storage.issued else {}
            report(
                token.get("aud") in (url, [url]) and token.get("scope") == "shop:read",
                "token: aud is the server, scope shop:read",
                json.dumps({k: token.get(k) for k in ("iss", "aud", "sub", "scope")}),
            )
            sc = product.structured_content or {}
            report(not product.is_error and sc.get("sku") == "TEA-001", "tools/call product_get", str(sc.get("sku")))

            before = len(browser.authorizations)
            refused_before = len(refusals)
            with anyio.fail_after(TIMEOUT_S):
                basket = await client.call_tool("basket_create", {})
            step_ups = [r for r in refusals[refused_before:] if r[0] == 403 and "insufficient_scope" in r[1]]
            report(bool(step_ups), "basket_create with shop:read -> 403 insufficient_scope", step_ups[0][1] if step_ups else str(refusals))
            step_up = browser.authorizations[before] if len(browser.authorizations) > before else None
            scope = (step_up or {}).get("scope", "")
            report(step_up is not None and "shop:basket" in scope.split(), "step-up asked for shop:basket", scope)
            token = claims(storage.issued[-1]) if len(storage.issued) > 1 else {}
            report("shop:basket" in str(token.get("scope", "")).split(), "step-up token carries shop:basket", str(token.get("scope")))
            sc = basket.structured_content or {}
            report(not basket.is_error and isinstance(sc.get("basket"), str), "tools/call basket_create after step-up")
    finally:
        await http.aclose()
        await browser.aclose()


def main() -> int:
    global mode
    if len(sys.argv) not in (2, 3):
        print("usage: py_oauth_client.py URL [CIMD_URL]", file=sys.stderr)
        return 2
    cimd_url = sys.argv[2] if len(sys.argv) == 3 else None
    mode = "cimd" if cimd_url else "dcr"
    try:
        anyio.run(run, sys.argv[1], cimd_url)
    except Exception as e:
        traceback.print_exc()
        report(False, "flow", describe(e))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
