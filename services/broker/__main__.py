"""``python -m services.broker``: run a broker (see :mod:`services.broker.server`)."""

import sys

from services.broker.server import main

sys.exit(main())
