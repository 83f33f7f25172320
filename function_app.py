"""The Functions app: builds the FunctionApp and registers the blueprints, nothing else."""

import azure.functions as func

from functions import (
    admin,
    agent,
    base_models,
    catalog,
    connections,
    console,
    deliver_webhook,
    docs,
    heartbeat_check,
    launch,
    org_limits,
    org_secrets,
    projects,
    prune_history,
    refresh_catalog,
    release,
    retain,
    runs,
    stop_idle,
    sweep_account,
    sweeper,
    usage,
    validate_connection,
    verify_adapter,
    webhooks,
)
from shared.log import configure as configure_logging
from shared.settings import get_settings

# The app's records propagate to the worker's root handler (level and invocation id reach Application
# Insights); the Azure SDK's per-request lines are kept to warnings.
configure_logging()

# Settings are checked at start: a bad production setting fails the host here, at import,
# not the first request (get_settings only reads the environment; no I/O).
get_settings()

app = func.FunctionApp()
for module in (connections, catalog, projects, runs, usage, org_limits, agent, admin, validate_connection,
               refresh_catalog, launch, verify_adapter, retain, release, sweep_account, stop_idle, heartbeat_check,
               sweeper, base_models, org_secrets, console, webhooks, deliver_webhook, prune_history):
    app.register_functions(module.bp)
# The API reference describes this app's own functions: it is given the app, it does not import it.
docs.attach(app)
