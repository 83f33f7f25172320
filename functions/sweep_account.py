"""The sweep-account step's queue trigger: the sweeper timer's fan-out, one compute connection
per message. Handler: shared/services/steps/sweep_account.py; its message: the step table
(shared/steps.py)."""

import azure.functions as func

from shared.services.steps import sweep_account as step
from shared.services.steps.runner import run_step
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.sweep_account.value, connection="AzureWebJobsStorage")
def sweep_account(msg: func.QueueMessage) -> None:
    run_step(Step.sweep_account, msg.get_body(), step.sweep_account)
