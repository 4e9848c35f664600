"""Embedding trioloop in a Trio app: a UI task answers review cards while the session runs a turn."""

from pathlib import Path

import trio

from trioloop import CallStatus, Phase, ScriptedProvider, Session, ThreatModel, load_thf, threat_model_session
from trioloop.providers.scripted import ScriptedCall, ScriptStep

THREAT = {"title": "Replayed webhook", "category": "Spoofing", "severity": "high", "element": "psp"}
SCRIPT = [
    ScriptStep(tool_calls=[ScriptedCall(id="c1", name="add_threat", input={"threat": THREAT})]),
    ScriptStep(text="Added the threat."),
]


async def review(session: Session[ThreatModel]) -> None:
    async for state in session.states():  # the latest state only: a slow UI never stalls the turn
        if state.phase is Phase.AWAITING_APPROVAL:
            for call in state.current_calls:
                if call.status is CallStatus.PENDING:
                    print("review:", call.summary, "(destructive)" if call.destructive else "")
                    session.approve(call.id)  # or session.deny(call.id) / session.stop()


async def main(document_path: Path) -> None:
    document = load_thf(document_path)
    async with (
        ScriptedProvider(SCRIPT) as provider,  # or AnthropicProvider() / OpenAIProvider()
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(review, session)
            state = await session.send("Add a threat for webhook replay.")
            nursery.cancel_scope.cancel()
        print(state.outcome, len(session.document.threats) - len(document.threats), "threat added")
        session.undo_last_turn()  # one step back to the document before the turn
        print("undone:", session.document == document)


if __name__ == "__main__":
    trio.run(main, Path(__file__).with_name("payment.thf"))
