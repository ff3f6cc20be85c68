"""deploy/kubernetes, checked offline: no cluster runs here.

* Every built-in resource is validated (strict: unknown fields fail) against the Kubernetes
  OpenAPI schemas that the ``kubernetes-validate`` package bundles, for the oldest and newest
  Kubernetes versions it carries that the manifests target.
* The RayCluster is validated against the openAPIV3Schema of KubeRay v1.7.0's CRD
  (``ray.io_rayclusters.yaml``, version v1, kept in tests/deploy/schemas/), plus the check the API
  server makes silently: a field the structural schema does not know would be pruned on apply.
* The deployment's intent: security contexts, no secret inlined, probes, the API wired to the Ray
  head and Postgres, the Ray launcher's resource names present on the right worker groups only,
  training and rules on separate node pools, and NetworkPolicies evaluated for who reaches whom.

Each check is also run on a broken copy of a manifest, so none of them can pass vacuously.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
RAYCLUSTER_SCHEMA = Path(__file__).parent / "schemas" / "kuberay-v1.7.0-raycluster-v1.json"
# Oldest Kubernetes the manifests target (restricted Pod Security, seccompProfile fields) and the
# newest the installed kubernetes-validate bundles.
K8S_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
UID = 10001


# -- loading ------------------------------------------------------------------------------------
def _documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())


def applied() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/kubernetes` applies (before kustomize's namespace/labels)."""
    return [document for name in _kustomization()["resources"] for document in _documents(MANIFESTS / name)]


