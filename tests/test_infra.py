"""The control-plane Bicep template, read as Azure Resource Manager would deploy it (tests/bicep.py: there is
no Bicep compiler here): every setting the app needs, a second deployment that keeps the code and a rotated
JWT secret, identity instead of keys, the plan's limits, alerts, and Microsoft.Web shapes checked against
the REST schema (infra/controlplane/schema/)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared.settings import _ENV
from tests.bicep import Expr, Resource, Template, parse

ROOT = Path(__file__).resolve().parent.parent
BICEP = ROOT / "infra" / "controlplane" / "main.bicep"
SCHEMA_DIR = ROOT / "infra" / "controlplane" / "schema"
# Settings with a safe default in production need not be set by the template.
REQUIRED_IN_PRODUCTION = {"env", "storage_connection", "deployment_id", "jwt_secret", "jwt_secret_previous",
                          "encryption_key"}
# public_url is the platform's WEBSITE_HOSTNAME in Azure (the site's defaultHostName): see
# test_the_public_url_is_the_sites_default_host_name.
# Identity-based connection: the host and the app read the account name, never a key.
IDENTITY_STORAGE = {"AzureWebJobsStorage": "AzureWebJobsStorage__accountName"}
KEY_VAULT_SETTINGS = ("TENSORANT_JWT_SECRET", "TENSORANT_JWT_SECRET_PREVIOUS", "TENSORANT_ENCRYPTION_KEY")


@pytest.fixture(scope="module")
def template() -> Template:
    return parse(BICEP.read_text())


def site(t: Template) -> Resource:
    (app,) = t.of_type("Microsoft.Web/sites")
    return app


def app_settings(t: Template) -> dict[str, Any]:
    return {s["name"]: s["value"] for s in site(t).body["properties"]["siteConfig"]["appSettings"]}


def text_of(value: Any) -> str:
    return value.text if isinstance(value, Expr) else str(value)


def test_the_site_sets_every_setting_the_app_needs_in_production(template: Template) -> None:
    names = set(app_settings(template))
    wanted = {IDENTITY_STORAGE.get(_ENV[f], _ENV[f]) for f in REQUIRED_IN_PRODUCTION}
    assert wanted - names == set(), f"infra/controlplane/main.bicep does not set {sorted(wanted - names)}"
    assert app_settings(template)["TENSORANT_ENV"] == "production"
    assert "APPLICATIONINSIGHTS_CONNECTION_STRING" in names


def test_secrets_are_key_vault_references_and_storage_has_no_key(template: Template) -> None:
    settings = app_settings(template)
    for name in KEY_VAULT_SETTINGS:
        assert re.fullmatch(r"'@Microsoft\.KeyVault\(VaultName=\$\{vault\.name\};SecretName=[a-z-]+\)'",
                            text_of(settings[name])), f"{name} is not a versionless Key Vault reference"
    text = BICEP.read_text()
    # No account key anywhere: not in a setting, not listed by the template, and the account refuses keys.
    assert "listKeys" not in text and "AccountKey" not in text and "AzureWebJobsStorage:" not in text
    (storage,) = template.of_type("Microsoft.Storage/storageAccounts")
    assert storage.body["properties"]["allowSharedKeyAccess"] is False
    roles = template.variables["roles"]
    granted = {text_of(r.body["properties"]["roleDefinitionId"]).split("roles.")[1].rstrip(")")
               for r in template.of_type("Microsoft.Authorization/roleAssignments")}
    assert granted == {"storageBlobDataOwner", "storageQueueDataContributor", "storageTableDataContributor",
                       "keyVaultSecretsUser"}
    # The built-in role ids (the same in every tenant).
    assert roles["storageQueueDataContributor"] == "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
    assert roles["keyVaultSecretsUser"] == "4633458b-17de-408a-b874-0445c86b69e6"
    (vault,) = template.of_type("Microsoft.KeyVault/vaults")
    assert vault.body["properties"]["enableRbacAuthorization"] is True


def _deploy(t: Template, params: dict[str, str], state: dict[str, Any]) -> None:
    """What ARM does with this template, as far as settings, code and secrets go: a resource whose
    condition is false is skipped; the site's appSettings replace every app setting (PUT semantics);
    a `sites/config` 'appsettings' resource replaces them again; a secret resource writes its value."""
    def given(expr: str) -> bool:
        m = re.fullmatch(r"!empty\((\w+)\)", expr)
        assert m, f"condition not understood: {expr}"
        return bool(params.get(m.group(1)))

    live = [r for r in t.resources.values() if r.condition is None or given(r.condition)]
    for r in live:
        if r.type == "Microsoft.Web/sites":
            state["settings"] = {s["name"]: text_of(s["value"]) for s in r.body["properties"]["siteConfig"]["appSettings"]}
        if r.type == "Microsoft.Web/sites/config" and r.body.get("name") == "appsettings":
            state["settings"] = {k: text_of(v) for k, v in r.body["properties"].items()}
        if r.type == "Microsoft.KeyVault/vaults/secrets":
            state["secrets"][r.body["name"]] = params[text_of(r.body["properties"]["value"])]


def _publish(t: Template, state: dict[str, Any]) -> None:
    """`func azure functionapp publish`: on Flex Consumption the package goes to the deployment container;
    on Linux Consumption its URL is written into the WEBSITE_RUN_FROM_PACKAGE app setting."""
    config = site(t).body["properties"].get("functionAppConfig")
    if config:
        state["container"] = "package-v1"
    else:
        state["settings"]["WEBSITE_RUN_FROM_PACKAGE"] = "https://.../package-v1.zip"


def _code(t: Template, state: dict[str, Any]) -> str | None:
    if site(t).body["properties"].get("functionAppConfig"):
        return state.get("container")
    return state["settings"].get("WEBSITE_RUN_FROM_PACKAGE")


def test_a_second_deployment_keeps_the_code_and_a_rotated_jwt_secret(template: Template) -> None:
    state: dict[str, Any] = {"settings": {}, "secrets": {}}
    first = {"deploymentId": "prod", "jwtSecret": "a" * 40, "encryptionKey": "k" * 44}
    _deploy(template, first, state)
    _publish(template, state)
    # The README's rotation: Key Vault only, no template edit, no hand-set app setting.
    state["secrets"]["jwt-secret-previous"] = state["secrets"]["jwt-secret"]
    state["secrets"]["jwt-secret"] = "b" * 40
    settings_before = dict(state["settings"])
    _deploy(template, {"deploymentId": "prod"}, state)  # the second run, as README says: no secrets
    assert _code(template, state) == "package-v1"
    assert state["settings"] == settings_before
    assert state["secrets"] == {"jwt-secret": "b" * 40, "jwt-secret-previous": "a" * 40, "encryption-key": "k" * 44}
    # Re-run with the first deployment's parameters by mistake: the rotation is undone, the code stays.
    _deploy(template, first, state)
    assert _code(template, state) == "package-v1"


def test_the_old_template_shape_loses_its_code_on_the_second_run() -> None:
    # The simulation can fail: Linux Consumption with a sites/config 'appsettings' resource (the template
    # before Flex) drops WEBSITE_RUN_FROM_PACKAGE at the second deployment.
    old = parse("""
