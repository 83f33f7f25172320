import azure.functions as func

from shared import http
from shared.services.api import usage

bp = func.Blueprint()


@bp.route(route="usage", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
@http.api(summary="The organization's usage since a date (?since=2026-01-01): runs, GPU hours, cost per provider")
def get_usage(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: usage.usage(ctx, http.principal(ctx, req), req.params.get("since")))
