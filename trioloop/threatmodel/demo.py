"""The scripted conversation `trioloop demo` plays against `examples/payment.thf`.

Five iterations exercise, in order: read tools (auto-approved), a batch of safe edits beside a
destructive one and an invalid call, the model correcting that call after seeing the field-level
issue (and retrying the declined destructive call, which is refused as a replay), a read to check the
result, and the model's closing answer: the turn completes. Under `DEMO_LIMITS` (``--show-limit``) the
turn gets four model requests instead and ends at the step limit after that read, keeping what was approved.
Every card shows its whole input and a dry-run preview; with ``--approve safe`` the scripted reviewer
also approves one card with an edited input (`DEMO_EDITS`), and the model is told what it changed.
"""

from __future__ import annotations

from typing import Final

from trioloop.machine.limits import TurnLimits
from trioloop.providers.scripted import ScriptedCall, ScriptStep

__all__ = ["DEMO_COMPLETE_LIMITS", "DEMO_EDITS", "DEMO_LIMITS", "DEMO_PROMPT", "DEMO_SCRIPT"]

DEMO_PROMPT: Final = "Review the payment platform model: add what is missing around the card vault and admin access."

#: Four iterations at most, so the scripted fourth request ends the turn at the step limit (``--show-limit``).
DEMO_LIMITS: Final = TurnLimits(max_iterations=4)

DEMO_SCRIPT: Final = (
    ScriptStep(
        text="I'll start by reading the model: the summary, then the data stores.",
        tool_calls=(
            ScriptedCall(id="toolu_01", name="get_document_summary", input={}),
            ScriptedCall(id="toolu_02", name="search_entities", input={"kind": "elements", "text": "vault"}),
        ),
        chunk_size=24,
    ),
    ScriptStep(
        text=(
            "The card vault has no threat for key exfiltration, the admin console reaches the payment "
            "service without MFA noted, and flow-10 duplicates the queue fan-out. I propose these edits."
        ),
        tool_calls=(
            ScriptedCall(
                id="toolu_03",
                name="add_threat",
                input={
                    "threat": {
                        "title": "Card vault encryption keys exfiltrated",
                        "category": "Information Disclosure",
                        "severity": "critical",
                        "element": "card-vault",
                        "description": "A compromised payment service host reads the vault's data keys.",
                        "mitigation": {"status": "not_started", "description": "Move data keys into an HSM."},
                    }
                },
            ),
            ScriptedCall(
                id="toolu_04",
                name="update_element",
                input={"id": "admin-console", "updates": {"description": "Back-office tool; SSO with MFA required."}},
            ),
            ScriptedCall(id="toolu_05", name="delete_data_flow", input={"id": "flow-10"}),
            ScriptedCall(id="toolu_06", name="add_element", input={"element": {"type": "process"}}),
        ),
        chunk_size=32,
    ),
    ScriptStep(
        text="My add_element call was missing its name; here it is corrected. I'll also retry the flow removal.",
        tool_calls=(
            ScriptedCall(
                id="toolu_07",
                name="add_element",
                input={
                    "element": {
                        "type": "process",
                        "name": "Key management service",
                        "trust_zone": "pci",
                        "technologies": ["HSM"],
                    }
                },
            ),
            ScriptedCall(id="toolu_08", name="delete_data_flow", input={"id": "flow-10"}),
        ),
        chunk_size=32,
    ),
    ScriptStep(
        text="Let me re-read the summary to confirm the counts.",
        tool_calls=(ScriptedCall(id="toolu_09", name="get_document_summary", input={}),),
    ),
    ScriptStep(
        text=(
            "That is my review: the card vault's key exfiltration threat, the admin console's access rule and the "
            "key management service, as far as you approved them. The diff below shows what changed."
        ),
        chunk_size=32,
    ),
)

#: One model request per scripted answer: the turn completes with the model's closing answer.
DEMO_COMPLETE_LIMITS: Final = TurnLimits(max_iterations=len(DEMO_SCRIPT))

#: The scripted reviewer's edit (``--approve safe``): the admin console's description, made stricter
#: before it is approved. The model's own call asked for SSO with MFA only.
DEMO_EDITS: Final = {
    "toolu_04": {
        "id": "admin-console",
        "updates": {"description": "Back-office tool; SSO with MFA and an IP allow-list required."},
    },
}