resource app 'Microsoft.Web/sites@2023-01-01' = {
  name: 'x'
  properties: { siteConfig: { appSettings: [] } }
}
resource settings 'Microsoft.Web/sites/config@2023-01-01' = {
  parent: app
  name: 'appsettings'
  properties: { TENSORANT_ENV: 'production' }
}
""")
    state: dict[str, Any] = {"settings": {}, "secrets": {}}
    _deploy(old, {}, state)
    _publish(old, state)
    assert _code(old, state)
    _deploy(old, {}, state)
    assert _code(old, state) is None


def test_no_resource_replaces_the_app_settings_and_no_setting_flex_refuses(template: Template) -> None:
    assert template.of_type("Microsoft.Web/sites/config") == []
    # Flex Consumption takes the runtime and the package from functionAppConfig and refuses these settings.
    refused = {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE",
               "SCM_DO_BUILD_DURING_DEPLOYMENT", "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "WEBSITE_CONTENTSHARE"}
    assert refused & set(app_settings(template)) == set()


def test_the_plan_is_flex_consumption_with_deliberate_limits(template: Template) -> None:
    (plan,) = template.of_type("Microsoft.Web/serverfarms")
    assert plan.body["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    config = site(template).body["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    scale = config["scaleAndConcurrency"]
    params = template.params
    assert text_of(scale["instanceMemoryMB"]) == "instanceMemoryMB" and params["instanceMemoryMB"]["default"] == 4096
    assert "@allowed([ 2048, 4096 ])" in params["instanceMemoryMB"]["decorators"]
    assert text_of(scale["maximumInstanceCount"]) == "maximumInstanceCount"
    assert params["maximumInstanceCount"]["default"] == 40
    assert {"@minValue(40)", "@maxValue(1000)"} <= set(params["maximumInstanceCount"]["decorators"])
    assert params["httpPerInstanceConcurrency"]["default"] == 8
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer" and storage["authentication"] == {"type": "SystemAssignedIdentity"}
    # host.json's functionTimeout fits the plan (Flex: 30 min default, no maximum; Consumption's was 10 min).
    hours, minutes, seconds = (int(x) for x in json.loads((ROOT / "host.json").read_text())["functionTimeout"].split(":"))
    assert 0 < hours * 3600 + minutes * 60 + seconds


def test_alerts_watch_the_poison_queues_the_sweep_and_leaks(template: Template) -> None:
    import shared.metrics as metrics

    (rules,) = template.of_type("Microsoft.Insights/scheduledQueryRules")
    assert rules.loop == "alert in alerts"
    alerts = {a["name"]: a["query"] for a in template.variables["alerts"]}
    assert set(alerts) == {"poison-queue-not-empty", "sweep-did-not-finish", "leak-found", "no-telemetry"}
    assert f'"{metrics.POISON_DEPTH}"' in alerts["poison-queue-not-empty"]
    assert f'"{metrics.SWEEP_FINISHED}"' in alerts["sweep-did-not-finish"]
    assert f'"{metrics.SWEEP_FINDINGS}"' in alerts["leak-found"] and '"leak"' in alerts["leak-found"]


def _schema() -> dict[str, Any]:
    (path,) = SCHEMA_DIR.glob("microsoft.web-*.jsonc")
    return json.loads(path.read_text())


def _check_shape(value: Any, model: str, models: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    fields = models[model]
    if not isinstance(value, dict):
        return [f"{where}: an object ({model}) expected"]
    for key, sub in value.items():
        if key not in fields:
            problems.append(f"{where}.{key}: not a property of {model}")
            continue
        kind = fields[key]
        if isinstance(kind, str) and kind in models:
            problems += _check_shape(sub, kind, models, f"{where}.{key}")
        elif isinstance(kind, dict) and "enum" in kind and isinstance(sub, str) and sub not in kind["enum"]:
            problems.append(f"{where}.{key}: {sub!r} is not one of {kind['enum']}")
        elif isinstance(kind, dict) and "list" in kind and isinstance(sub, list) and kind["list"] in models:
            for i, item in enumerate(sub):
                problems += _check_shape(item, kind["list"], models, f"{where}.{key}[{i}]")
        elif kind == "int" and not isinstance(sub, (int, Expr)):
            problems.append(f"{where}.{key}: an int expected")
    return problems


def test_web_resources_match_the_rest_schema_of_their_api_version(template: Template) -> None:
    schema = _schema()
    bicep_only = {"parent", "scope", "dependsOn"}
    for resource, model in (("Microsoft.Web/sites", "Site"), ("Microsoft.Web/serverfarms", "AppServicePlan")):
        (r,) = template.of_type(resource)
        assert r.api_version == schema["api_version"], f"{resource}: checked against {schema['api_version']}"
        body = {k: v for k, v in r.body.items() if k not in bicep_only}
        assert _check_shape(body, model, schema["models"], resource) == []
    # The check can fail: a misspelt property and an enum value that does not exist.
    wrong = {"properties": {"functionAppConfig": {"runtime": {"name": "python3"}, "scaleAndConcurency": {}}}}
    assert len(_check_shape(wrong, "Site", schema["models"], "x")) == 2


def test_the_app_reads_the_identity_based_connection_the_template_sets(template: Template,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.data.tables import TableServiceClient
    from azure.storage.queue import QueueServiceClient

    from shared.storage_account import ACCOUNT_SETTING, service_client

    assert text_of(app_settings(template)[ACCOUNT_SETTING]) == "storage.name"
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    monkeypatch.setenv(ACCOUNT_SETTING, "taprodabc")
    tables = service_client(TableServiceClient, "table", "unused")
    queues = service_client(QueueServiceClient, "queue", "unused")
    assert tables.url.startswith("https://taprodabc.table.core.windows.net")
    assert queues.url.startswith("https://taprodabc.queue.core.windows.net")
    assert type(tables.credential).__name__ == "DefaultAzureCredential"
    # A connection string, where one is set (Azurite, make run), still wins.
    from shared.settings import AZURITE

    monkeypatch.setenv("AzureWebJobsStorage", AZURITE)
    assert "127.0.0.1" in service_client(TableServiceClient, "table", AZURITE).url



# ---------------------------------------------------------------- names (issue 41.7)

RG_ID = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/tensorant"
# Each resource type's naming rules (learn.microsoft.com: "Naming rules and restrictions for Azure resources").
NAME_RULES = {
    "microsoft.web/sites": r"[A-Za-z0-9][A-Za-z0-9-]{0,58}[A-Za-z0-9]",
    "microsoft.web/serverfarms": r"[A-Za-z0-9-]{1,60}",
    "microsoft.storage/storageaccounts": r"[a-z0-9]{3,24}",
    "microsoft.keyvault/vaults": r"(?!.*--)[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]",
    "microsoft.operationalinsights/workspaces": r"[A-Za-z0-9][A-Za-z0-9-]{2,61}[A-Za-z0-9]",
    "microsoft.insights/components": r"[^%&\\?/]{0,259}[^%&\\?/. ]",
    "microsoft.managedidentity/userassignedidentities": r"[A-Za-z0-9][A-Za-z0-9_-]{2,127}",
    "microsoft.insights/actiongroups": r"[^%&\\?/*<>:#]{1,260}",
    "microsoft.insights/scheduledqueryrules": r"[^*#&+:<>?@%{}\\/]{1,260}",
}
GLOBAL = {"microsoft.web/sites", "microsoft.storage/storageaccounts", "microsoft.keyvault/vaults"}


def _unique_string(*parts: str) -> str:
    """Like ARM's uniqueString: 13 lowercase letters and digits, deterministic in its arguments."""
    import base64
    import hashlib

    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return base64.b32encode(digest).decode().lower().replace("=", "")[:13]


