"""Fused linear cross entropy: API and custom ops (``api``), options (``options``, ``run``), planner and cost model
(``planner``, ``cost``), token loop (``tokens``), vocabulary loop (``vocab``, ``vocab_rows``, ``vocab_geometry``,
``triton_vocab``) and the exact target logit (``target``)."""
