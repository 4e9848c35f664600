"""The component catalog: the kinds of thing an element can be, each under a permanent id.

An element's `type` is normally a catalog id. Ids never change once shipped (an entry is deprecated and
points at its replacement instead), aliases and variant ids only help find an entry, and resolving one
never rewrites a document: the element keeps whatever type it was written with. The module is long
because it is mostly the entries themselves.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

import attrs

__all__ = [
    "CATALOG",
    "CATEGORY_LABELS",
    "PROVIDER_LABELS",
    "CatalogEntry",
    "CatalogVariant",
    "CategoryName",
    "ComponentCategory",
    "ComponentProvider",
    "ProviderName",
    "StrideRole",
    "normalize_component_key",
    "resolve_component",
    "search_catalog",
]


class ComponentCategory(enum.StrEnum):
    COMPUTE = "compute"
    DATA = "data"
    NETWORK = "network"
    IDENTITY = "identity"
    SECURITY = "security"
    MESSAGING = "messaging"
    CLIENT = "client"
    EXTERNAL_SAAS = "external_saas"
    OBSERVABILITY = "observability"


class ComponentProvider(enum.StrEnum):
    GENERIC = "generic"
    AWS = "aws"
    AZURE = "azure"
    GCP = "gcp"


#: The enum values as Literal types, for tool inputs (equal to the enums' values; a test checks).
CategoryName: TypeAlias = Literal[
    "compute", "data", "network", "identity", "security", "messaging", "client", "external_saas", "observability"
]
ProviderName: TypeAlias = Literal["generic", "aws", "azure", "gcp"]

#: The data-flow-diagram role an entry plays, which decides the STRIDE categories that apply to it.
StrideRole: TypeAlias = Literal["process", "data_store", "external_entity"]

CATEGORY_LABELS: Final[Mapping[ComponentCategory, str]] = MappingProxyType(
    {
        ComponentCategory.COMPUTE: "Compute",
        ComponentCategory.DATA: "Data",
        ComponentCategory.NETWORK: "Network",
        ComponentCategory.IDENTITY: "Identity",
        ComponentCategory.SECURITY: "Security",
        ComponentCategory.MESSAGING: "Messaging",
        ComponentCategory.CLIENT: "Client",
        ComponentCategory.EXTERNAL_SAAS: "External SaaS",
        ComponentCategory.OBSERVABILITY: "Observability",
    }
)

PROVIDER_LABELS: Final[Mapping[ComponentProvider, str]] = MappingProxyType(
    {
        ComponentProvider.GENERIC: "Generic",
        ComponentProvider.AWS: "Amazon Web Services",
        ComponentProvider.AZURE: "Microsoft Azure",
        ComponentProvider.GCP: "Google Cloud",
    }
)


def _tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _variants(values: Iterable[CatalogVariant]) -> tuple[CatalogVariant, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class CatalogVariant:
    """A provider's product for a generic entry (e.g. Amazon RDS for a relational database)."""

    id: str
    label: str
    provider: ComponentProvider
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple)


@attrs.frozen(kw_only=True)
class CatalogEntry:
    """One kind of component. `id` is permanent; a deprecated entry names its `replaced_by`."""

    id: str
    label: str
    category: ComponentCategory
    provider: ComponentProvider
    stride_role: StrideRole
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    keywords: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    variants: tuple[CatalogVariant, ...] = attrs.field(default=(), converter=_variants)
    deprecated: bool = False
    replaced_by: str | None = None


_G = ComponentProvider.GENERIC
_AWS = ComponentProvider.AWS
_AZ = ComponentProvider.AZURE
_GCP = ComponentProvider.GCP
_COMPUTE = ComponentCategory.COMPUTE
_DATA = ComponentCategory.DATA
_NET = ComponentCategory.NETWORK
_ID = ComponentCategory.IDENTITY
_SEC = ComponentCategory.SECURITY
_MSG = ComponentCategory.MESSAGING
_CLIENT = ComponentCategory.CLIENT
_SAAS = ComponentCategory.EXTERNAL_SAAS
_OBS = ComponentCategory.OBSERVABILITY


def _v(id: str, label: str, provider: ComponentProvider, *aliases: str) -> CatalogVariant:
    return CatalogVariant(id=id, label=label, provider=provider, aliases=aliases)


def _e(
    id: str,
    label: str,
    category: ComponentCategory,
    role: StrideRole,
    *,
    provider: ComponentProvider = _G,
    aliases: tuple[str, ...] = (),
    keywords: tuple[str, ...] = (),
    variants: tuple[CatalogVariant, ...] = (),
    replaced_by: str | None = None,
) -> CatalogEntry:
    return CatalogEntry(
        id=id,
        label=label,
        category=category,
        provider=provider,
        stride_role=role,
        aliases=aliases,
        keywords=keywords,
        variants=variants,
        deprecated=replaced_by is not None,
        replaced_by=replaced_by,
    )


