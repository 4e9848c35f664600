import re
import typing

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.threatmodel.catalog import (
    CATALOG,
    CatalogEntry,
    CatalogVariant,
    CategoryName,
    ComponentCategory,
    ComponentProvider,
    ProviderName,
    _build_index,
    normalize_component_key,
    resolve_component,
    search_catalog,
)

# Ids are permanent: once shipped, an id may be deprecated but never removed or renamed. Append here only.
PINNED_IDS = frozenset(
    [
        "web_server",
        "api_service",
        "microservice",
        "serverless_function",
        "container_service",
        "kubernetes_cluster",
        "virtual_machine",
        "background_worker",
        "scheduled_job",
        "batch_processing",
        "ml_inference_service",
        "ai_agent",
        "aws_elastic_beanstalk",
        "azure_app_service",
        "gcp_app_engine",
        "aws_amplify",
        "azure_static_web_apps",
        "gcp_firebase",
        "relational_database",
        "document_database",
        "key_value_store",
        "cache",
        "object_storage",
        "file_storage",
        "data_warehouse",
        "data_lake",
        "search_index",
        "graph_database",
        "time_series_database",
        "vector_database",
        "backup_storage",
        "load_balancer",
        "api_gateway",
        "cdn",
        "dns",
        "reverse_proxy",
        "virtual_network",
        "vpn_gateway",
        "nat_gateway",
        "service_mesh",
        "private_endpoint",
        "identity_provider",
        "authorization_server",
        "directory_service",
        "access_management",
        "session_store",
        "secrets_manager",
        "key_management_service",
        "certificate_authority",
        "firewall",
        "web_application_firewall",
        "bastion_host",
        "siem",
        "aws_shield",
        "azure_ddos_protection",
        "gcp_apigee",
        "message_queue",
        "pub_sub_topic",
        "event_stream",
        "event_bus",
        "workflow_orchestrator",
        "email_service",
        "push_notification_service",
        "web_browser",
        "single_page_app",
        "mobile_app",
        "desktop_app",
        "cli_tool",
        "iot_device",
        "end_user",
        "administrator",
        "third_party_api",
        "payment_processor",
        "email_delivery_provider",
        "sms_gateway",
        "source_control",
        "ci_cd_pipeline",
        "artifact_registry",
        "llm_api",
        "analytics_service",
        "crm_system",
        "error_tracking",
        "log_aggregation",
        "metrics_monitoring",
        "distributed_tracing",
        "audit_log",
        "process",
        "data_store",
        "external_entity",
    ]
)

IDS = [entry.id for entry in CATALOG]
BY_ID = {entry.id: entry for entry in CATALOG}


def test_catalog_is_large_and_covers_the_categories_and_providers() -> None:
    assert len(CATALOG) >= 60
    assert {entry.category for entry in CATALOG} >= {
        ComponentCategory.COMPUTE,
        ComponentCategory.DATA,
        ComponentCategory.NETWORK,
        ComponentCategory.IDENTITY,
        ComponentCategory.MESSAGING,
        ComponentCategory.CLIENT,
        ComponentCategory.EXTERNAL_SAAS,
    }
    assert {entry.provider for entry in CATALOG} == set(ComponentProvider)
    offered = {variant.provider for entry in CATALOG for variant in entry.variants}
    assert offered == {ComponentProvider.AWS, ComponentProvider.AZURE, ComponentProvider.GCP}


def test_ids_are_unique_snake_case_and_permanent() -> None:
    assert len(IDS) == len(set(IDS))
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", entry_id) for entry_id in IDS)
    assert set(IDS) >= PINNED_IDS, f"removed ids: {sorted(PINNED_IDS - set(IDS))}"


def test_every_entry_is_fully_described() -> None:
    for entry in CATALOG:
        assert entry.label and entry.keywords, entry.id
        assert entry.stride_role in ("process", "data_store", "external_entity")
        assert all(isinstance(v, CatalogVariant) and v.provider != ComponentProvider.GENERIC for v in entry.variants)


def test_deprecated_entries_point_at_an_active_replacement() -> None:
    deprecated = [entry for entry in CATALOG if entry.deprecated]
    assert {entry.id for entry in deprecated} == {"process", "data_store", "external_entity"}
    for entry in CATALOG:
        if entry.deprecated:
            assert entry.replaced_by is not None and not BY_ID[entry.replaced_by].deprecated
        else:
            assert entry.replaced_by is None


