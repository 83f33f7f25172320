"""`python -m shared.agent` runs the agent."""

from shared.agent.main import main

raise SystemExit(main())
