"""The validate-connection step's queue trigger. Handler: shared/services/steps/validate_connection.py; its message and the
run states it serves: the step table (shared/steps.py)."""

import azure.functions as func

from shared.services.steps import validate_connection as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.validate_connection.value, connection="AzureWebJobsStorage")
def validate_connection(msg: func.QueueMessage) -> None:
    run_step(Step.validate_connection, msg.get_body(), step.validate_connection)
