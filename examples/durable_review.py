"""A review that outlives its process: the model's cards wait in a journal until someone approves them.

    python examples/durable_review.py start reviews.db    # the model proposes a change; this process exits
    python examples/durable_review.py approve reviews.db  # later, another process approves; the turn ends

Runs on the embedded scripted model (no network, no key); swap in AnthropicProvider or OpenAIProvider.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from trioloop import Phase, ScriptedProvider, Session
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).with_name("payment.thf")
THREAT = {"title": "Forged PSP webhook", "category": "Spoofing", "severity": "high", "element": "psp"}


async def start(journal: str) -> None:
    script = [ScriptStep(tool_calls=[ScriptedCall(id="t1", name="add_threat", input={"threat": THREAT})])]
    async with ScriptedProvider(script) as provider, SQLiteJournalStore(journal) as store:
        session = await Session.open(
            store, "payment-review", kind=THREAT_MODEL, provider=provider, model="scripted-1",
            document=load_thf(PAYMENT), tools=create_ai_tool_registry(),
        )  # fmt: skip
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "Add the webhook spoofing threat.")
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL:
                    break
            await session.suspend()  # durable: the card stays open in the journal, nothing ran
        print("waiting for review:", [call.summary for call in state.current_calls])


async def approve(journal: str) -> None:
    async with (
        ScriptedProvider([ScriptStep(text="Added the threat.")]) as provider,
        SQLiteJournalStore(journal) as store,
    ):
        session = await Session.open(
            store, "payment-review", kind=THREAT_MODEL, provider=provider, tools=create_ai_tool_registry()
        )
        session.actor = "reviewer@example.com"  # who decided, as the audit trail records it
        async with session:
            assert session.suspended and session.state is not None
            for call in session.state.current_calls:  # the same cards: ids, digests, every field
                session.approve(call.id)
            state = await session.continue_turn()
        print(state.outcome.value, "-", len(session.document.threats), "threats")


if __name__ == "__main__":
    command, path = sys.argv[1], sys.argv[2]
    trio.run(start if command == "start" else approve, path)
