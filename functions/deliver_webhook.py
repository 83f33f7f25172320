"""The deliver-webhook step's queue trigger. Handler: shared/services/steps/deliver_webhook.py; its message:
the step table (shared/steps.py)."""

import azure.functions as func

from shared.services.steps import deliver_webhook as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.deliver_webhook.value, connection="AzureWebJobsStorage")
def deliver_webhook(msg: func.QueueMessage) -> None:
    run_step(Step.deliver_webhook, msg.get_body(), step.deliver_webhook)
