// The Tensorant control plane in Azure: one Python function app (Linux consumption),
// its storage account (queues, tables, the host's own state), Application Insights,
// and a Key Vault holding the two secrets the app needs. Customer-side templates (AWS
// IAM policy, Azure custom roles) are in ../aws and ../azure.
//
// Deploy: az deployment group create -g <rg> -f infra/controlplane/main.bicep \
//           -p deploymentId=prod jwtSecret=<random> encryptionKey=<base64 of 32 random bytes>
// then publish the code: func azure functionapp publish <app name> (remote build reads requirements.txt).
// Not deployed from this repository's CI (no Azure account there); tests/test_infra.py
// checks that every setting the app requires in production is set here.

@description('Short id (2-31 lowercase letters and digits, no hyphen) written into every ownership tag; the sweeper touches only resources carrying it.')
@minLength(2)
@maxLength(31)
param deploymentId string

param location string = resourceGroup().location

@secure()
@description('HS256 secret for user and agent tokens.')
param jwtSecret string

@secure()
@description('Base64 of 32 random bytes: the AES-GCM key sealing connection secrets.')
param encryptionKey string

@description('Training container image the agent runs in.')
param containerImage string = 'ghcr.io/tensorant/trainer:2026.11'

var name = 'tensorant-${deploymentId}'
var storageName = take(toLower(replace('ta${deploymentId}${uniqueString(resourceGroup().id)}', '-', '')), 24)

resource storage 'Microsoft.Storage/storageAccounts@2023-01-01' = {
  name: storageName
  location: location
  sku: { name: 'Standard_LRS' }
  kind: 'StorageV2'
  properties: {
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    supportsHttpsTrafficOnly: true
  }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: name
  location: location
  kind: 'web'
  properties: { Application_Type: 'web' }
}

resource plan 'Microsoft.Web/serverfarms@2023-01-01' = {
  name: name
  location: location
  sku: { name: 'Y1', tier: 'Dynamic' }
  kind: 'linux'
  properties: { reserved: true }
}

resource app 'Microsoft.Web/sites@2023-01-01' = {
  name: name
  location: location
  kind: 'functionapp,linux'
  identity: { type: 'SystemAssigned' }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      linuxFxVersion: 'Python|3.11'
      ftpsState: 'Disabled'
      minTlsVersion: '1.2'
    }
  }
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: take('kv-${replace(name, 'tensorant-', 'ta-')}-${uniqueString(resourceGroup().id)}', 24)
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: { family: 'A', name: 'standard' }
    enableRbacAuthorization: false
    accessPolicies: [
      {
        tenantId: subscription().tenantId
        objectId: app.identity.principalId
        permissions: { secrets: [ 'get' ] }
      }
    ]
  }
}

resource jwtSecretRef 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  parent: vault
  name: 'jwt-secret'
  properties: { value: jwtSecret }
}

resource encryptionKeyRef 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  parent: vault
  name: 'encryption-key'
  properties: { value: encryptionKey }
}

var storageConnection = 'DefaultEndpointsProtocol=https;AccountName=${storage.name};AccountKey=${storage.listKeys().keys[0].value};EndpointSuffix=${environment().suffixes.storage}'

resource settings 'Microsoft.Web/sites/config@2023-01-01' = {
  parent: app
  name: 'appsettings'
  properties: {
    FUNCTIONS_EXTENSION_VERSION: '~4'
    FUNCTIONS_WORKER_RUNTIME: 'python'
    SCM_DO_BUILD_DURING_DEPLOYMENT: 'true'
    AzureWebJobsStorage: storageConnection
    APPLICATIONINSIGHTS_CONNECTION_STRING: insights.properties.ConnectionString
    TENSORANT_ENV: 'production'
    TENSORANT_DEPLOYMENT_ID: deploymentId
    TENSORANT_PUBLIC_URL: 'https://${app.properties.defaultHostName}'
    TENSORANT_JWT_SECRET: '@Microsoft.KeyVault(SecretUri=${jwtSecretRef.properties.secretUri})'
    TENSORANT_ENCRYPTION_KEY: '@Microsoft.KeyVault(SecretUri=${encryptionKeyRef.properties.secretUri})'
    TENSORANT_CONTAINER_IMAGE: containerImage
  }
}

output url string = 'https://${app.properties.defaultHostName}/api'
output functionApp string = app.name