def _split_args(text: str) -> list[str]:
    args, depth, start, quoted = [], 0, 0, False
    for i, c in enumerate(text):
        if c == "'":
            quoted = not quoted
        elif not quoted and c in "([{":
            depth += 1
        elif not quoted and c in ")]}":
            depth -= 1
        elif not quoted and c == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    args.append(text[start:])
    return [a.strip() for a in args if a.strip()]


def _evaluate(text: str, env: dict[str, Any]) -> Any:
    """The few Bicep expressions the template's names use: interpolated strings, take, toLower, replace,
    uniqueString, resourceGroup().id, params, variables and a loop item's fields."""
    text = text.strip()
    if text.startswith("'") and text.endswith("'"):
        out, i, body = [], 0, text[1:-1]
        while i < len(body):
            if body.startswith("${", i):
                depth, j = 1, i + 2
                while depth:
                    depth += {"{": 1, "}": -1}.get(body[j], 0)
                    j += 1
                out.append(str(_evaluate(body[i + 2:j - 1], env)))
                i = j
            else:
                out.append(body[i])
                i += 1
        return "".join(out)
    if text == "resourceGroup().id":
        return RG_ID
    if re.fullmatch(r"\d+", text):
        return int(text)
    call = re.fullmatch(r"(\w+)\((.*)\)", text, re.S)
    if call:
        args = [_evaluate(a, env) for a in _split_args(call.group(2))]
        fn = call.group(1)
        if fn == "uniqueString":
            return _unique_string(*args)
        if fn == "take":
            return args[0][:args[1]]
        if fn == "toLower":
            return args[0].lower()
        if fn == "replace":
            return args[0].replace(args[1], args[2])
        raise AssertionError(f"function {fn} not understood")
    value: Any = env[text.split(".")[0]]
    for part in text.split(".")[1:]:
        value = value[part]
    return value


