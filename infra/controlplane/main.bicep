// The Tensorant control plane in Azure: one Python function app on the Flex Consumption plan (FC1),
// its storage account (queues, tables, the host's state and the deployment package), Application
// Insights with alerts, and a Key Vault holding the secrets. Customer-side templates (AWS IAM
// policy, Azure custom roles) are in ../aws and ../azure. Why this plan and these limits: ../README.md.
//
// First deployment (the secrets are written to Key Vault only when given):
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

@description('Memory of one instance (MB). 4096: the adapter verifier holds up to about 2 GiB, plus the worker and the other invocations on the instance (infra/README.md).')
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

var name = 'tensorant-${deploymentId}'
var storageName = take(toLower(replace('ta${deploymentId}${uniqueString(resourceGroup().id)}', '-', '')), 24)
var deploymentContainer = 'app-package'
var vaultName = take('kv-${replace(name, 'tensorant-', 'ta-')}-${uniqueString(resourceGroup().id)}', 24)
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
  }
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
  name: name
  location: location
  kind: 'functionapp,linux'
  identity: { type: 'SystemAssigned' }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
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
        { name: 'PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY', value: 'true' }
        { name: 'TENSORANT_ENV', value: 'production' }
        { name: 'TENSORANT_DEPLOYMENT_ID', value: deploymentId }
        { name: 'TENSORANT_PUBLIC_URL', value: 'https://${name}.azurewebsites.net' }
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
  name: guid(vault.id, app.id, roles.keyVaultSecretsUser)
  scope: vault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.keyVaultSecretsUser)
    principalId: app.identity.principalId
    principalType: 'ServicePrincipal'
  }
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
    description: 'No sweep finished in 30 minutes (it runs every 5): leaks go unnoticed and stuck releases are not retried.'
    severity: 1
    query: 'customMetrics | where name == "tensorant.sweep.finished" | summarize finished = count() | where finished == 0'
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
