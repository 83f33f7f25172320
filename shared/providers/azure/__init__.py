"""Azure compute provider, one module per role: config (what a user saves, no SDK), client (the one
door to the SDK), errors, catalog, pricing, checks, compute (lifecycle)."""
