"""The launch step's queue trigger (shared/runs/steps.py: its message, handler and states)."""

import azure.functions as func

from shared.runs.steps import Step
from shared.services.step_runner import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.launch.value, connection="AzureWebJobsStorage")
def launch(msg: func.QueueMessage) -> None:
    run_step(Step.launch, msg.get_body())
