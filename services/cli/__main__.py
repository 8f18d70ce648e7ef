"""``python -m services.cli``: the full ``rocketq`` command (see services.cli.main)."""

from services.cli.main import main

main()
