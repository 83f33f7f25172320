import azure.functions as func

from shared import http

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="openapi.json", methods=["GET"], auth_level=ANON)
@http.api(summary="This API's OpenAPI document")
def openapi(req: func.HttpRequest) -> func.HttpResponse:
    from function_app import app
    from shared.openapi import build

    return http.respond(lambda: build(app))


@bp.route(route="docs", methods=["GET"], auth_level=ANON)
@http.api(summary="API documentation page (served locally, no CDN)")
def docs(req: func.HttpRequest) -> func.HttpResponse:
    from shared.openapi import DOCS_PAGE

    return func.HttpResponse(DOCS_PAGE, mimetype="text/html")
