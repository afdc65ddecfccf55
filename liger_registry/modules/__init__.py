"""Thin module forwards and function drop-ins that route Hugging Face modules to the kernels."""