def _one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_templates(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every workload kind used here, RayCluster groups included."""
    kind, name = document["kind"], document["metadata"]["name"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield f"{kind}/{name}", document["spec"]["template"]
    elif kind == "RayCluster":
        yield f"{kind}/{name}/head", document["spec"]["headGroupSpec"]["template"]
        for group in document["spec"].get("workerGroupSpecs", []):
            yield f"{kind}/{name}/{group['groupName']}", group["template"]


def _ray_resources(start_params: dict[str, str]) -> dict[str, float]:
    """rayStartParams' ``resources`` as KubeRay reads it: surrounding quotes trimmed, then JSON."""
    return json.loads(start_params.get("resources", "{}").strip("'\"` "))


# -- schema validation --------------------------------------------------------------------------
def kubernetes_schema_errors(document: dict[str, Any], version: str) -> list[str]:
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{document['kind']}/{document['metadata'].get('name')}: {error.message} at {list(error.path)}"]
    return []


def _pruned_fields(value: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
    """Fields the API server would drop silently: not among a structural schema's properties."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from _pruned_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from _pruned_fields(item, extra, f"{path}.{key}")
            elif properties and extra is not True:
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _pruned_fields(item, schema["items"], f"{path}[{index}]")


def raycluster_schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads(RAYCLUSTER_SCHEMA.read_text())
    errors = [
        f"{'/'.join(map(str, error.path))}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(document)
    ]
    errors += [f"{field}: unknown to the CRD (would be pruned)" for field in _pruned_fields(document, schema, "")]
    return errors


def test_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    listed = set(_kustomization()["resources"])
    present = {path.name for path in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present - {"secret.template.yaml"}, "a manifest is missing from kustomization.yaml (or vice versa)"
    assert not any(d["kind"] == "Secret" for d in applied()), "kubectl apply -k must not create a default secret"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_resources_validate_against_the_kubernetes_openapi_schemas(version: str) -> None:
    documents = [d for d in applied() if d["apiVersion"] != "ray.io/v1"]
    documents += _documents(MANIFESTS / "secret.template.yaml")
    assert {d["kind"] for d in documents} >= {"Namespace", "Deployment", "StatefulSet", "Service", "NetworkPolicy"}
    errors = [error for document in documents for error in kubernetes_schema_errors(document, version)]
    assert errors == []


def test_raycluster_validates_against_the_kuberay_crd_schema() -> None:
    raycluster = _one(applied(), "RayCluster", "trainguard-ray")
    assert raycluster["apiVersion"] == "ray.io/v1"
    assert raycluster_schema_errors(raycluster) == []


def test_schema_checks_catch_broken_manifests() -> None:
    documents = applied()
    deployment = copy.deepcopy(_one(documents, "Deployment", "trainguard-api"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}  # misspelled field
    assert kubernetes_schema_errors(deployment, K8S_VERSIONS[-1])

    raycluster = _one(documents, "RayCluster", "trainguard-ray")
    misspelled = copy.deepcopy(raycluster)
    misspelled["spec"]["workerGroupSpecs"][0]["nodeSelectr"] = {"trainguard.io/pool": "training"}
    assert any("nodeSelectr" in error for error in raycluster_schema_errors(misspelled))
    mistyped = copy.deepcopy(raycluster)
    mistyped["spec"]["workerGroupSpecs"][1]["replicas"] = "two"
    assert any("replicas" in error for error in raycluster_schema_errors(mistyped))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
def test_kustomize_build_renders_and_validates() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    assert len(documents) == len(applied())
    for document in documents:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "trainguard", document["metadata"]["name"]
        if document["apiVersion"] == "ray.io/v1":
            assert raycluster_schema_errors(document) == []
        else:
            assert kubernetes_schema_errors(document, K8S_VERSIONS[-1]) == []


# -- security properties ------------------------------------------------------------------------
_SECRET_NAME = re.compile(r"TOKEN|PASSWORD|SECRET|ACCESS_KEY", re.IGNORECASE)


def security_problems(documents: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for document in documents:
        for where, template in pod_templates(document):
            spec = template["spec"]
            pod_context = spec.get("securityContext", {})
            if pod_context.get("runAsNonRoot") is not True or pod_context.get("runAsUser") != UID:
                problems.append(f"{where}: pod must run as non-root uid {UID}")
            if pod_context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                problems.append(f"{where}: pod seccompProfile must be RuntimeDefault")
            if spec.get("automountServiceAccountToken") is not False:
                problems.append(f"{where}: service account token mounted")
            for host_field in ("hostNetwork", "hostPID", "hostIPC"):
                if spec.get(host_field):
                    problems.append(f"{where}: {host_field}")
            for volume in spec.get("volumes", []):
                if "hostPath" in volume:
                    problems.append(f"{where}: hostPath volume {volume['name']}")
            for container in spec.get("initContainers", []) + spec["containers"]:
                problems += _container_problems(f"{where}/{container['name']}", container)
    return problems


def _container_problems(where: str, container: dict[str, Any]) -> list[str]:
    problems = []
    context = container.get("securityContext", {})
    if context.get("privileged") or context.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: privileged or privilege escalation allowed")
    if context.get("capabilities", {}).get("drop") != ["ALL"] or context.get("capabilities", {}).get("add"):
        problems.append(f"{where}: capabilities must drop ALL and add none")
    if context.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{where}: root filesystem writable")
    if context.get("runAsUser", UID) != UID or context.get("runAsNonRoot") is False:
        problems.append(f"{where}: container overrides the non-root uid")
    resources = container.get("resources", {})
    for bound in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(resources.get(bound, {})):
            problems.append(f"{where}: cpu/memory {bound} missing")
    for variable in container.get("env", []):
        if _SECRET_NAME.search(variable["name"]) and "value" in variable:
            problems.append(f"{where}: {variable['name']} inlined; take it from a Secret")
        if "value" in variable and re.search(r"://[^/\s:@]+:[^$@/\s][^@/\s]*@", variable["value"]):
            problems.append(f"{where}: {variable['name']} carries a password in a URL")
    return problems


def test_every_pod_is_locked_down() -> None:
    documents = applied()
    templates = [where for document in documents for where, _ in pod_templates(document)]
    assert len(templates) == 5, templates  # API, Postgres, Ray head, training and rules groups
    assert security_problems(documents) == []


@pytest.mark.parametrize(
    "break_it",
    [
        lambda spec: spec["containers"][0]["securityContext"].update(privileged=True),
        lambda spec: spec["containers"][0]["securityContext"]["capabilities"].update(add=["NET_ADMIN"]),
        lambda spec: spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        lambda spec: spec["securityContext"].update(runAsUser=0),
        lambda spec: spec["containers"][0]["resources"].pop("limits"),
        lambda spec: spec["containers"][0]["env"].append({"name": "TRAINGUARD_API_TOKEN", "value": "abc"}),
        lambda spec: spec["containers"][0]["env"].append(
            {"name": "TRAINGUARD_DATABASE_URL", "value": "postgresql://trainguard:hunter2@db/trainguard"}
        ),
    ],
    ids=["privileged", "cap-add", "hostPath", "root", "no-limits", "inlined-token", "password-in-url"],
)
def test_security_check_flags_a_broken_pod(break_it: Any) -> None:
    deployment = copy.deepcopy(_one(applied(), "Deployment", "trainguard-api"))
    break_it(deployment["spec"]["template"]["spec"])
    assert security_problems([deployment])


def test_secret_template_holds_placeholders_only() -> None:
    (template,) = _documents(MANIFESTS / "secret.template.yaml")
    values = {**template.get("stringData", {}), **template.get("data", {})}
    assert values and all(value.startswith("<REPLACE") for value in values.values()), values
    referenced = {
        variable["valueFrom"]["secretKeyRef"]["key"]
        for document in applied()
        for _, pod in pod_templates(document)
        for container in pod["spec"]["containers"]
        for variable in container.get("env", [])
        if "secretKeyRef" in variable.get("valueFrom", {})
    }
    assert referenced == set(values), "the template must list exactly the keys the pods read"


def test_api_has_health_probes() -> None:
    (container,) = _one(applied(), "Deployment", "trainguard-api")["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe


# -- wiring: the API, Postgres and the RayCluster find each other -------------------------------
def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in container.get("env", [])}


def _service_port(service: dict[str, Any]) -> int:
    (port,) = service["spec"]["ports"]
    return port["port"]


def test_api_is_wired_to_ray_and_postgres() -> None:
    documents = applied()
    deployment = _one(documents, "Deployment", "trainguard-api")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert container["command"][:2] == ["trainguard", "serve"]
    assert env["TRAINGUARD_LAUNCHER"]["value"] == "ray"
    for name in ("TRAINGUARD_API_TOKEN", "TRAINGUARD_SAGEMAKER_ACCESS_KEYS"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "trainguard-secrets", name

    # KubeRay names the head's service <cluster>-head-svc; the job API is the head's dashboard port.
    raycluster = _one(documents, "RayCluster", "trainguard-ray")
    (head,) = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    dashboard = {port["name"]: port["containerPort"] for port in head["ports"]}["dashboard"]
    assert env["RAY_ADDRESS"]["value"] == f"http://{raycluster['metadata']['name']}-head-svc:{dashboard}"
    assert raycluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"

    # The database URL names the Postgres service and takes the password from the Secret-fed
    # variable, which Kubernetes expands only when it is defined earlier in the list.
    service = _one(documents, "Service", "trainguard-postgres")
    url = env["TRAINGUARD_DATABASE_URL"]["value"]
    assert url.startswith("postgresql+psycopg://trainguard:$(POSTGRES_PASSWORD)@")
    assert f"@{service['metadata']['name']}:{_service_port(service)}/" in url
    names = [variable["name"] for variable in container["env"]]
    assert names.index("POSTGRES_PASSWORD") < names.index("TRAINGUARD_DATABASE_URL")
    statefulset = _one(documents, "StatefulSet", "trainguard-postgres")
    postgres_env = _env(statefulset["spec"]["template"]["spec"]["containers"][0])
    assert postgres_env["POSTGRES_PASSWORD"]["valueFrom"] == env["POSTGRES_PASSWORD"]["valueFrom"]

    api_service = _one(documents, "Service", "trainguard-api")
    api_host = f"{api_service['metadata']['name']}.trainguard.svc.cluster.local"
    assert env["TRAINGUARD_PUBLIC_URL"]["value"] == f"http://{api_host}:{_service_port(api_service)}"


def test_services_select_their_pods() -> None:
    documents = applied()
    for service in (d for d in documents if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matched = [
            where
            for document in documents
            for where, template in pod_templates(document)
            if selector.items() <= template["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, (service["metadata"]["name"], matched)


def test_every_ray_pod_and_the_api_share_the_data_directory() -> None:
    """The Ray launcher runs commands with the API's paths: the same image and /data everywhere."""
    documents = applied()
    claim = _one(documents, "PersistentVolumeClaim", "trainguard-data")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    images = set()
    for document in documents:
        if document["kind"] not in ("Deployment", "RayCluster"):
            continue
        for where, template in pod_templates(document):
            spec = template["spec"]
            volumes = {v["name"]: v for v in spec["volumes"]}
            (container,) = spec["containers"]
            images.add(container["image"])
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] == "trainguard-data", where
    assert len(images) == 1, images
    dockerfile = (MANIFESTS / "ray-image" / "Dockerfile").read_text()
    raycluster = _one(documents, "RayCluster", "trainguard-ray")
    assert f'ray[default]=={raycluster["spec"]["rayVersion"]}"' in dockerfile


def test_training_and_rules_get_the_launchers_resources_on_separate_node_pools() -> None:
    from trainguard.services.launchers.ray import RayLauncher

    launcher = RayLauncher()
    raycluster = _one(applied(), "RayCluster", "trainguard-ray")
    groups = {group["groupName"]: group for group in raycluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"training", "rules"}
    assert _ray_resources(raycluster["spec"]["headGroupSpec"]["rayStartParams"]) == {}
    assert _ray_resources(groups["training"]["rayStartParams"]) == {launcher.training_resource: 1}
    assert _ray_resources(groups["rules"]["rayStartParams"]) == {launcher.rules_resource: 4}

    pools = {}
    for name, group in groups.items():
        spec = group["template"]["spec"]
        pools[name] = spec["nodeSelector"]["trainguard.io/pool"]
        tolerated = {(t["key"], t.get("value")) for t in spec["tolerations"]}
        assert ("trainguard.io/pool", pools[name]) in tolerated, name
    assert pools == {"training": "training", "rules": "rules"}
    training = groups["training"]["template"]["spec"]
    assert "nvidia.com/gpu" in training["containers"][0]["resources"]["limits"]
    assert any(t["key"] == "nvidia.com/gpu" for t in training["tolerations"])


# -- NetworkPolicies, evaluated -----------------------------------------------------------------
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are evaluated here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_allows(peers: list[dict[str, Any]] | None, labels: dict[str, str]) -> bool:
    """A peer list as for a pod of this namespace (namespaceSelector peers name other namespaces)."""
    if peers is None:
        return True
    return any("podSelector" in peer and "namespaceSelector" not in peer and _selects(peer["podSelector"], labels)
               for peer in peers)  # fmt: skip


def _port_allows(ports: list[dict[str, Any]] | None, port: int) -> bool:
    return ports is None or any(p.get("protocol", "TCP") == "TCP" and p.get("port") == port for p in ports)


def _direction_allows(policies: list[dict[str, Any]], direction: str, pod: dict, peer: dict, port: int) -> bool:
    policy_type = direction.capitalize()
    governing = [
        p for p in policies if policy_type in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod)
    ]
    if not governing:
        return True  # no policy selects the pod in this direction: everything is allowed
    return any(
        _peer_allows(rule.get("from" if direction == "ingress" else "to"), peer)
        and _port_allows(rule.get("ports"), port)
        for policy in governing
        for rule in policy["spec"].get(direction, [])
    )


