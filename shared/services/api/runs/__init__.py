"""The run resource of the API (what functions/runs.py calls), split by what a caller does: drafts (create,
edit and estimate, each admitted by shared/runs/admission.py), view, logs, actions (launch, cancel, recover,
stop), adapter, checkpoints."""
