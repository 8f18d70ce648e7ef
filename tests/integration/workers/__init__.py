"""Consumer processes that system tests and benchmarks start, kill and restart
(``python -m tests.integration.workers.<name>``)."""
