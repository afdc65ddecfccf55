"""Cross entropy over logits rows: the op and API (``op``), the PyTorch (``torch_rows``) and Triton
(``triton_rows``, ``triton_row_stats``) row kernels, and the label check (``labels``)."""