def can_connect(policies: list[dict[str, Any]], source: dict[str, str], target: dict[str, str], port: int) -> bool:
    """Whether a pod of the namespace with labels ``source`` reaches ``target``:``port`` (TCP)."""
    return _direction_allows(policies, "egress", source, target, port) and _direction_allows(
        policies, "ingress", target, source, port
    )


def _pod_labels() -> dict[str, dict[str, str]]:
    labels = {}
    for document in applied():
        for where, template in pod_templates(document):
            labels[where.rsplit("/", 1)[-1]] = template["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(
    ("source", "target", "port", "allowed"),
    [
        ("training", "trainguard-api", 8080, False),  # jobs cannot reach the API
        ("training", "trainguard-postgres", 5432, False),  # nor the database
        ("rules", "trainguard-postgres", 5432, False),
        ("head", "trainguard-postgres", 5432, False),
        ("head", "trainguard-api", 8080, False),
        ("rules", "trainguard-api", 8080, True),  # rule runners report findings
        ("trainguard-api", "trainguard-postgres", 5432, True),
        ("trainguard-api", "head", 8265, True),  # job submission
        ("trainguard-api", "training", 8265, False),
        ("training", "head", 6379, True),  # Ray's own traffic
        ("rules", "training", 12345, True),
    ],
)
def test_network_policies(source: str, target: str, port: int, allowed: bool) -> None:
    policies = [d for d in applied() if d["kind"] == "NetworkPolicy"]
    labels = _pod_labels()
    assert can_connect(policies, labels[source], labels[target], port) is allowed


