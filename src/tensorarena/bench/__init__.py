"""Benchmarks behind ``tensorarena bench``: each module has ``configure(parser)`` and ``run(args)``.

These print numbers; they are not tests. The repository's ``bench/`` keeps the numbers
(``bench/RESULTS.md``) and the scripts that cannot live in the wheel (``bench/README.md`` says why).
"""
