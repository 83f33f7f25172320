"""The run resource of the API (what functions/runs.py calls), split by what a caller does: checks
(create/edit checks), drafts, view, logs, actions (launch, cancel, recover, stop), adapter."""
