// The Tensorant control plane in Azure: one Python function app on the Flex Consumption plan (FC1),
// its storage account (queues, tables, the host's state and the deployment package), Application
// Insights with alerts, and a Key Vault holding the secrets. Customer-side templates (AWS IAM
// policy, Azure custom roles) are in ../aws and ../azure. Why this plan and these limits: ../README.md.
//
// First deployment (the secrets are written to Key Vault only when given; the app's URL is the `url` output):
//   az deployment group create -g <rg> -f infra/controlplane/main.bicep \
//     -p deploymentId=prod jwtSecret=<random, 32+ bytes> encryptionKey=<base64 of 32 random bytes>
// Later deployments: the same command without the secrets. Nothing the operator changed in Key Vault
// (a JWT rotation) is overwritten, and the code stays: on Flex Consumption it lives in the deployment
// container, not in an app setting (a Linux Consumption app lost its WEBSITE_RUN_FROM_PACKAGE setting
// to every re-run: azure-functions-host#8189, bicep#3991).
// Every app setting is here, in the site's siteConfig: a setting added by hand is replaced at the next
// deployment, so the rotation lives in Key Vault (README "Deploying"), never in a hand-set setting.
// Not deployed from this repository's CI (no Azure account there); tests/test_infra.py renders it and
// checks its Microsoft.Web resources against the REST schema in schema/.

@description('Short id (2-31 lowercase letters and digits, no hyphen) written into every ownership tag; the sweeper touches only resources carrying it.')
@minLength(2)
@maxLength(31)
param deploymentId string

param location string = resourceGroup().location

@secure()
@description('HS256 secret for user and agent tokens (32+ bytes). Give it on the first deployment only: later ones keep what Key Vault holds.')
param jwtSecret string = ''

@secure()
@description('Base64 of 32 random bytes: the AES-GCM key sealing connection secrets. First deployment only, like jwtSecret.')
param encryptionKey string = ''

@description('Training container image the agent runs in.')
param containerImage string = 'ghcr.io/tensorant/trainer:2026.11'

@description('Memory of one instance (MB). 4096: a verification holds up to MEMORY_BOUND_BYTES (about 14 MiB) beside a recovery body of up to 90 MiB, times the invocations on one instance (infra/README.md).')
@allowed([ 2048, 4096 ])
param instanceMemoryMB int = 4096

@description('Most instances the app scales out to (40 is the plan\'s lowest ceiling). Bounds the bill and how hard the app can call a customer\'s cloud API.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('HTTP requests one instance serves at once. Bodies are read whole (up to 90 MiB for a recovery archive): 8 keeps them under 1 GiB.')
@minValue(1)
@maxValue(1000)
param httpPerInstanceConcurrency int = 8

@description('Where the alerts are mailed; empty: the alerts fire in the portal only.')
param alertEmail string = ''

// Names (issue 41.7), each within its resource type's rules for every id of 2-31 characters
// (tests/test_infra.py computes them all): the app, the vault and the storage account are global names,
// so each carries a suffix unique to this resource group and id (uniqueString: 13 lowercase letters and
// digits). The app: 2-60 letters, digits, hyphens. Storage: 3-24 lowercase letters and digits. Key Vault:
// 3-24 letters, digits and single hyphens, starting with a letter, not ending with a hyphen.
var suffix = uniqueString(resourceGroup().id, deploymentId)
var name = 'tensorant-${deploymentId}'
var siteName = '${name}-${suffix}'
var storageName = 'ta${take(deploymentId, 9)}${suffix}'
var deploymentContainer = 'app-package'
var vaultName = 'kv${take(deploymentId, 9)}${suffix}'
// Built-in role definition ids (the same in every tenant).
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  keyVaultSecretsUser: '4633458b-17de-408a-b874-0445c86b69e6'
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageName
  location: location
  sku: { name: 'Standard_LRS' }
  kind: 'StorageV2'
  properties: {
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    supportsHttpsTrafficOnly: true
    // Identity only: no account key to leak, none in any app setting.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    // Public network, deliberately (docs/security.md "Deployment"): the Flex app reaches it without VNet
    // integration, and without a key nothing but an identity holding a data role gets in.
    publicNetworkAccess: 'Enabled'
    networkAcls: { defaultAction: 'Allow', bypass: 'AzureServices' }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource packageContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainer
}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: name
  location: location
  properties: {
    sku: { name: 'PerGB2018' }
    retentionInDays: 30
  }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: name
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    // Key (connection string) ingestion stays on: the Python worker's exporter is configured by the
    // connection string only (docs/security.md "Deployment").
    DisableLocalAuth: false
  }
}

