"""Platform admin API. Served under /api/platform/...: the Functions host reserves every
route that starts with "admin" (even behind the /api prefix), so /api/admin paths cannot
be registered on a real host (README.md, "Architecture")."""

import azure.functions as func

from shared import http
from shared.models import ReplayRequest, SweepRequest
from shared.services.api import admin

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="platform/queues", methods=["GET"], auth_level=ANON)
@http.api(summary="Queue and poison-queue depths (admins)")
def queues(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.queues(ctx, http.principal(ctx, req)))


@bp.route(route="platform/queues/{queue}/poison", methods=["GET"], auth_level=ANON)
@http.api(summary="Poison messages with their run and last error (admins)")
def poison(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.poison(ctx, http.principal(ctx, req), req.route_params["queue"]))


@bp.route(route="platform/queues/{queue}/poison/replay", methods=["POST"], auth_level=ANON)
@http.api(summary="Replay one poison message (message_id) or all (null)", request=ReplayRequest)
def replay(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.replay(ctx, http.principal(ctx, req), req.route_params["queue"],
                                             http.parse(req, ReplayRequest).message_id))


@bp.route(route="platform/queues/{queue}/poison/{message_id}", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Discard one poison message (audited)")
def discard(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.discard(ctx, http.principal(ctx, req), req.route_params["queue"],
                                              req.route_params["message_id"]))


@bp.route(route="platform/sweep", methods=["POST"], auth_level=ANON)
@http.api(summary="Start a sweep of every compute connection (one message each); dry_run reports without "
          "acting. Answers 202 at once with the sweep's id: GET its status_url for progress and findings",
          request=SweepRequest, status=202)
def sweep(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.sweep(ctx, http.principal(ctx, req), http.parse(req, SweepRequest)), status=202)


@bp.route(route="platform/sweeps/{sweep_id}", methods=["GET"], auth_level=ANON)
@http.api(summary="An admin sweep's progress (accounts done of all) and its findings so far")
def sweep_report(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: admin.sweep_report(ctx, http.principal(ctx, req), req.route_params["sweep_id"]))
