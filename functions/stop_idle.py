"""The stop-idle step's queue trigger: heartbeat-check's, for a retained run's machine started for
recovery and left idle. Handler: shared/services/steps/stop_idle.py; its message: the step table
(shared/steps.py)."""

import azure.functions as func

from shared.services.steps import stop_idle as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.stop_idle.value, connection="AzureWebJobsStorage")
def stop_idle(msg: func.QueueMessage) -> None:
    run_step(Step.stop_idle, msg.get_body(), step.stop_idle)