resource plan 'Microsoft.Web/serverfarms@2025-05-01' = {
  name: name
  location: location
  kind: 'functionapp'
  sku: { name: 'FC1', tier: 'FlexConsumption' }
  properties: { reserved: true }
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: vaultName
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: { family: 'A', name: 'standard' }
    enableRbacAuthorization: true
    // The encryption key seals every connection secret: a deleted vault or secret must stay recoverable.
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    publicNetworkAccess: 'Enabled' // the app resolves its references over the public endpoint (no VNet)
  }
}

// The identity the app reads its Key Vault references with. Created, and granted Key Vault Secrets User,
// before the app exists (issue 41.9): with the app's own system identity the grant can only follow the app,
// and a first start with unresolved references indexes 0 functions (LESSONS).
resource secretsIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${name}-secrets'
  location: location
}

// Written only when given: a re-run without the parameters leaves a rotated secret alone.
resource jwtSecretValue 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(jwtSecret)) {
  parent: vault
  name: 'jwt-secret'
  properties: { value: jwtSecret }
}

// The rotation's "previous" secret starts equal to the current one (accepting the same key twice is
// harmless); a rotation copies the current secret here before replacing it (README "Deploying").
resource jwtSecretPreviousValue 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(jwtSecret)) {
  parent: vault
  name: 'jwt-secret-previous'
  properties: { value: jwtSecret }
}

resource encryptionKeyValue 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(encryptionKey)) {
  parent: vault
  name: 'encryption-key'
  properties: { value: encryptionKey }
}

resource app 'Microsoft.Web/sites@2025-05-01' = {
  name: siteName
  location: location
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned, UserAssigned'
    userAssignedIdentities: { '${secretsIdentity.id}': {} }
  }
  // The secrets and the grant to read them exist before the app first starts (issue 41.9).
  dependsOn: [ secretsRole, jwtSecretValue, jwtSecretPreviousValue, encryptionKeyValue ]
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: secretsIdentity.id
    functionAppConfig: {
      // The published package: a blob in this container, read with the app's identity.
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainer}'
          authentication: { type: 'SystemAssignedIdentity' }
        }
      }
      runtime: { name: 'python', version: '3.11' }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
        triggers: { http: { perInstanceConcurrency: httpPerInstanceConcurrency } }
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      // Every app setting the app reads in Azure. Versionless Key Vault references: a new secret
      // version is picked up at the next restart (or within a day), with no change here.
      appSettings: [
        { name: 'AzureWebJobsStorage__accountName', value: storage.name }
        { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: insights.properties.ConnectionString }
        // Both names (issue 41.8): worker 4.34 reads the first, 4.38 and later the second; host.json's
        // telemetryMode OpenTelemetry stops the host from logging the same messages again, and the logger
        // name exports the app's records only (not the worker's own).
        { name: 'PYTHON_ENABLE_OPENTELEMETRY', value: 'true' }
        { name: 'PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY', value: 'true' }
        { name: 'PYTHON_APPLICATIONINSIGHTS_LOGGER_NAME', value: 'tensorant' }
        { name: 'TENSORANT_ENV', value: 'production' }
        { name: 'TENSORANT_DEPLOYMENT_ID', value: deploymentId }
        // No TENSORANT_PUBLIC_URL: the app takes https://<WEBSITE_HOSTNAME>, the platform's defaultHostName
        // (issue 41.7; a setting cannot read its own site's defaultHostName). Set it for a custom domain.
        { name: 'TENSORANT_JWT_SECRET', value: '@Microsoft.KeyVault(VaultName=${vault.name};SecretName=jwt-secret)' }
        { name: 'TENSORANT_JWT_SECRET_PREVIOUS', value: '@Microsoft.KeyVault(VaultName=${vault.name};SecretName=jwt-secret-previous)' }
        { name: 'TENSORANT_ENCRYPTION_KEY', value: '@Microsoft.KeyVault(VaultName=${vault.name};SecretName=encryption-key)' }
        { name: 'TENSORANT_CONTAINER_IMAGE', value: containerImage }
      ]
    }
  }
}