def _names(t: Template, deployment_id: str) -> list[tuple[str, str]]:
    env: dict[str, Any] = {"deploymentId": deployment_id, "location": "eastus"}
    for var, value in t.variables.items():
        if isinstance(value, (Expr, str)) and var not in env:
            try:
                env[var] = _evaluate(text_of(value) if isinstance(value, Expr) else f"'{value}'", env)
            except (KeyError, AssertionError):
                pass  # not a name (an object, a list)
        else:
            env[var] = value
    out = []
    for r in t.resources.values():
        if "parent" in r.body or r.type.lower() == "microsoft.authorization/roleassignments":
            continue  # a child's name is fixed; a role assignment's is a guid()
        name = r.body["name"]
        items = [{}] if not r.loop else [{"alert": a} for a in t.variables["alerts"]]
        for item in items:
            out.append((r.type.lower(), _evaluate(text_of(name) if isinstance(name, Expr) else f"'{name}'",
                                                   {**env, **item})))
    return out


def test_every_name_fits_its_resource_types_rules_for_every_id_length(template: Template) -> None:
    """Before: the app was `tensorant-<id>` (a global name anyone may hold), the Key Vault name ended in "-"
    for a 17-character id and lost its unique suffix from 18, and the storage account from 22."""
    decorators = template.params["deploymentId"]["decorators"]
    longest = int(next(d for d in decorators if d.startswith("@maxLength"))[len("@maxLength("):-1])
    shortest = int(next(d for d in decorators if d.startswith("@minLength"))[len("@minLength("):-1])
    assert (shortest, longest) == (2, 31)  # the settings' own pattern for TENSORANT_DEPLOYMENT_ID
    for length in range(1, longest + 1):
        deployment_id = ("prod" + "x7" * 20)[:length]
        suffix = _unique_string(RG_ID, deployment_id)
        names = _names(template, deployment_id)
        assert {kind for kind, _ in names} == set(NAME_RULES), {kind for kind, _ in names} ^ set(NAME_RULES)
        for kind, name in names:
            assert re.fullmatch(NAME_RULES[kind], name), (length, kind, name)
            if kind in GLOBAL:
                assert suffix in name, (length, kind, name)  # unique whatever the id's length


