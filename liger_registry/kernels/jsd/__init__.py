"""Fused linear generalised Jensen-Shannon divergence: API and custom op (``api``), the token loop (``loop``) and
the Triton row kernel (``triton_rows``)."""
