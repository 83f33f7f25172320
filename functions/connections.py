import azure.functions as func

from shared import http
from shared.models import ConnectionView
from shared.runs.org_backends import STORAGE_SLOT, compute_connection_slot
from shared.services.api import connections

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="connections/compute/{provider}", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save a compute connection (owners); checks run in the background",
          request="provider config", response=ConnectionView, status=202)
def save_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.save_compute(
        ctx, http.principal(ctx, req), req.route_params["provider"], http.json_body(req)), status=202)


@bp.route(route="connections/compute/{provider}", methods=["GET"], auth_level=ANON)
@http.api(summary="Show a compute connection (secrets are never returned)", response=ConnectionView)
def get_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.get_one(ctx, http.principal(ctx, req),
                                                        compute_connection_slot(req.route_params["provider"])))


@bp.route(route="connections/compute/{provider}", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete a compute connection (owners; refused while runs hold machines)", status=204)
def delete_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.delete_compute(ctx, http.principal(ctx, req), req.route_params["provider"]))


@bp.route(route="connections/compute/{provider}/check", methods=["POST"], auth_level=ANON)
@http.api(summary="Run the connection's checks again", response=ConnectionView, status=202)
def check_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.request_check(ctx, http.principal(ctx, req), req.route_params["provider"]),
                        status=202)


# Named compute connections ({provider}/{name}: another account or region of the provider) live under
# .../{provider}/named/{name}: one segment more than .../{provider}/check, so a connection named
# "check" is .../aws/named/check and no route is ambiguous.
def _named(req: func.HttpRequest) -> str:
    return connections.connection_name(req.route_params["provider"], req.route_params["name"])


@bp.route(route="connections/compute/{provider}/named/{name}", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save a named compute connection {provider}/{name} (owners); checks run in the background",
          request="provider config", response=ConnectionView, status=202)
def save_named_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.save_compute(ctx, http.principal(ctx, req), _named(req), http.json_body(req)),
                        status=202)


@bp.route(route="connections/compute/{provider}/named/{name}", methods=["GET"], auth_level=ANON)
@http.api(summary="Show a named compute connection (secrets are never returned)", response=ConnectionView)
def get_named_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.get_one(ctx, http.principal(ctx, req), compute_connection_slot(_named(req))))


@bp.route(route="connections/compute/{provider}/named/{name}", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete a named compute connection (owners; refused while runs hold machines)", status=204)
def delete_named_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.delete_compute(ctx, http.principal(ctx, req), _named(req)))


@bp.route(route="connections/compute/{provider}/named/{name}/check", methods=["POST"], auth_level=ANON)
@http.api(summary="Run a named connection's checks again", response=ConnectionView, status=202)
def check_named_compute(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.request_check(ctx, http.principal(ctx, req), _named(req)), status=202)


@bp.route(route="connections/storage", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save the organization's storage connection (owners)", request="storage config",
          response=ConnectionView, status=202)
def save_storage(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.save_storage(ctx, http.principal(ctx, req), http.json_body(req)), status=202)


@bp.route(route="connections/storage", methods=["GET"], auth_level=ANON)
@http.api(summary="Show the storage connection", response=ConnectionView)
def get_storage(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.get_one(ctx, http.principal(ctx, req), STORAGE_SLOT))


@bp.route(route="connections", methods=["GET"], auth_level=ANON)
@http.api(summary="All of the organization's connections")
def list_connections(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.list_all(ctx, http.principal(ctx, req)))


@bp.route(route="connections/runpod/volumes", methods=["GET"], auth_level=ANON)
@http.api(summary="The RunPod account's network volumes, to pick one as storage (owners)")
def runpod_volumes(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: connections.runpod_volumes(ctx, http.principal(ctx, req)))
