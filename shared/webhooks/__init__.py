"""Signed webhooks (Standard Webhooks): endpoints and their delivery log (store.py), the run outbox that
derives deliveries from state changes and typed events (outbox.py), the signed POST behind the endpoint
guard (send.py). The HTTP resource is shared/services/api/webhooks.py; the delivery step
shared/services/steps/deliver_webhook.py."""