#: Every entry, in declaration order (which is also search-result order). Append only; never reuse an id.
CATALOG: Final[tuple[CatalogEntry, ...]] = (
    # --- compute
    _e(
        "web_server",
        "Web Server",
        _COMPUTE,
        "process",
        aliases=("http server", "nginx", "apache httpd"),
        keywords=("http", "static", "frontend"),
    ),
    _e(
        "api_service",
        "API Service",
        _COMPUTE,
        "process",
        aliases=("backend", "rest api", "graphql api", "application server"),
        keywords=("http", "json", "service", "backend"),
    ),
    _e(
        "microservice",
        "Microservice",
        _COMPUTE,
        "process",
        aliases=("micro service",),
        keywords=("service", "distributed", "container"),
    ),
    _e(
        "serverless_function",
        "Serverless Function",
        _COMPUTE,
        "process",
        aliases=("faas", "cloud function"),
        keywords=("event", "function", "serverless"),
        variants=(
            _v("aws_lambda", "AWS Lambda", _AWS, "lambda"),
            _v("azure_functions", "Azure Functions", _AZ),
            _v("gcp_cloud_functions", "Google Cloud Functions", _GCP),
        ),
    ),
    _e(
        "container_service",
        "Container Service",
        _COMPUTE,
        "process",
        aliases=("container", "docker container"),
        keywords=("docker", "oci", "image"),
        variants=(
            _v("aws_ecs", "Amazon ECS", _AWS, "ecs", "fargate"),
            _v("azure_container_apps", "Azure Container Apps", _AZ),
            _v("gcp_cloud_run", "Google Cloud Run", _GCP, "cloud run"),
        ),
    ),
    _e(
        "kubernetes_cluster",
        "Kubernetes Cluster",
        _COMPUTE,
        "process",
        aliases=("kubernetes", "k8s"),
        keywords=("orchestration", "pod", "container", "cluster"),
        variants=(
            _v("aws_eks", "Amazon EKS", _AWS, "eks"),
            _v("azure_aks", "Azure Kubernetes Service", _AZ, "aks"),
            _v("gcp_gke", "Google Kubernetes Engine", _GCP, "gke"),
        ),
    ),
    _e(
        "virtual_machine",
        "Virtual Machine",
        _COMPUTE,
        "process",
        aliases=("vm", "server", "host"),
        keywords=("instance", "compute", "iaas"),
        variants=(
            _v("aws_ec2", "Amazon EC2", _AWS, "ec2"),
            _v("azure_virtual_machines", "Azure Virtual Machines", _AZ),
            _v("gcp_compute_engine", "Google Compute Engine", _GCP, "gce"),
        ),
    ),
    _e(
        "background_worker",
        "Background Worker",
        _COMPUTE,
        "process",
        aliases=("worker", "job runner"),
        keywords=("async", "queue consumer", "task"),
    ),
    _e(
        "scheduled_job",
        "Scheduled Job",
        _COMPUTE,
        "process",
        aliases=("cron job", "cron", "timer job"),
        keywords=("schedule", "batch", "periodic"),
    ),
    _e(
        "batch_processing",
        "Batch Processing",
        _COMPUTE,
        "process",
        aliases=("batch job", "etl job"),
        keywords=("etl", "pipeline", "spark"),
        variants=(
            _v("aws_batch", "AWS Batch", _AWS),
            _v("azure_batch", "Azure Batch", _AZ),
            _v("gcp_dataflow", "Google Cloud Dataflow", _GCP, "dataflow"),
        ),
    ),
    _e(
        "ml_inference_service",
        "ML Inference Service",
        _COMPUTE,
        "process",
        aliases=("model server", "ml model"),
        keywords=("machine learning", "inference", "ai", "model"),
        variants=(
            _v("aws_sagemaker", "Amazon SageMaker", _AWS, "sagemaker"),
            _v("azure_machine_learning", "Azure Machine Learning", _AZ),
            _v("gcp_vertex_ai", "Google Vertex AI", _GCP, "vertex ai"),
        ),
    ),
    _e(
        "ai_agent",
        "AI Agent",
        _COMPUTE,
        "process",
        aliases=("llm agent", "agent"),
        keywords=("llm", "tool use", "prompt injection", "ai"),
    ),
    _e(
        "aws_elastic_beanstalk",
        "AWS Elastic Beanstalk",
        _COMPUTE,
        "process",
        provider=_AWS,
        aliases=("elastic beanstalk", "beanstalk"),
        keywords=("paas", "web app"),
    ),
    _e(
        "azure_app_service",
        "Azure App Service",
        _COMPUTE,
        "process",
        provider=_AZ,
        aliases=("app service", "azure web app"),
        keywords=("paas", "web app"),
    ),
    _e(
        "gcp_app_engine",
        "Google App Engine",
        _COMPUTE,
        "process",
        provider=_GCP,
        aliases=("app engine", "gae"),
        keywords=("paas", "web app"),
    ),
    _e(
        "aws_amplify",
        "AWS Amplify",
        _COMPUTE,
        "process",
        provider=_AWS,
        aliases=("amplify",),
        keywords=("hosting", "frontend", "mobile backend"),
    ),
    _e(
        "azure_static_web_apps",
        "Azure Static Web Apps",
        _COMPUTE,
        "process",
        provider=_AZ,
        aliases=("static web apps",),
        keywords=("hosting", "frontend", "static"),
    ),
    _e(
        "gcp_firebase",
        "Firebase",
        _COMPUTE,
        "process",
        provider=_GCP,
        aliases=("firebase",),
        keywords=("hosting", "mobile backend", "realtime database", "authentication"),
    ),
    # --- data
    _e(
        "relational_database",
        "Relational Database",
        _DATA,
        "data_store",
        aliases=("sql database", "rdbms", "postgresql", "postgres", "mysql", "sql server"),
        keywords=("sql", "database", "tables", "transactions"),
        variants=(
            _v("aws_rds", "Amazon RDS", _AWS, "rds"),
            _v("aws_aurora", "Amazon Aurora", _AWS, "aurora"),
            _v("azure_sql_database", "Azure SQL Database", _AZ, "azure sql"),
            _v("gcp_cloud_sql", "Google Cloud SQL", _GCP, "cloud sql"),
        ),
    ),
    _e(
        "document_database",
        "Document Database",
        _DATA,
        "data_store",
        aliases=("nosql database", "mongodb", "document store"),
        keywords=("nosql", "json", "database"),
        variants=(
            _v("aws_documentdb", "Amazon DocumentDB", _AWS, "documentdb"),
            _v("azure_cosmos_db", "Azure Cosmos DB", _AZ, "cosmos db", "cosmosdb"),
            _v("gcp_firestore", "Google Firestore", _GCP, "firestore"),
        ),
    ),
    _e(
        "key_value_store",
        "Key-Value Store",
        _DATA,
        "data_store",
        aliases=("kv store", "wide column store"),
        keywords=("nosql", "key value", "database"),
        variants=(
            _v("aws_dynamodb", "Amazon DynamoDB", _AWS, "dynamodb"),
            _v("azure_table_storage", "Azure Table Storage", _AZ),
            _v("gcp_bigtable", "Google Bigtable", _GCP, "bigtable"),
        ),
    ),
    _e(
        "cache",
        "Cache",
        _DATA,
        "data_store",
        aliases=("redis", "memcached", "in-memory cache"),
        keywords=("cache", "session", "in memory"),
        variants=(
            _v("aws_elasticache", "Amazon ElastiCache", _AWS, "elasticache"),
            _v("azure_cache_for_redis", "Azure Cache for Redis", _AZ),
            _v("gcp_memorystore", "Google Memorystore", _GCP, "memorystore"),
        ),
    ),
    _e(
        "object_storage",
        "Object Storage",
        _DATA,
        "data_store",
        aliases=("blob storage", "bucket", "blob store"),
        keywords=("files", "objects", "storage", "upload"),
        variants=(
            _v("aws_s3", "Amazon S3", _AWS, "s3"),
            _v("azure_blob_storage", "Azure Blob Storage", _AZ),
            _v("gcp_cloud_storage", "Google Cloud Storage", _GCP, "gcs"),
        ),
    ),
    _e(
        "file_storage",
        "File Storage",
        _DATA,
        "data_store",
        aliases=("file share", "nfs", "network file system"),
        keywords=("files", "shared drive", "storage"),
        variants=(
            _v("aws_efs", "Amazon EFS", _AWS, "efs"),
            _v("azure_files", "Azure Files", _AZ),
            _v("gcp_filestore", "Google Filestore", _GCP, "filestore"),
        ),
    ),
    _e(
        "data_warehouse",
        "Data Warehouse",
        _DATA,
        "data_store",
        aliases=("warehouse", "olap"),
        keywords=("analytics", "reporting", "sql", "bi"),
        variants=(
            _v("aws_redshift", "Amazon Redshift", _AWS, "redshift"),
            _v("azure_synapse_analytics", "Azure Synapse Analytics", _AZ, "synapse"),
            _v("gcp_bigquery", "Google BigQuery", _GCP, "bigquery"),
        ),
    ),
    _e(
        "data_lake",
        "Data Lake",
        _DATA,
        "data_store",
        aliases=("lakehouse",),
        keywords=("analytics", "raw data", "parquet"),
        variants=(
            _v("aws_lake_formation", "AWS Lake Formation", _AWS),
            _v("azure_data_lake_storage", "Azure Data Lake Storage", _AZ, "adls"),
        ),
    ),
    _e(
        "search_index",
        "Search Index",
        _DATA,
        "data_store",
        aliases=("search engine", "elasticsearch", "opensearch", "full-text index"),
        keywords=("search", "index", "full text"),
        variants=(
            _v("aws_opensearch_service", "Amazon OpenSearch Service", _AWS),
            _v("azure_ai_search", "Azure AI Search", _AZ, "azure cognitive search"),
        ),
    ),
    _e(
        "graph_database",
        "Graph Database",
        _DATA,
        "data_store",
        aliases=("neo4j",),
        keywords=("graph", "nodes", "edges", "database"),
        variants=(_v("aws_neptune", "Amazon Neptune", _AWS, "neptune"),),
    ),
    _e(
        "time_series_database",
        "Time-Series Database",
        _DATA,
        "data_store",
        aliases=("tsdb", "influxdb", "timescaledb"),
        keywords=("metrics", "time series", "database"),
        variants=(_v("aws_timestream", "Amazon Timestream", _AWS, "timestream"),),
    ),
    _e(
        "vector_database",
        "Vector Database",
        _DATA,
        "data_store",
        aliases=("vector store", "embedding store"),
        keywords=("embeddings", "rag", "ai", "similarity search"),
    ),
    _e(
        "backup_storage",
        "Backup Storage",
        _DATA,
        "data_store",
        aliases=("backup", "backup vault", "snapshot store"),
        keywords=("recovery", "disaster recovery", "archive"),
        variants=(
            _v("aws_backup", "AWS Backup", _AWS),
            _v("azure_backup", "Azure Backup", _AZ),
            _v("gcp_backup_and_dr", "Google Backup and DR", _GCP),
        ),
    ),
    # --- network
    _e(
        "load_balancer",
        "Load Balancer",
        _NET,
        "process",
        aliases=("lb", "alb", "nlb"),
        keywords=("traffic", "tls termination", "ingress"),
        variants=(
            _v("aws_elastic_load_balancing", "Elastic Load Balancing", _AWS, "elb"),
            _v("azure_load_balancer", "Azure Load Balancer", _AZ),
            _v("azure_application_gateway", "Azure Application Gateway", _AZ),
            _v("gcp_cloud_load_balancing", "Google Cloud Load Balancing", _GCP),
        ),
    ),
    _e(
        "api_gateway",
        "API Gateway",
        _NET,
        "process",
        aliases=("gateway", "api management"),
        keywords=("routing", "rate limiting", "authentication", "ingress"),
        variants=(
            _v("aws_api_gateway", "Amazon API Gateway", _AWS),
            _v("azure_api_management", "Azure API Management", _AZ, "apim"),
            _v("gcp_api_gateway", "Google API Gateway", _GCP),
        ),
    ),
    _e(
        "cdn",
        "Content Delivery Network",
        _NET,
        "process",
        aliases=("content delivery network", "edge cache"),
        keywords=("edge", "static", "cache", "tls"),
        variants=(
            _v("aws_cloudfront", "Amazon CloudFront", _AWS, "cloudfront"),
            _v("azure_front_door", "Azure Front Door", _AZ, "front door"),
            _v("gcp_cloud_cdn", "Google Cloud CDN", _GCP),
        ),
    ),
    _e(
        "dns",
        "DNS",
        _NET,
        "process",
        aliases=("domain name system", "name server"),
        keywords=("domain", "resolution", "records"),
        variants=(
            _v("aws_route_53", "Amazon Route 53", _AWS, "route 53", "route53"),
            _v("azure_dns", "Azure DNS", _AZ),
            _v("gcp_cloud_dns", "Google Cloud DNS", _GCP),
        ),
    ),
    _e(
        "reverse_proxy",
        "Reverse Proxy",
        _NET,
        "process",
        aliases=("proxy", "envoy", "haproxy", "traefik"),
        keywords=("routing", "tls termination", "ingress"),
    ),
    _e(
        "virtual_network",
        "Virtual Network",
        _NET,
        "process",
        aliases=("vpc", "vnet", "private network"),
        keywords=("subnet", "network isolation", "segmentation"),
        variants=(
            _v("aws_vpc", "Amazon VPC", _AWS),
            _v("azure_virtual_network", "Azure Virtual Network", _AZ),
            _v("gcp_vpc_network", "Google VPC Network", _GCP),
        ),
    ),
    _e(
        "vpn_gateway",
        "VPN Gateway",
        _NET,
        "process",
        aliases=("vpn", "site-to-site vpn"),
        keywords=("tunnel", "ipsec", "remote access"),
        variants=(
            _v("aws_site_to_site_vpn", "AWS Site-to-Site VPN", _AWS),
            _v("azure_vpn_gateway", "Azure VPN Gateway", _AZ),
            _v("gcp_cloud_vpn", "Google Cloud VPN", _GCP),
        ),
    ),
    _e(
        "nat_gateway",
        "NAT Gateway",
        _NET,
        "process",
        aliases=("nat",),
        keywords=("egress", "outbound", "address translation"),
    ),
    _e(
        "service_mesh",
        "Service Mesh",
        _NET,
        "process",
        aliases=("istio", "linkerd", "sidecar proxy"),
        keywords=("mtls", "east-west", "traffic policy"),
    ),
    _e(
        "private_endpoint",
        "Private Endpoint",
        _NET,
        "process",
        aliases=("private link", "vpc endpoint"),
        keywords=("private connectivity", "no internet"),
        variants=(
            _v("aws_privatelink", "AWS PrivateLink", _AWS, "privatelink"),
            _v("azure_private_link", "Azure Private Link", _AZ),
            _v("gcp_private_service_connect", "Google Private Service Connect", _GCP),
        ),
    ),
    # --- identity
    _e(
        "identity_provider",
        "Identity Provider",
        _ID,
        "process",
        aliases=("idp", "sso", "oidc provider", "saml idp", "okta", "auth0"),
        keywords=("login", "authentication", "oauth", "openid connect", "federation"),
        variants=(
            _v("aws_cognito", "Amazon Cognito", _AWS, "cognito"),
            _v("azure_entra_id", "Microsoft Entra ID", _AZ, "entra id", "azure ad", "azure active directory"),
            _v("gcp_identity_platform", "Google Identity Platform", _GCP),
        ),
    ),
    _e(
        "authorization_server",
        "Authorization Server",
        _ID,
        "process",
        aliases=("oauth server", "token service", "sts"),
        keywords=("tokens", "jwt", "oauth", "scopes"),
    ),
    _e(
        "directory_service",
        "Directory Service",
        _ID,
        "data_store",
        aliases=("ldap", "active directory", "user directory"),
        keywords=("users", "groups", "accounts"),
        variants=(
            _v("aws_directory_service", "AWS Directory Service", _AWS),
            _v("azure_ad_domain_services", "Microsoft Entra Domain Services", _AZ),
        ),
    ),
    _e(
        "access_management",
        "Access Management",
        _ID,
        "process",
        aliases=("iam", "rbac", "policy engine"),
        keywords=("permissions", "roles", "least privilege", "authorization"),
        variants=(
            _v("aws_iam", "AWS IAM", _AWS),
            _v("azure_rbac", "Azure RBAC", _AZ),
            _v("gcp_iam", "Google Cloud IAM", _GCP),
        ),
    ),
    _e(
        "session_store",
        "Session Store",
        _ID,
        "data_store",
        aliases=("session cache",),
        keywords=("sessions", "cookies", "tokens"),
    ),
    # --- security
    _e(
        "secrets_manager",
        "Secrets Manager",
        _SEC,
        "data_store",
        aliases=("secret store", "vault", "hashicorp vault"),
        keywords=("credentials", "api keys", "passwords", "rotation"),
        variants=(
            _v("aws_secrets_manager", "AWS Secrets Manager", _AWS),
            _v("azure_key_vault", "Azure Key Vault", _AZ, "key vault"),
            _v("gcp_secret_manager", "Google Secret Manager", _GCP),
        ),
    ),
    _e(
        "key_management_service",
        "Key Management Service",
        _SEC,
        "process",
        aliases=("kms", "hsm", "hardware security module"),
        keywords=("encryption", "keys", "signing"),
        variants=(
            _v("aws_kms", "AWS KMS", _AWS),
            _v("azure_managed_hsm", "Azure Managed HSM", _AZ),
            _v("gcp_cloud_kms", "Google Cloud KMS", _GCP),
        ),
    ),
    _e(
        "certificate_authority",
        "Certificate Authority",
        _SEC,
        "process",
        aliases=("ca", "pki"),
        keywords=("certificates", "tls", "x509"),
        variants=(
            _v("aws_private_ca", "AWS Private CA", _AWS),
            _v("gcp_certificate_authority_service", "Google Certificate Authority Service", _GCP),
        ),
    ),
    _e(
        "firewall",
        "Firewall",
        _SEC,
        "process",
        aliases=("network firewall", "security group"),
        keywords=("filtering", "network", "ports", "rules"),
        variants=(
            _v("aws_network_firewall", "AWS Network Firewall", _AWS),
            _v("azure_firewall", "Azure Firewall", _AZ),
            _v("gcp_cloud_firewall", "Google Cloud Firewall", _GCP),
        ),
    ),
    _e(
        "web_application_firewall",
        "Web Application Firewall",
        _SEC,
        "process",
        aliases=("waf",),
        keywords=("owasp", "filtering", "http", "bot protection"),
        variants=(
            _v("aws_waf", "AWS WAF", _AWS),
            _v("azure_web_application_firewall", "Azure Web Application Firewall", _AZ),
            _v("gcp_cloud_armor", "Google Cloud Armor", _GCP, "cloud armor"),
        ),
    ),
    _e(
        "bastion_host",
        "Bastion Host",
        _SEC,
        "process",
        aliases=("jump host", "jump box"),
        keywords=("ssh", "admin access", "remote access"),
        variants=(
            _v("aws_systems_manager_session_manager", "AWS Systems Manager Session Manager", _AWS),
            _v("azure_bastion", "Azure Bastion", _AZ),
            _v("gcp_identity_aware_proxy", "Google Identity-Aware Proxy", _GCP, "iap"),
        ),
    ),
    _e(
        "siem",
        "SIEM",
        _SEC,
        "process",
        aliases=("security information and event management", "splunk"),
        keywords=("detection", "alerts", "security monitoring", "logs"),
        variants=(
            _v("aws_security_hub", "AWS Security Hub", _AWS),
            _v("azure_sentinel", "Microsoft Sentinel", _AZ, "sentinel"),
            _v("gcp_security_command_center", "Google Security Command Center", _GCP),
        ),
    ),
    _e(
        "aws_shield",
        "AWS Shield",
        _SEC,
        "process",
        provider=_AWS,
        aliases=("shield",),
        keywords=("ddos", "denial of service", "protection"),
    ),
    _e(
        "azure_ddos_protection",
        "Azure DDoS Protection",
        _SEC,
        "process",
        provider=_AZ,
        keywords=("ddos", "denial of service", "protection"),
    ),
    _e(
        "gcp_apigee",
        "Apigee",
        _NET,
        "process",
        provider=_GCP,
        aliases=("apigee",),
        keywords=("api management", "gateway", "rate limiting"),
    ),
    # --- messaging
    _e(
        "message_queue",
        "Message Queue",
        _MSG,
        "data_store",
        aliases=("queue", "rabbitmq", "activemq"),
        keywords=("async", "messages", "decoupling"),
        variants=(
            _v("aws_sqs", "Amazon SQS", _AWS, "sqs"),
            _v("azure_service_bus", "Azure Service Bus", _AZ, "service bus"),
            _v("gcp_cloud_tasks", "Google Cloud Tasks", _GCP),
        ),
    ),
    _e(
        "pub_sub_topic",
        "Pub/Sub Topic",
        _MSG,
        "data_store",
        aliases=("topic", "publish subscribe", "fan-out"),
        keywords=("events", "subscribers", "broadcast"),
        variants=(
            _v("aws_sns", "Amazon SNS", _AWS, "sns"),
            _v("azure_event_grid", "Azure Event Grid", _AZ, "event grid"),
            _v("gcp_pubsub", "Google Cloud Pub/Sub", _GCP, "cloud pubsub"),
        ),
    ),
    _e(
        "event_stream",
        "Event Stream",
        _MSG,
        "data_store",
        aliases=("kafka", "stream", "event log"),
        keywords=("streaming", "events", "partitions", "replay"),
        variants=(
            _v("aws_kinesis", "Amazon Kinesis Data Streams", _AWS, "kinesis"),
            _v("aws_msk", "Amazon MSK", _AWS, "msk"),
            _v("azure_event_hubs", "Azure Event Hubs", _AZ, "event hubs"),
        ),
    ),
    _e(
        "event_bus",
        "Event Bus",
        _MSG,
        "process",
        aliases=("event router",),
        keywords=("events", "routing", "integration"),
        variants=(_v("aws_eventbridge", "Amazon EventBridge", _AWS, "eventbridge"),),
    ),
    _e(
        "workflow_orchestrator",
        "Workflow Orchestrator",
        _MSG,
        "process",
        aliases=("workflow engine", "orchestrator", "temporal", "airflow"),
        keywords=("workflow", "state machine", "steps"),
        variants=(
            _v("aws_step_functions", "AWS Step Functions", _AWS, "step functions"),
            _v("azure_logic_apps", "Azure Logic Apps", _AZ, "logic apps"),
            _v("gcp_workflows", "Google Workflows", _GCP),
        ),
    ),
    _e(
        "email_service",
        "Email Service",
        _MSG,
        "process",
        aliases=("smtp server", "mail server"),
        keywords=("email", "notifications", "smtp"),
        variants=(
            _v("aws_ses", "Amazon SES", _AWS, "ses"),
            _v("azure_communication_services_email", "Azure Communication Services Email", _AZ),
        ),
    ),
    _e(
        "push_notification_service",
        "Push Notification Service",
        _MSG,
        "process",
        aliases=("push notifications", "apns", "fcm"),
        keywords=("mobile", "notifications", "devices"),
        variants=(
            _v("azure_notification_hubs", "Azure Notification Hubs", _AZ),
            _v("gcp_firebase_cloud_messaging", "Firebase Cloud Messaging", _GCP),
        ),
    ),
    # --- clients
    _e(
        "web_browser",
        "Web Browser",
        _CLIENT,
        "external_entity",
        aliases=("browser",),
        keywords=("user agent", "cookies", "javascript"),
    ),
    _e(
        "single_page_app",
        "Single-Page App",
        _CLIENT,
        "process",
        aliases=("spa", "web frontend", "react app"),
        keywords=("javascript", "frontend", "browser"),
    ),
    _e(
        "mobile_app",
        "Mobile App",
        _CLIENT,
        "process",
        aliases=("ios app", "android app", "mobile client"),
        keywords=("phone", "tablet", "mobile"),
    ),
    _e(
        "desktop_app",
        "Desktop App",
        _CLIENT,
        "process",
        aliases=("desktop client", "electron app", "tauri app"),
        keywords=("installed", "native", "desktop"),
    ),
    _e(
        "cli_tool",
        "Command-Line Tool",
        _CLIENT,
        "process",
        aliases=("cli", "command line tool", "sdk client"),
        keywords=("terminal", "developer", "automation"),
    ),
    _e(
        "iot_device",
        "IoT Device",
        _CLIENT,
        "external_entity",
        aliases=("iot", "embedded device", "sensor"),
        keywords=("firmware", "device", "edge"),
    ),
    _e(
        "end_user",
        "End User",
        _CLIENT,
        "external_entity",
        aliases=("user", "customer", "actor"),
        keywords=("human", "person", "visitor"),
    ),
    _e(
        "administrator",
        "Administrator",
        _CLIENT,
        "external_entity",
        aliases=("admin", "operator", "sysadmin"),
        keywords=("privileged", "human", "operations"),
    ),
    # --- external SaaS
    _e(
        "third_party_api",
        "Third-Party API",
        _SAAS,
        "external_entity",
        aliases=("external api", "partner api", "external service"),
        keywords=("vendor", "integration", "webhook"),
    ),
    _e(
        "payment_processor",
        "Payment Processor",
        _SAAS,
        "external_entity",
        aliases=("payment gateway", "stripe", "paypal", "adyen"),
        keywords=("payments", "cards", "pci"),
    ),
    _e(
        "email_delivery_provider",
        "Email Delivery Provider",
        _SAAS,
        "external_entity",
        aliases=("sendgrid", "mailgun", "postmark"),
        keywords=("email", "transactional email"),
    ),
    _e(
        "sms_gateway",
        "SMS Gateway",
        _SAAS,
        "external_entity",
        aliases=("twilio", "sms provider"),
        keywords=("sms", "otp", "phone"),
    ),
    _e(
        "source_control",
        "Source Control",
        _SAAS,
        "external_entity",
        aliases=("git hosting", "github", "gitlab", "bitbucket"),
        keywords=("git", "repository", "code"),
    ),
    _e(
        "ci_cd_pipeline",
        "CI/CD Pipeline",
        _SAAS,
        "process",
        aliases=("ci", "cd", "build pipeline", "github actions", "jenkins"),
        keywords=("build", "deploy", "supply chain", "artifacts"),
        variants=(
            _v("aws_codepipeline", "AWS CodePipeline", _AWS, "codepipeline"),
            _v("azure_pipelines", "Azure Pipelines", _AZ),
            _v("gcp_cloud_build", "Google Cloud Build", _GCP, "cloud build"),
        ),
    ),
    _e(
        "artifact_registry",
        "Artifact Registry",
        _SAAS,
        "data_store",
        aliases=("container registry", "package registry", "docker registry"),
        keywords=("images", "packages", "supply chain"),
        variants=(
            _v("aws_ecr", "Amazon ECR", _AWS, "ecr"),
            _v("azure_container_registry", "Azure Container Registry", _AZ, "acr"),
            _v("gcp_artifact_registry", "Google Artifact Registry", _GCP),
        ),
    ),
    _e(
        "llm_api",
        "LLM API",
        _SAAS,
        "external_entity",
        aliases=("large language model api", "openai api", "anthropic api"),
        keywords=("ai", "llm", "prompts", "completions"),
        variants=(
            _v("aws_bedrock", "Amazon Bedrock", _AWS, "bedrock"),
            _v("azure_openai", "Azure OpenAI", _AZ),
            _v("gcp_gemini_api", "Google Gemini API", _GCP),
        ),
    ),
    _e(
        "analytics_service",
        "Analytics Service",
        _SAAS,
        "external_entity",
        aliases=("product analytics", "google analytics", "mixpanel", "segment"),
        keywords=("tracking", "events", "telemetry", "privacy"),
    ),
    _e(
        "crm_system",
        "CRM System",
        _SAAS,
        "external_entity",
        aliases=("crm", "salesforce", "hubspot"),
        keywords=("customers", "sales", "contacts"),
    ),
    _e(
        "error_tracking",
        "Error Tracking",
        _SAAS,
        "external_entity",
        aliases=("sentry", "crash reporting"),
        keywords=("exceptions", "stack traces", "telemetry"),
    ),
    # --- observability
    _e(
        "log_aggregation",
        "Log Aggregation",
        _OBS,
        "data_store",
        aliases=("logging", "log store", "elk stack"),
        keywords=("logs", "retention", "audit"),
        variants=(
            _v("aws_cloudwatch_logs", "Amazon CloudWatch Logs", _AWS, "cloudwatch logs"),
            _v("azure_monitor_logs", "Azure Monitor Logs", _AZ, "log analytics"),
            _v("gcp_cloud_logging", "Google Cloud Logging", _GCP),
        ),
    ),
    _e(
        "metrics_monitoring",
        "Metrics and Monitoring",
        _OBS,
        "process",
        aliases=("monitoring", "prometheus", "grafana", "datadog"),
        keywords=("metrics", "alerts", "dashboards"),
        variants=(
            _v("aws_cloudwatch", "Amazon CloudWatch", _AWS, "cloudwatch"),
            _v("azure_monitor", "Azure Monitor", _AZ),
            _v("gcp_cloud_monitoring", "Google Cloud Monitoring", _GCP),
        ),
    ),
    _e(
        "distributed_tracing",
        "Distributed Tracing",
        _OBS,
        "process",
        aliases=("tracing", "opentelemetry collector", "jaeger"),
        keywords=("traces", "spans", "telemetry"),
        variants=(
            _v("aws_x_ray", "AWS X-Ray", _AWS, "x-ray"),
            _v("gcp_cloud_trace", "Google Cloud Trace", _GCP),
        ),
    ),
    _e(
        "audit_log",
        "Audit Log",
        _OBS,
        "data_store",
        aliases=("audit trail",),
        keywords=("non-repudiation", "compliance", "tamper evident"),
        variants=(
            _v("aws_cloudtrail", "AWS CloudTrail", _AWS, "cloudtrail"),
            _v("azure_activity_log", "Azure Activity Log", _AZ),
            _v("gcp_cloud_audit_logs", "Google Cloud Audit Logs", _GCP),
        ),
    ),
    # --- deprecated generic data-flow-diagram shapes, kept so old documents still resolve
    _e(
        "process",
        "Process (generic)",
        _COMPUTE,
        "process",
        keywords=("dfd", "generic"),
        replaced_by="api_service",
    ),
    _e(
        "data_store",
        "Data Store (generic)",
        _DATA,
        "data_store",
        keywords=("dfd", "generic"),
        replaced_by="relational_database",
    ),
    _e(
        "external_entity",
        "External Entity (generic)",
        _SAAS,
        "external_entity",
        keywords=("dfd", "generic"),
        replaced_by="third_party_api",
    ),
)


