"""The verify-adapter step's queue trigger (shared/runs/steps.py: its message, handler and states)."""

import azure.functions as func

from shared.runs.steps import Step
from shared.services.step_runner import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.verify_adapter.value, connection="AzureWebJobsStorage")
def verify_adapter(msg: func.QueueMessage) -> None:
    run_step(Step.verify_adapter, msg.get_body())
