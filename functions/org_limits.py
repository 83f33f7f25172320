import azure.functions as func

from shared import http
from shared.services.api import quotas

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="org/limits", methods=["GET"], auth_level=ANON)
@http.api(summary="The organization's run limits (quotas and the run rate limit)", response=quotas.OrgLimits)
def get_limits(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: quotas.view(ctx, http.principal(ctx, req)))


@bp.route(route="org/limits", methods=["PUT"], auth_level=ANON)
@http.api(summary="Set the organization's run limits (owner); omitted fields keep their value",
          request=quotas.OrgLimits, response=quotas.LimitsAnswer)
def put_limits(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: quotas.put(ctx, http.principal(ctx, req), http.json_body(req)))
