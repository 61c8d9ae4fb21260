"""Benchmarks behind ``tensorarena bench``: each module has ``configure(parser)`` and ``run(args)``.

These print numbers; they are not tests. The scripts in the repository's ``bench/`` call them.
"""
