"""TileLang's public examples, ported with their imports renamed (tests/test_tilelang_corpus.py runs them)."""
