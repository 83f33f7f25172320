"""The verify-adapter step's queue trigger. Handler: shared/services/steps/verify_adapter.py; its message and the
run states it serves: the step table (shared/steps.py)."""

import azure.functions as func

from shared.services.steps import verify_adapter as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.verify_adapter.value, connection="AzureWebJobsStorage")
def verify_adapter(msg: func.QueueMessage) -> None:
    run_step(Step.verify_adapter, msg.get_body(), step.verify_adapter)
