"""kvtrace offline side: trace reader, memory models, replay, analysis queries and the CLI.

Imports from ``tracer`` only its schema module (``tracer.schema``); never imported by ``tracer``.
"""
