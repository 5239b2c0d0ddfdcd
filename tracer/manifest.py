"""Compatibility alias: the manifest format lives in ``tracer.schema.manifest``."""

from tracer.schema.manifest import *  # noqa: F401,F403
from tracer.schema.manifest import claim_rank, create_or_join, new_manifest, read_manifest, update_manifest, update_rank_info, write_manifest  # noqa: F401
