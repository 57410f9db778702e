"""A Flower quickstart-style app (train/test functions) trained by mmfl-flwr."""
