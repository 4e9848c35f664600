"""The client the official ``@modelcontextprotocol/conformance`` suite launches: trioloop's own MCP host.

The suite starts a test server for one scenario, then runs ``python tests/mcp_conformance_client.py URL``
with the scenario's name in ``MCP_CONFORMANCE_SCENARIO`` (and any scenario data as JSON in
``MCP_CONFORMANCE_CONTEXT``), and judges what the server saw. This program is not a hand-written MCP client:
it connects with ``trioloop.mcp.McpToolset(HttpServer(...))`` (the SDK's client underneath, as in an app),
and runs one real ``Session`` turn in which a scripted model calls the server's tools. A reviewer task stands
in for the person: it approves each card and accepts each question card as shown. For the ``auth/`` scenarios
it gives ``HttpServer(auth=...)`` the CLI's OAuth client (``trioloop.cli.mcp_oauth``: the SDK's
``OAuthClientProvider``, a loopback redirect URI), the browser being a task that follows the authorization page's
redirects to that URI. Where trioloop
lacks what a scenario needs, the scenario fails honestly: nothing here works around the host.

Which tools the scripted model calls: those named in ``CALLS`` for the scenario, with those inputs; for any
other scenario, every tool the server lists, with ``{}`` (the auth and SSE scenarios' test tools take none).

Exit status: 0 when the turn ran, 1 when the toolset could not connect or list the tools, 2 on bad usage.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
from typing import Any, Final

import httpx2
import trio
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from trioloop import CallStatus, Phase, Session, define_document_kind
from trioloop.cli.mcp_oauth import LoopbackCallback, cli_oauth
from trioloop.machine.tools import RegisteredTool
from trioloop.mcp import HttpServer, McpConnectionError, McpToolset
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep

SERVER_NAME: Final = "conformance"
CONNECT_TIMEOUT: Final = 10.0  # the suite gives a scenario 30 s in all
CALL_TIMEOUT: Final = 15.0

#: Scenario -> {server's tool name: input}: the tools the scripted model calls, with what.
CALLS: Final[dict[str, dict[str, dict[str, Any]]]] = {
    "initialize": {},  # the handshake (and tools/list) is the whole scenario
    "tools_call": {"add_numbers": {"a": 5, "b": 3}},
}


def log(message: str) -> None:
    print(f"[trioloop-conformance] {message}", file=sys.stderr, flush=True)


def planned_calls(
    scenario: str, tools: tuple[RegisteredTool[Any], ...], server_names: dict[str, str]
) -> list[ScriptedCall]:
    """The scripted model's calls: the scenario's named tools, else every listed tool with ``{}``."""
    wanted = CALLS.get(scenario)
    calls: list[ScriptedCall] = []
    for number, tool in enumerate(tools, start=1):
        original = server_names[tool.name]
        if wanted is None:
            calls.append(ScriptedCall(id=f"call_{number}", name=tool.name, input={}))
        elif original in wanted:
            calls.append(ScriptedCall(id=f"call_{number}", name=tool.name, input=wanted[original]))
    if wanted:
        missing = sorted(set(wanted) - set(server_names.values()))
        if missing:
            log(f"the server did not offer {', '.join(missing)}")
    return calls


async def approve_every_card(session: Session[str]) -> None:
    """The person's stand-in: approve each pending card, one click per call, as a reviewer would; and accept
    each question card as shown (a form's fields left as the card fills them in: their defaults)."""
    answered: set[str] = set()
    async for state in session.states():  # runs until the nursery is cancelled at the end
        for question in session.questions:
            if question.id not in answered:
                answered.add(question.id)
                log(f"accepting the question of {question.source}: {question.message[:200]!r}")
                session.answer(question.id, "accept", {})
        if state.phase is not Phase.AWAITING_APPROVAL:
            continue
        for card in state.current_calls:
            if card.status is CallStatus.PENDING:
                log(f"approving {card.tool_name}: {card.summary[:200]!r}")
                session.approve(card.id)


class MemoryTokens(TokenStorage):
    """The app's token storage (an app would use the OS keyring); preloaded with a pre-registered client."""

    def __init__(self, client: OAuthClientInformationFull | None = None) -> None:
        self.tokens: OAuthToken | None = None
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


#: The client metadata document the suite's authorization servers know (``client_metadata_url`` in an
#: ``--mcp-config`` server table): used as the client id where a server takes URL-based ids, else ignored.
CLIENT_METADATA_URL: Final = "https://conformance-test.local/client-metadata.json"


async def oauth(url: str, context: dict[str, Any]) -> OAuthClientProvider:
    """The CLI's OAuth client (`trioloop.cli.mcp_oauth`: the SDK's provider, a loopback redirect URI), with a
    person's browser round trip: the test authorization server approves at once, so a browser that follows its
    redirects lands on the CLI's callback server with the code."""
    callback = LoopbackCallback(timeout_s=CONNECT_TIMEOUT)
    await callback.listen()

    async def browser(authorization_url: str) -> None:
        async def visit() -> None:
            async with httpx2.AsyncClient(follow_redirects=True) as client:
                response = await client.get(authorization_url)
            log(f"authorization page answered; the browser ended at {response.status_code}")

        nursery = BROWSER.get()
        nursery.start_soon(visit)  # the CLI waits for the callback while the browser runs

    registered = None
    if context.get("client_id"):  # the pre-registration scenario hands the client its credentials
        registered = OAuthClientInformationFull(
            client_id=context["client_id"],
            client_secret=context.get("client_secret"),
            redirect_uris=[AnyUrl(callback.redirect_uri)],
            # a confidential client authenticates at the token endpoint with HTTP Basic
            token_endpoint_auth_method="client_secret_basic" if context.get("client_secret") else "none",
        )
    return cli_oauth(
        SERVER_NAME,
        url,
        callback,
        log,
        storage=MemoryTokens(registered),
        open_browser=browser,
        client_metadata_url=CLIENT_METADATA_URL,
    )


#: Where the stand-in browser runs: a task beside the connection, as a real browser is a process beside the CLI.
BROWSER: contextvars.ContextVar[trio.Nursery] = contextvars.ContextVar("browser")


def machine_auth(url: str, scenario: str, context: dict[str, Any]) -> OAuthClientProvider | None:
    """The SDK's machine-to-machine providers, as a backend app running trioloop would pass them as
    ``HttpServer(auth=...)``: the client-credentials grant with a secret, or with a signed JWT (RFC 7523)."""
    storage = MemoryTokens(None)
    if scenario == "auth/client-credentials-basic":
        return ClientCredentialsOAuthProvider(url, storage, context["client_id"], context["client_secret"])
    if scenario == "auth/client-credentials-jwt":
        signer = SignedJWTParameters(
            issuer=context["client_id"],
            subject=context["client_id"],
            signing_key=context["private_key_pem"],
            signing_algorithm=context.get("signing_algorithm", "ES256"),
        )
        return PrivateKeyJWTOAuthProvider(url, storage, context["client_id"], signer.create_assertion_provider())
    return None


async def run(url: str, scenario: str, context: dict[str, Any]) -> int:
    auth = machine_auth(url, scenario, context)
    if auth is None and scenario.startswith("auth/"):
        auth = await oauth(url, context)
    server = HttpServer(name=SERVER_NAME, url=url, auth=auth)
    toolset = McpToolset(server, connect_timeout=CONNECT_TIMEOUT, call_timeout=CALL_TIMEOUT, errlog=sys.stderr)
    async with trio.open_nursery() as nursery:
        BROWSER.set(nursery)
        try:
            tools: tuple[RegisteredTool[Any], ...] = await nursery.start(toolset.run)
        except McpConnectionError as exc:
            log(f"FAILED to connect: {exc}")
            return 1
        log(f"connected; tools: {[tool.name for tool in tools]}; skipped: {list(toolset.skipped)}")
        # McpToolset names tools SERVER__TOOL; the scripted model uses those names, the scenario table the server's.
        server_names = {tool.name: tool.name.removeprefix(f"{SERVER_NAME}__") for tool in tools}
        calls = planned_calls(scenario, tools, server_names)
        steps = [ScriptStep(text="Calling the server's tools.", tool_calls=calls)] if calls else []
        steps.append(ScriptStep(text="Done."))
        async with ScriptedProvider(steps) as provider:
            session: Session[str] = Session(
                document="",
                kind=define_document_kind("conformance-note"),
                provider=provider,
                model="scripted-1",
                tools=tools,
                nursery=nursery,
            )
            nursery.start_soon(approve_every_card, session)
            state = await session.send(f"Run the MCP conformance scenario {scenario!r}.")
            log(f"turn outcome: {state.outcome}")
            for call in state.calls:
                result = (call.result or "")[:600]
                log(f"call {call.tool_name}: status={call.status} error={call.is_error} result={result!r}")
        nursery.cancel_scope.cancel()  # close the connection (the toolset's run ends with its nursery)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[-1].startswith(("http://", "https://")):
        print("usage: mcp_conformance_client.py SERVER_URL (the conformance suite appends it)", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    raw = os.environ.get("MCP_CONFORMANCE_CONTEXT")
    context: dict[str, Any] = json.loads(raw) if raw else {}
    log(f"scenario {scenario!r}, server {argv[-1]}" + (f", context keys {sorted(context)}" if context else ""))
    return trio.run(run, argv[-1], scenario, context)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
