"""What the hooks keep while sglang runs, apart from any hook: the one state object and the ids
(``state``), the ``request`` rows (``requests``) and the per-step ``step``/``stats`` rows with the
step in progress (``sampler``). Imports neither sglang nor ``tracer.sglang.hooks``."""