def test_the_public_url_is_the_sites_default_host_name(template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.settings import load_settings

    assert "TENSORANT_PUBLIC_URL" not in app_settings(template)  # it cannot read its own site's defaultHostName
    assert "app.properties.defaultHostName" in BICEP.read_text()  # the `url` output
    monkeypatch.delenv("TENSORANT_PUBLIC_URL", raising=False)
    monkeypatch.setenv("WEBSITE_HOSTNAME", "tensorant-prod-abc.azurewebsites.net")
    assert load_settings().public_url == "https://tensorant-prod-abc.azurewebsites.net"
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", "https://api.example.com")  # a custom domain wins
    assert load_settings().public_url == "https://api.example.com"


# ---------------------------------------------------------------- telemetry (issue 41.8)


def test_telemetry_is_exported_once_by_every_worker_version(template: Template) -> None:
    host = json.loads((ROOT / "host.json").read_text())
    assert host["telemetryMode"] == "OpenTelemetry"  # else the host logs every exported message again
    settings = app_settings(template)
    assert settings["PYTHON_ENABLE_OPENTELEMETRY"] == "true"  # worker 4.34
    assert settings["PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"] == "true"  # worker 4.38 and later
    from shared.log import SERVICE

    assert settings["PYTHON_APPLICATIONINSIGHTS_LOGGER_NAME"] == SERVICE  # the app's records, not the worker's


def test_the_sweep_alert_does_not_fire_on_missing_telemetry_and_another_does(template: Template) -> None:
    alerts = {a["name"]: a["query"] for a in template.variables["alerts"]}
    assert "exported > 0" in alerts["sweep-did-not-finish"]
    assert "where exported == 0" in alerts["no-telemetry"] and "print exported = 0" in alerts["no-telemetry"]


# ---------------------------------------------------------------- Key Vault references and defence in depth


def test_the_app_starts_after_its_secrets_and_their_grant(template: Template) -> None:
    """Issue 41.9: an unresolved Key Vault reference at first start makes the worker index 0 functions."""
    app = site(template)
    depends = {text_of(d) for d in app.body["dependsOn"]}
    assert {"secretsRole", "jwtSecretValue", "jwtSecretPreviousValue", "encryptionKeyValue"} <= depends
    assert text_of(app.body["properties"]["keyVaultReferenceIdentity"]) == "secretsIdentity.id"
    role = template.resources["secretsRole"]
    assert text_of(role.body["properties"]["principalId"]) == "secretsIdentity.properties.principalId"
    assert "app." not in text_of(role.body["name"])  # nothing in the grant waits for the app


def test_defence_in_depth_decisions_are_in_the_template(template: Template) -> None:
    """Issue 41.10, each decided here and in docs/security.md "Deployment"."""
    (vault,) = template.of_type("Microsoft.KeyVault/vaults")
    assert vault.body["properties"]["enablePurgeProtection"] is True
    assert vault.body["properties"]["publicNetworkAccess"] == "Enabled"
    (storage,) = template.of_type("Microsoft.Storage/storageAccounts")
    assert storage.body["properties"]["publicNetworkAccess"] == "Enabled"
    (insights,) = template.of_type("Microsoft.Insights/components")
    assert insights.body["properties"]["DisableLocalAuth"] is False
    policies = {r.body["name"]: r.body["properties"]["allow"]
                for r in template.of_type("Microsoft.Web/sites/basicPublishingCredentialsPolicies")}
    assert policies == {"scm": False, "ftp": False}
    text = (ROOT / "docs" / "security.md").read_text()
    for decision in ("purge protection", "basic-auth publishing", "DisableLocalAuth", "public network"):
        assert decision in text, decision