def test_names_are_unambiguous_across_ids_variants_and_aliases() -> None:
    keys: list[str] = []
    for entry in CATALOG:
        keys += [entry.id, *entry.aliases]
        for variant in entry.variants:
            keys += [variant.id, *variant.aliases]
    normalized = [normalize_component_key(key) for key in keys]
    assert len(normalized) == len(set(normalized))


def test_a_name_collision_is_refused_when_the_index_is_built() -> None:
    clash = attrs.evolve(BY_ID["cache"], id="cache_two", aliases=("Redis",))
    with pytest.raises(ValueError, match="'Redis' is claimed by 'cache' and 'cache_two'"):
        _build_index((BY_ID["cache"], clash))


def test_entries_are_frozen() -> None:
    entry = CATALOG[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        entry.id = "renamed"  # type: ignore[misc]
    assert isinstance(entry.aliases, tuple) and isinstance(entry.variants, tuple)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("relational_database", "relational_database"),
        ("Postgres", "relational_database"),
        ("  postgreSQL ", "relational_database"),
        ("aws_rds", "relational_database"),
        ("RDS", "relational_database"),
        ("Web-Server", "web_server"),
        ("web server", "web_server"),
        ("k8s", "kubernetes_cluster"),
        ("Entra ID", "identity_provider"),
        ("process", "process"),
    ],
)
def test_resolve_by_id_alias_or_variant(name: str, expected: str) -> None:
    entry = resolve_component(name)
    assert entry is not None and entry.id == expected


@pytest.mark.parametrize("name", ["", "nope", "relational database server", "web_server\u200b"])
def test_resolve_unknown_is_none(name: str) -> None:
    assert resolve_component(name) is None


def test_resolution_returns_the_entry_and_leaves_the_caller_string_alone() -> None:
    name = "Postgres"
    entry = resolve_component(name)
    assert isinstance(entry, CatalogEntry) and name == "Postgres" and entry.id != name


def test_blank_query_lists_active_entries_in_declaration_order() -> None:
    active = tuple(entry for entry in CATALOG if not entry.deprecated)
    assert search_catalog() == active
    assert search_catalog("   ") == active
    assert search_catalog(include_deprecated=True) == CATALOG


def test_query_words_must_all_match_case_insensitively() -> None:
    ids = [entry.id for entry in search_catalog("AWS Database")]
    assert ids[0] == "relational_database"
    assert {"document_database", "graph_database"} <= set(ids)
    assert "cache" not in ids
    assert [entry.id for entry in search_catalog("redis")] == ["cache"]


def test_category_and_provider_filters() -> None:
    data = search_catalog(category="data")
    assert data and all(entry.category is ComponentCategory.DATA for entry in data)
    gcp = search_catalog(provider=ComponentProvider.GCP)
    assert BY_ID["gcp_app_engine"] in gcp and BY_ID["relational_database"] in gcp
    assert BY_ID["aws_elastic_beanstalk"] not in gcp and BY_ID["web_server"] not in gcp
    generic_only = search_catalog(provider="generic")
    assert all(entry.provider is ComponentProvider.GENERIC for entry in generic_only)
    assert search_catalog(provider="ibm") == ()
    assert search_catalog(category="nope") == ()


def test_deprecated_entries_only_when_asked() -> None:
    assert BY_ID["process"] not in search_catalog("process")
    assert BY_ID["process"] in search_catalog("process", include_deprecated=True)


@settings(max_examples=150, deadline=None)
@given(
    st.text(max_size=20) | st.sampled_from(["aws", "db", "queue", "azure sql", "IDENTITY", "gcp storage"]),
    st.none() | st.sampled_from([c.value for c in ComponentCategory]),
    st.none() | st.sampled_from([p.value for p in ComponentProvider]),
    st.booleans(),
)
def test_search_results_are_a_subsequence_of_the_catalog(
    query: str, category: str | None, provider: str | None, include_deprecated: bool
) -> None:
    results = search_catalog(query, category, provider, include_deprecated)
    positions = [IDS.index(entry.id) for entry in results]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for entry in results:
        assert include_deprecated or not entry.deprecated
        assert category is None or entry.category == category
        assert provider is None or entry.provider == provider or any(v.provider == provider for v in entry.variants)


def test_literal_names_match_the_enums() -> None:
    assert typing.get_args(CategoryName) == tuple(c.value for c in ComponentCategory)
    assert typing.get_args(ProviderName) == tuple(p.value for p in ComponentProvider)
