"""OpenTelemetry traces and metrics for every turn, derived from the states a session publishes.

`OtelObserver` is a `TurnObserver`: it reads nothing but the `TurnState`s a `Session` publishes, in order,
and compares each with the one before. A turn becomes one ``invoke_agent`` span; under it, one ``chat
{model}`` span per model request (from the phase entering ``requesting`` until the response ends), one
``await_review`` span per review wait and one ``execute_tool {tool}`` span per call, named and attributed
after the OpenTelemetry GenAI semantic conventions (``gen_ai.*``; trioloop's own facts under
``trioloop.*``). Timestamps are taken when a state is published, so a span opened at one publication and
ended at a later one lasts as long as that took. Content (prompts, completions, tool input and results,
the reviewer's words) is recorded only with ``capture_content=True``; no key is ever read.

Needs the OpenTelemetry API (``pip install "trioloop[otel]"``); the app configures the SDK and exporter. A
turn that begins with neither a tracer nor a meter provider configured (the API's no-op default) is followed
by its id alone, so the observer then costs next to nothing.
"""

from __future__ import annotations

try:  # before the modules that use it, only to turn a missing API into a message that says what to install
    from opentelemetry import metrics, trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_otel.py
    raise ImportError(
        'trioloop.otel needs the OpenTelemetry API, which is not installed: pip install "trioloop[otel]"'
    ) from exc

from trioloop.otel.conventions import TurnEnd as TurnEnd
from trioloop.otel.conventions import gen_ai_provider_name
from trioloop.otel.instruments import _Instruments as _Instruments  # tests/test_otel.py makes them on a stand-in
from trioloop.otel.observer import OtelObserver, instrument

__all__ = ["OtelObserver", "gen_ai_provider_name", "instrument"]
