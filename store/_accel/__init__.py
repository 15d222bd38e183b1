"""The store's optional C accelerators, built by setup.py where a C
compiler is (``_textscan``: one pass over log text); :mod:`store._scan`
falls back to the bytes methods without them. A package of its own so that
importing an accelerator imports nothing of the store."""
