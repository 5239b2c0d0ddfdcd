"""Switching the hooks on in a server process without code changes: the ``KVTRACE_DIR`` autoload
(``autoload``, armed by ``autoload_boot.py``), the files that arm it (``launch``: the ``.pth``
line and ``kvtrace launch``'s ``sitecustomize`` shim), the server description for the manifest
(``serverinfo``) and the parent-death watch that closes a killed scheduler's trace
(``parent_watch``)."""
