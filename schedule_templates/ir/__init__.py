"""A small loop-nest IR that people can read and the code generators can lower."""
