"""What the HTTP routes in functions/ call: one module per API resource (runs/ is a package split by
what a caller does). Each takes the caller (a Principal) and answers a model or raises an AppError."""
