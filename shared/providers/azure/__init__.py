"""Azure compute provider: config (no SDK import), SKU table, retail prices, and the adapter (lazy SDK imports)."""
