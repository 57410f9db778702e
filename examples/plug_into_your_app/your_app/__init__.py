"""An existing Flower app that trains two models at once with mmfl-flwr."""
