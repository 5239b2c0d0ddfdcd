"""The data and notebooks shipped with kvtrace (package data).

``data`` and ``notebooks`` here are symbolic links to the checkout's ``data/`` and
``notebooks/``; a wheel (``pip install .``) copies the files they point to, so an installed
kvtrace carries the bundled traces, workloads, incidents and notebooks too. Resolve them with
:mod:`replay.paths`, never with a path relative to the working directory.
"""
