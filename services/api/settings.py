"""API settings, read from the environment when the app is built (never at import).

Every variable is listed in :data:`ENVIRONMENT` with its meaning; ``python -m trainguard.services.api
--help`` prints them. The API token has no default on purpose: the server refuses to start
without one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from trainguard.services.actions.outbound_policy import parse_allow_list
from trainguard.services.api.access_keys import AccessKeyStore
from trainguard.services.api.policy import PolicyError, TenancyPolicy

from trainguard.errors import ConfigError

__all__ = ["ENVIRONMENT", "Settings", "secure_state"]

# Removed: it let any invented key id in. Refusing to start says so louder than ignoring it would.
_REMOVED = {
    "TRAINGUARD_SAGEMAKER_ALLOW_ANY_SIGNATURE": "it was removed: SageMaker requests are SigV4-verified against "
    "TRAINGUARD_SAGEMAKER_ACCESS_KEYS (AKID:SECRET pairs); configure a key pair and unset it",
}

ENVIRONMENT: dict[str, str] = {
    "TRAINGUARD_API_TOKEN": "required: the bearer token every request (but GET /health) must carry",
    "TRAINGUARD_DATABASE_URL": "SQLAlchemy URL of the state database (default sqlite:///<data dir>/trainguard.db)",
    "TRAINGUARD_DATA_DIR": "where jobs' local files live (default ./trainguard-service)",
    "TRAINGUARD_LAUNCHER": "local | docker | ray (default: docker if the engine answers, else local)",
    "RAY_ADDRESS": "the Ray cluster of TRAINGUARD_LAUNCHER=ray: its dashboard URL (http://head:8265; "
    "default: Ray's own lookup)",
    "TRAINGUARD_HOST": "bind address of `python -m trainguard.services.api` (default 127.0.0.1)",
    "TRAINGUARD_PORT": "port of `python -m trainguard.services.api` (default 8080)",
    "TRAINGUARD_PUBLIC_URL": "the API's URL as rule runners reach it (default http://127.0.0.1:<port>)",
    "TRAINGUARD_STOP_GRACE_SECONDS": "SIGTERM-to-SIGKILL grace of a stop (default 120, as SageMaker)",
    "TRAINGUARD_RECONCILE_INTERVAL": "seconds between launcher polls (default 1.0)",
    "TRAINGUARD_LAUNCH_SETTLE_SECONDS": "accepted jobs start once no job was accepted for this long (default 0.2; "
    "0 = at once), so a burst of creations is answered before its jobs take the CPU",
    "TRAINGUARD_LAUNCH_MAX_DELAY_SECONDS": "the longest an accepted job waits for a burst to settle "
    "(default 2, at most 600)",
    "TRAINGUARD_JOB_CPU_SHARES": "CPU weight (docker --cpu-shares, 2-262144) of docker-launcher job containers, "
    "below the services' 1024 (default 256)",
    "TRAINGUARD_JOB_NICENESS": "CPU niceness 0-19 of local-launcher job processes, below the API's (default 10)",
    "TRAINGUARD_JOB_UID_BASE": "local launcher as root: job N runs as uid/gid BASE+N, no groups (default 2100000000)",
    "TRAINGUARD_JOB_ENV_PASSTHROUGH": "comma-separated variables local jobs inherit beyond PATH, PYTHONPATH, "
    "the locale and GPU selection (never TRAINGUARD_*, AWS_*, S3_*)",
    "TRAINGUARD_LOCAL_UNISOLATED_TENANTS": "1 = let more than one access key use a local launcher whose jobs run as "
    "the service's own user (not root: no isolation between tenants)",
    "TRAINGUARD_RULE_FINISH_TIMEOUT": "seconds rule runners may run on after training ended (default 600)",
    "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": "SageMaker endpoint credentials, '[name=]AKID:SECRET,...' (SigV4-verified)",
    "TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": "file of '[name=]AKID:SECRET' lines (mode 0600; re-read when it changes)",
    "TRAINGUARD_TENANCY_POLICY_FILE": "YAML/JSON file of grants: which access keys may read or stop other keys' jobs "
    "(default: none, each key sees its own jobs; docs/tenancy.md)",
    "TRAINGUARD_RULE_MODULES": "comma-separated modules whose 'module:Class' rules may be imported (default: none)",
    "TRAINGUARD_SOURCE_ROOTS": "comma-separated directories a rule's local source_uri may point into (default: none)",
    "TRAINGUARD_ACCOUNT_ID": "12-digit account id used in ARNs (default 000000000000)",
    "AWS_REGION": "region used in ARNs, SNS and CloudWatch (default us-east-1)",
    "TRAINGUARD_S3_OUTPUT": "default DebugHookConfig.S3OutputPath for the docker launcher (s3://bucket/prefix)",
    "S3_ENDPOINT_URL": "S3 endpoint passed to uploaders and rule runners (docker launcher)",
    "CLOUDWATCH_ENDPOINT_URL": "CloudWatch endpoint rule runners put their metrics to (optional)",
    "TRAINGUARD_TRAINING_IMAGE": "default training image (default trainguard-training:local)",
    "TRAINGUARD_MAX_BODY_BYTES": "largest request body accepted, in bytes (default 1048576); larger ones get 413 "
    "before they are read",
    "TRAINGUARD_TRAINING_IMAGE_MAP": "JSON object {regex: image}: SageMaker TrainingImage URIs to run as another image "
    "(checked before the built-in map of AWS framework images to TRAINGUARD_TRAINING_IMAGE; see docs/sagemaker-sdk.md)",
    "TRAINGUARD_SERVICE_IMAGE": "image of uploaders and rule runners (default trainguard-service:local)",
    "TRAINGUARD_RULE_CPUS": "CPU limit of each rule runner (default 0.5)",
    "TRAINGUARD_RULE_MEMORY_MB": "memory limit of each rule runner (default 1024)",
    "TRAINGUARD_DOCKER_NETWORK": "docker network the components join (passed to the docker launcher)",
    "TRAINGUARD_SMTP_HOST": "SMTP server for the email action (if unset, email goes through SNS)",
    "TRAINGUARD_SMTP_PORT": "SMTP port (default 25)",
    "TRAINGUARD_SMTP_FROM": "sender address (default trainguard@localhost)",
    "TRAINGUARD_SMTP_USER": "SMTP login (optional; needs TRAINGUARD_SMTP_PASSWORD)",
    "TRAINGUARD_SMTP_PASSWORD": "SMTP password (optional)",
    "TRAINGUARD_SMTP_STARTTLS": "1 = STARTTLS before login",
    "TRAINGUARD_SNS_ENDPOINT_URL": "SNS endpoint for email/sms/sns actions (default: AWS)",
    "TRAINGUARD_EVENT_WEBHOOK_URL": "optional URL that receives every job/rule state-change event (POST)",
    "TRAINGUARD_WEBHOOK_ALLOW": "comma-separated CIDRs, addresses or host names webhooks may reach although internal "
    "(default: none; loopback, private, link-local, CGNAT, multicast and the stack's own services are refused)",
    "DOCKER_HOST": "the Docker engine (or the stack's proxy) of the docker launcher; webhooks may never reach it",
}


def _float(environ: Mapping[str, str], key: str, default: float) -> float:
    raw = environ.get(key)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number") from None
    if value != value:  # NaN passes every comparison below and min()/max() would hide it
        raise ConfigError(f"{key}={raw!r} is not a number")
    if value < 0:
        raise ConfigError(f"{key}={raw!r} must not be negative")
    return value


def _image_map(raw: str) -> tuple[tuple[str, str], ...]:
    if not raw.strip():
        return ()
    import json
    import re

    try:
        document = json.loads(raw)
    except ValueError as error:
        raise ConfigError(f"TRAINGUARD_TRAINING_IMAGE_MAP is not JSON: {error}") from None
    if not isinstance(document, dict) or not all(isinstance(v, str) and v for v in document.values()):
        raise ConfigError("TRAINGUARD_TRAINING_IMAGE_MAP must be a JSON object of regex -> image name")
    for pattern in document:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"TRAINGUARD_TRAINING_IMAGE_MAP: {pattern!r} is not a regex: {error}") from None
    return tuple(document.items())


@dataclass(frozen=True)
class Settings:
    api_token: str
    database_url: str
    data_dir: Path
    launcher: str = ""
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = ""
    stop_grace_seconds: float = 120.0
    reconcile_interval: float = 1.0
    launch_settle_seconds: float = 0.2
    launch_max_delay_seconds: float = 2.0
    rule_finish_timeout: float = 600.0
    sagemaker_keys: AccessKeyStore = field(default_factory=AccessKeyStore)
    tenancy: TenancyPolicy = field(default_factory=TenancyPolicy)
    rule_modules: tuple[str, ...] = ()
    source_roots: tuple[Path, ...] = ()
    account_id: str = "000000000000"
    region: str = "us-east-1"
    s3_output: str = ""
    s3_endpoint_url: str = ""
    cloudwatch_endpoint_url: str = ""
    training_image: str = "trainguard-training:local"
    training_image_map: tuple[tuple[str, str], ...] = ()  # (regex, image) pairs, first match wins
    service_image: str = "trainguard-service:local"
    rule_cpus: float = 0.5
    rule_memory_mb: int = 1024
    docker_network: str = ""
    ray_address: str = ""
    smtp: dict[str, str] = field(default_factory=dict)
    sns_endpoint_url: str = ""
    event_webhook_url: str = ""
    webhook_allow: tuple[str, ...] = ()  # TRAINGUARD_WEBHOOK_ALLOW entries (outbound_policy)
    docker_host: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        token = environ.get("TRAINGUARD_API_TOKEN", "")
        if not token.strip():
            raise ConfigError(
                "TRAINGUARD_API_TOKEN is not set: the API has no default secret. "
                "Set it, e.g. export TRAINGUARD_API_TOKEN="
                "$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if len(token.strip()) < 8:
            raise ConfigError("TRAINGUARD_API_TOKEN is shorter than 8 characters: use a longer random secret")
        data_dir = Path(environ.get("TRAINGUARD_DATA_DIR") or "trainguard-service").resolve()
        database_url = environ.get("TRAINGUARD_DATABASE_URL") or f"sqlite:///{data_dir / 'trainguard.db'}"
        launcher = (environ.get("TRAINGUARD_LAUNCHER") or "").strip().lower()
        if launcher not in ("", "local", "docker", "ray"):
            raise ConfigError(f"TRAINGUARD_LAUNCHER={launcher!r}: use local, docker or ray")
        port_text = environ.get("TRAINGUARD_PORT") or "8080"
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"TRAINGUARD_PORT={port_text!r} is not a port number") from None
        for name, why in _REMOVED.items():
            if environ.get(name):
                raise ConfigError(f"{name} is set, but {why}")
        keys = AccessKeyStore.from_environ(environ, token.strip())
        policy_file = environ.get("TRAINGUARD_TENANCY_POLICY_FILE") or None
        try:
            tenancy = TenancyPolicy.from_file(policy_file)
        except PolicyError as error:
            raise ConfigError(str(error)) from None
        except OSError as error:
            raise ConfigError(f"TRAINGUARD_TENANCY_POLICY_FILE {policy_file}: {error.strerror}") from None
        rule_modules = tuple(m.strip() for m in (environ.get("TRAINGUARD_RULE_MODULES") or "").split(",") if m.strip())
        source_roots = tuple(
            Path(r.strip()).resolve() for r in (environ.get("TRAINGUARD_SOURCE_ROOTS") or "").split(",") if r.strip()
        )
        smtp = {
            key: environ[f"TRAINGUARD_SMTP_{key.upper()}"]
            for key in ("host", "port", "from", "user", "password", "starttls")
            if environ.get(f"TRAINGUARD_SMTP_{key.upper()}")
        }
        event_webhook_url = environ.get("TRAINGUARD_EVENT_WEBHOOK_URL", "")
        if event_webhook_url and urlsplit(event_webhook_url).scheme.lower() not in ("http", "https"):
            raise ConfigError(f"TRAINGUARD_EVENT_WEBHOOK_URL={event_webhook_url!r}: only http(s) URLs are allowed")
        webhook_allow = tuple(
            e.strip() for e in (environ.get("TRAINGUARD_WEBHOOK_ALLOW") or "").split(",") if e.strip()
        )
        parse_allow_list(webhook_allow)  # a bad entry refuses the start, not the first webhook
        return cls(
            api_token=token.strip(),
            database_url=database_url,
            data_dir=data_dir,
            launcher=launcher,
            host=environ.get("TRAINGUARD_HOST") or "127.0.0.1",
            port=port,
            public_url=(environ.get("TRAINGUARD_PUBLIC_URL") or f"http://127.0.0.1:{port}").rstrip("/"),
            stop_grace_seconds=_float(environ, "TRAINGUARD_STOP_GRACE_SECONDS", 120.0),
            reconcile_interval=max(0.05, _float(environ, "TRAINGUARD_RECONCILE_INTERVAL", 1.0)),
            launch_settle_seconds=min(60.0, _float(environ, "TRAINGUARD_LAUNCH_SETTLE_SECONDS", 0.2)),
            launch_max_delay_seconds=min(600.0, _float(environ, "TRAINGUARD_LAUNCH_MAX_DELAY_SECONDS", 2.0)),
            rule_finish_timeout=_float(environ, "TRAINGUARD_RULE_FINISH_TIMEOUT", 600.0),
            sagemaker_keys=keys,
            tenancy=tenancy,
            rule_modules=rule_modules,
            source_roots=source_roots,
            account_id=environ.get("TRAINGUARD_ACCOUNT_ID") or "000000000000",
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            s3_output=environ.get("TRAINGUARD_S3_OUTPUT", ""),
            s3_endpoint_url=environ.get("S3_ENDPOINT_URL", ""),
            cloudwatch_endpoint_url=environ.get("CLOUDWATCH_ENDPOINT_URL", ""),
            training_image=environ.get("TRAINGUARD_TRAINING_IMAGE") or "trainguard-training:local",
            training_image_map=_image_map(environ.get("TRAINGUARD_TRAINING_IMAGE_MAP") or ""),
            service_image=environ.get("TRAINGUARD_SERVICE_IMAGE") or "trainguard-service:local",
            rule_cpus=_float(environ, "TRAINGUARD_RULE_CPUS", 0.5),
            rule_memory_mb=int(_float(environ, "TRAINGUARD_RULE_MEMORY_MB", 1024)),
            docker_network=environ.get("TRAINGUARD_DOCKER_NETWORK", ""),
            ray_address=environ.get("RAY_ADDRESS", ""),
            smtp=smtp,
            sns_endpoint_url=environ.get("TRAINGUARD_SNS_ENDPOINT_URL", ""),
            event_webhook_url=event_webhook_url,
            webhook_allow=webhook_allow,
            docker_host=environ.get("DOCKER_HOST", ""),
        )


def secure_state(settings: Settings) -> None:
    """Make the API's state private to its user: data dir 0700, SQLite files 0600, umask 077.

    The database holds runner tokens and jobs' environments; the data dir holds jobs' files. The
    umask makes every file the API creates afterwards private too (job dirs, the database's journal).
    """
    os.umask(0o077)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise ConfigError(f"cannot create the data dir {settings.data_dir}: {error.strerror}") from None
    # Traversal by others (never listing) stays when it was there: the local launcher, as root,
    # opens the data dir so its jobs' users reach their own directories in it, and running jobs
    # must not lose them when the API restarts.
    traversable = settings.data_dir.stat().st_mode & stat.S_IXOTH
    paths: list[tuple[Path, int]] = [(settings.data_dir, 0o700 | traversable)]
    prefix = "sqlite:///"
    if settings.database_url.startswith(prefix):
        database = Path(settings.database_url[len(prefix):])
        paths += [(p, 0o600) for p in (database, *database.parent.glob(database.name + "-*")) if p.is_file()]
    for path, mode in paths:  # database: itself and its -journal, -wal, -shm
        try:
            os.chmod(path, mode)
        except OSError as error:
            # Not ours (e.g. a volume made by an older root container): refuse rather than run exposed.
            raise ConfigError(
                f"cannot make {path} private (chmod {mode:o}: {error.strerror}); "
                f"chown it to this user (uid {os.getuid()}) or remove it"
            ) from None
