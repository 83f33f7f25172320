import azure.functions as func

from shared import http
from shared.models import OrgSecretSet, OrgSecretsView
from shared.services.api import org_secrets

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="org/secrets", methods=["GET"], auth_level=ANON)
@http.api(summary="Which organization secrets are set (owners; values are never returned)", response=OrgSecretsView)
def list_org_secrets(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: org_secrets.show(http.principal(req)))


@bp.route(route="org/secrets/huggingface-token", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save the Hugging Face token (owners; write-only, sealed at rest, handed only to the trainer)",
          request=OrgSecretSet, response=OrgSecretsView)
def put_hf_token(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: org_secrets.set_hf_token(http.principal(req), http.parse(req, OrgSecretSet)))


@bp.route(route="org/secrets/huggingface-token", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete the Hugging Face token (owners)", status=204)
def delete_hf_token(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: org_secrets.delete_hf_token(http.principal(req)))
