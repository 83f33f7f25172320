"""The release step's queue trigger. Handler: shared/services/steps/release.py; its message and the
run states it serves: the step table (shared/steps.py)."""

import azure.functions as func

from shared.services.steps import release as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.release.value, connection="AzureWebJobsStorage")
def release(msg: func.QueueMessage) -> None:
    run_step(Step.release, msg.get_body(), step.release)
