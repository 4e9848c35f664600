"""Review a scripted turn over ``examples/payment.thf`` in a Qt window.

Trio runs as a guest of the Qt event loop; the scripted model is served over a real loopback HTTP
connection, so the panel exercises the same code a real provider goes through. Needs the extra:
``pip install 'trioloop[qt]'``, then ``python examples/qt_review.py``. Press Send, review the cards,
then try Stop and Undo turn.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

from trioloop.providers.scripted import ScriptedProvider
from trioloop.threatmodel import load_thf, threat_model_session
from trioloop.threatmodel.demo import DEMO_LIMITS, DEMO_PROMPT, DEMO_SCRIPT
from trioloop.ui.qt import ReviewPanel, run_trio_guest

DOCUMENT = Path(__file__).with_name("payment.thf")


async def review() -> None:
    async with (
        ScriptedProvider(DEMO_SCRIPT) as provider,
        threat_model_session(
            document=load_thf(DOCUMENT), provider=provider, model="scripted-1", limits=DEMO_LIMITS
        ) as session,
    ):
        panel = ReviewPanel(session)
        panel.prompt_input.setText(DEMO_PROMPT)
        panel.resize(760, 820)
        panel.show()
        await panel.serve()


def main() -> int:
    app = QApplication(sys.argv)
    run_trio_guest(review, app=app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