def normalize_component_key(text: str) -> str:
    """Fold case and treat runs of spaces, hyphens and underscores alike ("Web-Server" -> "web_server")."""
    return "_".join(text.casefold().replace("-", " ").replace("_", " ").split())


def _build_index(entries: tuple[CatalogEntry, ...]) -> Mapping[str, CatalogEntry]:
    """Map every normalized id, variant id and alias to its entry; a collision is a catalog bug."""
    index: dict[str, CatalogEntry] = {}
    for entry in entries:
        names = [entry.id, *entry.aliases]
        for variant in entry.variants:
            names += [variant.id, *variant.aliases]
        for name in names:
            key = normalize_component_key(name)
            if key in index:
                raise ValueError(f"catalog name {name!r} is claimed by {index[key].id!r} and {entry.id!r}")
            index[key] = entry
    return MappingProxyType(index)


def _haystack(entry: CatalogEntry) -> str:
    parts = [
        entry.label,
        entry.id,
        *entry.aliases,
        *entry.keywords,
        entry.category.value,
        CATEGORY_LABELS[entry.category],
        entry.provider.value,
        PROVIDER_LABELS[entry.provider],
    ]
    for variant in entry.variants:
        provider_label = PROVIDER_LABELS[variant.provider]
        parts += [variant.label, variant.id, *variant.aliases, variant.provider.value, provider_label]
    return "\n".join(parts).casefold()


