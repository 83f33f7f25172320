"""One blueprint module per step or HTTP resource. Handlers parse input, call one
service in shared/, and reply; no cloud SDK is imported here."""
