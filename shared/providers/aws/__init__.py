"""AWS EC2 compute provider. `config` imports no SDK; `compute` loads boto3 lazily."""
