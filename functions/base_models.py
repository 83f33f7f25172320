import azure.functions as func

from shared import http
from shared.services.api import base_models

bp = func.Blueprint()


@bp.route(route="base-models", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
@http.api(summary="Declared base models: shapes, parameters, GPU memory of a LoRA run (bf16 and 4-bit)")
def list_base_models(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: (http.principal(ctx, req), base_models.list_view(ctx))[1])
