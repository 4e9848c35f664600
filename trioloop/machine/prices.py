"""What tokens cost: a model's price per million tokens, the cost of a `Usage` at that price, and a dated table.

Money is `Decimal` from end to end (never a float), so a cost bound compares exactly and a journal reads back the
very figure it wrote. ``input_tokens`` in a `Usage` counts the cache reads and writes too (as providers report
them); the cost prices each part at its own rate: uncached input, cache reads, cache writes, output (reasoning
included). The table is data, looked up by model id; an app passes its own entries to override or extend it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Final, final

import attrs

from trioloop.protocol.events import Usage

__all__ = [
    "PRICE_TABLE",
    "PRICE_TABLE_SOURCE",
    "ModelPrice",
    "lookup_price",
    "price_table",
    "request_cost",
    "usage_cost",
]

_MILLION: Final = Decimal(1_000_000)


def _rate(instance: object, attribute: attrs.Attribute[Decimal], value: object) -> None:
    # A float is refused: 0.1 is not a tenth, and a price read back from a journal must be the one written.
    if type(value) is not Decimal:
        raise TypeError(f'Price "{attribute.name}" must be a Decimal (USD per million tokens), received {value!r}.')
    if not value.is_finite() or value < 0:
        raise ValueError(f'Price "{attribute.name}" must be a finite, non-negative Decimal, received {value!r}.')


def _optional_rate(instance: object, attribute: attrs.Attribute[Decimal | None], value: object) -> None:
    if value is not None:
        _rate(instance, attribute, value)  # type: ignore[arg-type]


@final
@attrs.frozen(kw_only=True)
class ModelPrice:
    """One model's price in USD per million tokens, and where the figures came from.

    A cache rate left None is the input rate (a provider that has no separate cache price). ``source`` is
    said in a cost bound's notice (``"trioloop price table, 2026-11"``, ``"app"``).
    """

    input_per_mtok: Decimal = attrs.field(validator=_rate)
    output_per_mtok: Decimal = attrs.field(validator=_rate)
    cache_read_per_mtok: Decimal | None = attrs.field(default=None, validator=_optional_rate)
    cache_write_per_mtok: Decimal | None = attrs.field(default=None, validator=_optional_rate)
    source: str = attrs.field(default="app", validator=attrs.validators.instance_of(str))


def usage_cost(usage: Usage, price: ModelPrice) -> Decimal:
    """What ``usage`` costs at ``price``, in USD (exact: no rounding)."""
    cached_read, cached_write = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
    uncached = max(usage.input_tokens - cached_read - cached_write, 0)
    read_rate = price.input_per_mtok if price.cache_read_per_mtok is None else price.cache_read_per_mtok
    write_rate = price.input_per_mtok if price.cache_write_per_mtok is None else price.cache_write_per_mtok
    total = (
        uncached * price.input_per_mtok
        + cached_read * read_rate
        + cached_write * write_rate
        + usage.output_tokens * price.output_per_mtok
    )
    return total / _MILLION


def request_cost(input_tokens: int, output_tokens: int, price: ModelPrice) -> Decimal:
    """The most a request of ``input_tokens`` in (none of them cached) and ``output_tokens`` out may cost."""
    return (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / _MILLION


def price_table(entries: Iterable[tuple[str, ModelPrice]]) -> Mapping[str, ModelPrice]:
    """A read-only table keyed by model id; a later entry with the same id replaces an earlier one."""
    return MappingProxyType(dict(entries))


#: Where the built-in figures come from: the providers' public pricing pages as genai-prices 0.2.5 (November
#: 2026) records them (anthropic.com/pricing, openai.com/api/pricing); standard tier, no batch discount.
PRICE_TABLE_SOURCE: Final = "trioloop price table, 2026-11"


def _family(
    ids: tuple[str, ...], inp: str, out: str, read: str, write: str | None = None
) -> list[tuple[str, ModelPrice]]:
    price = ModelPrice(
        input_per_mtok=Decimal(inp),
        output_per_mtok=Decimal(out),
        cache_read_per_mtok=Decimal(read),
        cache_write_per_mtok=None if write is None else Decimal(write),
        source=PRICE_TABLE_SOURCE,
    )
    return [(model_id, price) for model_id in ids]


#: The models of trioloop's model table (`trioloop.protocol.preflight.MODEL_TABLE`), by id. OpenAI has no
#: separate cache-write price (writes are billed as input).
PRICE_TABLE: Final[Mapping[str, ModelPrice]] = price_table(
    [
        *_family(("claude-opus-4-6", "claude-opus-4-5", "claude-opus-4-5-20251101"), "5", "25", "0.5", "6.25"),
        *_family(
            ("claude-opus-4-1", "claude-opus-4-1-20250805", "claude-opus-4-0", "claude-opus-4-20250514"),
            "15",
            "75",
            "1.5",
            "18.75",
        ),
        *_family(
            (
                "claude-sonnet-4-6",
                "claude-sonnet-4-5",
                "claude-sonnet-4-5-20250929",
                "claude-sonnet-4-0",
                "claude-sonnet-4-20250514",
                "claude-3-7-sonnet-latest",
                "claude-3-7-sonnet-20250219",
            ),
            "3",
            "15",
            "0.3",
            "3.75",
        ),
        *_family(("claude-haiku-4-5", "claude-haiku-4-5-20251001"), "1", "5", "0.1", "1.25"),
        *_family(("claude-3-5-haiku-latest", "claude-3-5-haiku-20241022"), "0.8", "4", "0.08", "1"),
        *_family(("gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"), "2.5", "10", "1.25"),
        *_family(("gpt-4o-mini", "gpt-4o-mini-2024-07-18"), "0.15", "0.6", "0.075"),
        *_family(("gpt-4.1", "gpt-4.1-2025-04-14", "o3", "o3-2025-04-16"), "2", "8", "0.5"),
        *_family(("gpt-4.1-mini", "gpt-4.1-mini-2025-04-14"), "0.4", "1.6", "0.1"),
        *_family(("gpt-4.1-nano", "gpt-4.1-nano-2025-04-14"), "0.1", "0.4", "0.025"),
        *_family(("gpt-5", "gpt-5-2025-08-07", "gpt-5.1", "gpt-5.1-2025-11-13"), "1.25", "10", "0.125"),
        *_family(("gpt-5-mini", "gpt-5-mini-2025-08-07"), "0.25", "2", "0.025"),
        *_family(("gpt-5-nano", "gpt-5-nano-2025-08-07"), "0.05", "0.4", "0.005"),
        *_family(("o4-mini", "o4-mini-2025-04-16"), "1.1", "4.4", "0.275"),
        *_family(("o3-mini", "o3-mini-2025-01-31", "o1-mini", "o1-mini-2024-09-12"), "1.1", "4.4", "0.55"),
        *_family(("o1",), "15", "60", "7.5"),
    ]
)


def lookup_price(
    model: str, *, overrides: Mapping[str, ModelPrice] | None = None, table: Mapping[str, ModelPrice] = PRICE_TABLE
) -> ModelPrice | None:
    """``model``'s price: the app's override first, then the table; None when neither knows it (exact ids only)."""
    if overrides is not None and model in overrides:
        return overrides[model]
    return table.get(model)
