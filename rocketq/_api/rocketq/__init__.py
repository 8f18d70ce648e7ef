"""Generated package; see rocketq/_api/__init__.py. DO NOT EDIT."""