_BY_ID: Final = MappingProxyType({entry.id: entry for entry in CATALOG})
_INDEX: Final = _build_index(CATALOG)
_HAYSTACKS: Final = tuple(_haystack(entry) for entry in CATALOG)


def resolve_component(id_or_alias: str) -> CatalogEntry | None:
    """The entry an element type names: exact id first, then any id, variant id or alias, loosely matched.

    Returns the entry only; callers must not write its id back into a document.
    """
    exact = _BY_ID.get(id_or_alias)
    if exact is not None:
        return exact
    return _INDEX.get(normalize_component_key(id_or_alias))


def _offers(entry: CatalogEntry, provider: str) -> bool:
    return entry.provider == provider or any(variant.provider == provider for variant in entry.variants)


def search_catalog(
    query: str = "",
    category: ComponentCategory | str | None = None,
    provider: ComponentProvider | str | None = None,
    include_deprecated: bool = False,
) -> tuple[CatalogEntry, ...]:
    """Entries matching every word of `query` (case-insensitive substrings), in declaration order.

    A blank query lists everything. `provider` keeps entries from that provider or with a variant from it,
    so searching "aws" finds generic kinds that have an AWS product as well as AWS-only entries.
    """
    words = query.casefold().split()
    results: list[CatalogEntry] = []
    for entry, haystack in zip(CATALOG, _HAYSTACKS, strict=True):
        if entry.deprecated and not include_deprecated:
            continue
        if category is not None and entry.category != category:
            continue
        if provider is not None and not _offers(entry, provider):
            continue
        if all(word in haystack for word in words):
            results.append(entry)
    return tuple(results)
