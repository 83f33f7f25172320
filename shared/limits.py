"""The sizes of request bodies the API takes: enforced by shared.http before a body is read, and
named by services in their messages (a dataset too large for the API goes to storage directly)."""

# No API body nests deeper than a few levels; deeper JSON is refused before it can reach
# recursive code (pydantic, to_json, the store) and raise RecursionError (a 500 instead of a 422).
MAX_JSON_DEPTH = 64
# Bodies are held whole by the Functions host and the worker: every limit stays under the host's
# request limit (100 MB by default), and is checked from Content-Length before the body is read.
MAX_JSON_BYTES = 1024 * 1024
MAX_UPLOAD_BYTES = 90 * 1024 * 1024  # datasets and adapter recovery uploads through the API
