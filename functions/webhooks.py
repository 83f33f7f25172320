import azure.functions as func

from shared import http
from shared.services.api import webhooks
from shared.webhooks.models import WebhookCreate, WebhookPatch, WebhookSecret, WebhookView

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="org/webhooks", methods=["POST"], auth_level=ANON)
@http.api(summary="Register a webhook endpoint (owners; at most 10); its signing secret is returned once",
          request=WebhookCreate, response=WebhookSecret, status=201)
def create_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.create(ctx, http.principal(ctx, req), http.json_body(req)), status=201)


@bp.route(route="org/webhooks", methods=["GET"], auth_level=ANON)
@http.api(summary="The organization's webhook endpoints (secrets are never returned)")
def list_webhooks(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.list_all(ctx, http.principal(ctx, req)))


@bp.route(route="org/webhooks/{id}", methods=["GET"], auth_level=ANON)
@http.api(summary="One webhook endpoint", response=WebhookView)
def get_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.show(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="org/webhooks/{id}", methods=["PATCH"], auth_level=ANON)
@http.api(summary="Change a webhook endpoint (owners): url, types, enabled, description",
          request=WebhookPatch, response=WebhookView)
def patch_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.patch(ctx, http.principal(ctx, req), req.route_params["id"], http.json_body(req)))


@bp.route(route="org/webhooks/{id}", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete a webhook endpoint (owners)", status=204)
def delete_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.delete(ctx, http.principal(ctx, req), req.route_params["id"]), status=204)


@bp.route(route="org/webhooks/{id}/rotate", methods=["POST"], auth_level=ANON)
@http.api(summary="Rotate the signing secret (owners); the new one is returned once, the old one signs 24 h more",
          response=WebhookSecret)
def rotate_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.rotate(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="org/webhooks/{id}/test", methods=["POST"], auth_level=ANON)
@http.api(summary="Send a webhook.test event to the endpoint (owners)", status=202)
def test_webhook(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.test(ctx, http.principal(ctx, req), req.route_params["id"]), status=202)


@bp.route(route="org/webhooks/{id}/deliveries", methods=["GET"], auth_level=ANON)
@http.api(summary="The endpoint's last 100 delivery attempts (event id, type, status or error, duration)")
def webhook_deliveries(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: webhooks.deliveries(ctx, http.principal(ctx, req), req.route_params["id"]))
