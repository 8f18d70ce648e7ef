"""Server-side plumbing shared by every RocketQ service: clock, failpoints, config, logging."""
