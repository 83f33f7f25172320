"""The Functions app: builds the FunctionApp and registers the blueprints, nothing else."""

import azure.functions as func

from functions import (
    admin,
    agent,
    catalog,
    connections,
    docs,
    heartbeat_check,
    launch,
    projects,
    refresh_catalog,
    release,
    retain,
    runs,
    sweeper,
    usage,
    validate_connection,
    verify_adapter,
)

app = func.FunctionApp()
for module in (connections, catalog, projects, runs, usage, agent, admin, validate_connection, refresh_catalog,
               launch, verify_adapter, retain, release, heartbeat_check, sweeper):
    app.register_functions(module.bp)
# The API reference describes this app's own functions: it is given the app, it does not import it.
docs.attach(app)
