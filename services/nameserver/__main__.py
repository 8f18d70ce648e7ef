"""``python -m services.nameserver``: run the nameserver (options: see server.py)."""

import sys

from services.nameserver.server import main

sys.exit(main())
