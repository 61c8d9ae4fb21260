"""The ``tensorarena`` command line."""
