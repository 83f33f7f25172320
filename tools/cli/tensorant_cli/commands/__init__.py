"""The `tensorant` commands, one module per top-level command: each has `add_parser(subparsers)`,
which adds the command's parser (and its actions) and points them at the functions beside it."""
