"""The Flower App of this repository (``flwr run .``): ServerApp and ClientApp on
the embedded default tasks."""
