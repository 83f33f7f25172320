"""The launch step's queue trigger. Handler: shared/services/steps/launch.py; its message and the
run states it serves: the step table (shared/steps.py)."""

import azure.functions as func

from shared.services.steps import launch as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.launch.value, connection="AzureWebJobsStorage")
def launch(msg: func.QueueMessage) -> None:
    run_step(Step.launch, msg.get_body(), step.launch)