// The app's identity: the host's state, the package and the queues and tables (blob, queue, table
// data roles), and the secrets.
resource blobRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, app.id, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: app.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource queueRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, app.id, roles.storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: app.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource tableRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, app.id, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: app.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource secretsRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vault.id, secretsIdentity.id, roles.keyVaultSecretsUser)
  scope: vault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.keyVaultSecretsUser)
    principalId: secretsIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// No basic-auth publishing (issue 41.10): deployments use Entra ID (az / func publish with a token).
resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2023-12-01' = {
  parent: app
  name: 'scm'
  properties: { allow: false }
}

resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2023-12-01' = {
  parent: app
  name: 'ftp'
  properties: { allow: false }
}

// Alerts on the app's own metrics (shared/metrics.py; OpenTelemetry, stored as customMetrics).
resource alertGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: '${name}-alerts'
  location: 'global'
  properties: {
    groupShortName: 'tensorant'
    enabled: true
    emailReceivers: [ { name: 'operator', emailAddress: alertEmail, useCommonAlertSchema: true } ]
  }
}

var alerts = [
  {
    name: 'poison-queue-not-empty'
    description: 'A step message failed five times and waits in a poison queue (admin API: /api/platform/queues).'
    severity: 2
    query: 'customMetrics | where name == "tensorant.queue.poison_depth" | summarize depth = max(value) by queue = tostring(customDimensions.queue) | where depth > 0'
  }
  {
    name: 'sweep-did-not-finish'
    description: 'No sweep finished in 30 minutes (it runs every 5) while the app exports its other metrics: leaks go unnoticed and stuck releases are not retried.'
    severity: 1
    // Fail safe (issue 41.8): only while other tensorant metrics arrive; no metric at all is the alert below.
    query: 'customMetrics | where name startswith "tensorant." | summarize exported = count(), finished = countif(name == "tensorant.sweep.finished") | where exported > 0 and finished == 0'
  }
  {
    name: 'no-telemetry'
    description: 'The app exported no metric in 30 minutes: it is down, or its worker exports none (PYTHON_ENABLE_OPENTELEMETRY / PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY, infra/README.md).'
    severity: 1
    query: 'union (print exported = 0), (customMetrics | where name startswith "tensorant." | summarize exported = count()) | summarize exported = sum(exported) | where exported == 0'
  }
  {
    name: 'leak-found'
    description: 'The sweeper found a marked resource with no live run: it bills until it is removed.'
    severity: 2
    query: 'customMetrics | where name == "tensorant.sweep.findings" | where tostring(customDimensions.kind) == "leak" | summarize found = sum(value) | where found > 0'
  }
]

resource alertRules 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = [for alert in alerts: {
  name: '${name}-${alert.name}'
  location: location
  properties: {
    displayName: '${name}: ${alert.name}'
    description: alert.description
    severity: alert.severity
    enabled: true
    scopes: [ insights.id ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT30M'
    criteria: {
      allOf: [
        {
          query: alert.query
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: { numberOfEvaluationPeriods: 1, minFailingPeriodsToAlert: 1 }
        }
      ]
    }
    actions: { actionGroups: empty(alertEmail) ? [] : [ alertGroup.id ] }
  }
}]

output url string = 'https://${app.properties.defaultHostName}/api'
output functionApp string = app.name
output keyVault string = vault.name
