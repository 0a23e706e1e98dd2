"""Schedule templates, one module each; ``base`` discovers and registers them."""
