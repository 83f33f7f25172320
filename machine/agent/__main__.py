"""`python -m machine.agent` runs the agent."""

from machine.agent.main import main

raise SystemExit(main())
