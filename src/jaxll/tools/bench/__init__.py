"""The benchmark: ``python -m jaxll.tools.bench`` (``cli.py`` says what it
measures and how)."""
