"""The server side of the ``rocketq`` command: ``nameserver``, ``broker``, ``timer-wheel``,
``dev up|down`` and ``store``. :mod:`services.cli.main` adds them to the client commands of
:mod:`rocketq.cli.main` (the library never imports the servers; the servers may import it)."""
