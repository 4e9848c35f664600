"""The metric instruments: the two ``gen_ai.client.*`` histograms, the review wait, the call and cost counters, with
their units, descriptions and bucket advice, made once per meter provider (and once for the global one).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Final

from opentelemetry import metrics

from trioloop import __version__
from trioloop.otel.conventions import _SCOPE

#: Bucket boundaries the GenAI conventions give for the two ``gen_ai.client.*`` histograms.
_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_SECONDS_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_REVIEW_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0)


class _Instruments:
    """The metric instruments, made once per meter provider."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.tokens = _histogram(meter, "gen_ai.client.token.usage", "{token}", _TOKEN_BUCKETS)
        self.duration = _histogram(meter, "gen_ai.client.operation.duration", "s", _SECONDS_BUCKETS)
        self.review = _histogram(meter, "trioloop.review.duration", "s", _REVIEW_BUCKETS)
        self.calls = meter.create_counter(
            "trioloop.calls", unit="{call}", description="Tool calls the model opened, by the status they ended in."
        )
        self.cost = meter.create_counter(
            "trioloop.cost",
            unit="USD",
            description="What settled turns' tokens cost at their model's price (turns whose price is known).",
        )


_DESCRIPTIONS: Final = {
    "gen_ai.client.token.usage": "Number of input and output tokens used.",
    "gen_ai.client.operation.duration": "GenAI operation duration.",
    "trioloop.review.duration": "How long a turn waited for the person to decide its review.",
}


def _histogram(meter: metrics.Meter, name: str, unit: str, buckets: Sequence[float]) -> metrics.Histogram:
    description = _DESCRIPTIONS[name]
    try:
        return meter.create_histogram(name, unit, description, explicit_bucket_boundaries_advisory=buckets)
    except TypeError:  # opentelemetry-api before 1.30 takes no advice: the SDK's (or the view's) buckets apply
        return meter.create_histogram(name, unit, description)


_GLOBAL_INSTRUMENTS: list[_Instruments] = []
_INSTRUMENTS: weakref.WeakKeyDictionary[metrics.MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _instruments(meter_provider: metrics.MeterProvider | None) -> _Instruments:
    if meter_provider is None:
        if not _GLOBAL_INSTRUMENTS:  # the global provider's proxy meter follows a provider set later
            _GLOBAL_INSTRUMENTS.append(_Instruments(metrics.get_meter(_SCOPE, __version__)))
        return _GLOBAL_INSTRUMENTS[0]
    made = _INSTRUMENTS.get(meter_provider)
    if made is None:
        made = _INSTRUMENTS[meter_provider] = _Instruments(metrics.get_meter(_SCOPE, __version__, meter_provider))
    return made
