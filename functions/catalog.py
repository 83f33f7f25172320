import azure.functions as func

from shared import http
from shared.services.api import catalog

bp = func.Blueprint()


@bp.route(route="catalog/gpus", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
@http.api(summary="GPU offers with compute, disk and total price per hour; with base_model, whether each fits")
def gpus(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: catalog.offers_view(ctx, http.principal(ctx, req), req.params.get("provider"),
                                                    req.params.get("base_model") or None,
                                                    req.params.get("connection") or None))