def test_network_policy_evaluation_notices_an_open_database() -> None:
    policies = copy.deepcopy([d for d in applied() if d["kind"] == "NetworkPolicy"])
    labels = _pod_labels()
    for policy in policies:
        if policy["metadata"]["name"] == "postgres-from-api-only":
            policy["spec"]["ingress"][0]["from"].append({"podSelector": {}})
    assert can_connect(policies, labels["rules"], labels["trainguard-postgres"], 5432)


# -- rayStartParams through the shell, as KubeRay runs them -------------------------------------
def _kuberay_flags(start_params: dict[str, str]) -> str:
    """`ray start` flags as KubeRay v1.7.0 writes them (convertParamMap in
    ray-operator/controllers/ray/common/pod.go): sorted keys, ' --key=value ', "true" as a bare flag."""
    flags = ""
    for key in sorted(start_params):
        value = start_params[key]
        if value.lower() == "true":
            flags += f" --{key} "
        elif value.lower() != "false":
            flags += f" --{key}={value} "
    return flags


def _ray_start_resources(start_params: dict[str, str]) -> dict[str, float]:
    """The resources `ray start` gets once bash has split KubeRay's command line, parsed by Ray."""
    ray_utils = pytest.importorskip("ray._private.utils")
    from ray.autoscaler._private.cli_logger import cf, cli_logger

    argv = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" ' + _kuberay_flags(start_params)],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.splitlines()
    given = [arg.split("=", 1)[1] for arg in argv if arg.startswith("--resources=")]
    if not given:
        return {}
    (resources,) = given
    return ray_utils.parse_resources_json(resources, cli_logger, cf)


def test_ray_start_gets_the_resources_through_kuberays_shell_command() -> None:
    from trainguard.services.launchers.ray import RayLauncher

    launcher = RayLauncher()
    raycluster = _one(applied(), "RayCluster", "trainguard-ray")
    groups = {group["groupName"]: group for group in raycluster["spec"]["workerGroupSpecs"]}
    assert _ray_start_resources(groups["training"]["rayStartParams"]) == {launcher.training_resource: 1}
    assert _ray_start_resources(groups["rules"]["rayStartParams"]) == {launcher.rules_resource: 4}
    assert _ray_start_resources(raycluster["spec"]["headGroupSpec"]["rayStartParams"]) == {}
    # Unquoted JSON loses its quotes and is split in the shell, and `ray start` refuses it.
    click = pytest.importorskip("click")
    with pytest.raises(click.ClickException):
        _ray_start_resources({"resources": '{"rules": 4}'})
