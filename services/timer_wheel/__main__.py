"""``python -m services.timer_wheel``: run the timer-wheel service (options: see server.py)."""

import sys

from services.timer_wheel.server import main

sys.exit(main())
